{{/* Names, labels and the peer list shared by the templates. */}}

{{- define "raftq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The StatefulSet's name; pods are <fullname>-0 ... Kept short enough for "<fullname>-NN" to stay a DNS label. */}}
{{- define "raftq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The headless Service that gives each pod its DNS name (<pod>.<headless>.<namespace>.svc.<domain>). */}}
{{- define "raftq.headless" -}}
{{- printf "%s-peers" (include "raftq.fullname" .) }}
{{- end }}

{{- define "raftq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "raftq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raftq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "raftq.labels" -}}
helm.sh/chart: {{ include "raftq.chart" . }}
{{ include "raftq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: server
{{- end }}

{{- define "raftq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "raftq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "raftq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The domain under which the pods' names resolve. */}}
{{- define "raftq.peerDomain" -}}
{{- printf "%s.%s.svc.%s" (include "raftq.headless" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* RAFTQ_PEERS: "1=<pod-0>:<raft>,<pod-0>:<grpc>;2=..." ; node id = ordinal + 1, as raftq-entrypoint sets it. */}}
{{- define "raftq.peers" -}}
{{- $full := include "raftq.fullname" . }}
{{- $domain := include "raftq.peerDomain" . }}
{{- $peers := list }}
{{- range $i := until (int .Values.replicaCount) }}
{{- $host := printf "%s-%d.%s" $full $i $domain }}
{{- $peers = append $peers (printf "%d=%s:%d,%s:%d" (add1 $i) $host (int $.Values.ports.raft) $host (int $.Values.ports.grpc)) }}
{{- end }}
{{- join ";" $peers }}
{{- end }}

{{- define "raftq.probeScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* The Secret mounted at /etc/raftq/auth: the user's, or the one the chart creates (secret.yaml). */}}
{{- define "raftq.authSecretName" -}}
{{- default (printf "%s-auth" (include "raftq.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

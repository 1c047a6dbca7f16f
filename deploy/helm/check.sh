#!/usr/bin/env bash
# Helm's own lint and template rendering, offline, plus strict Kubernetes schema validation of what renders:
#
#   deploy/helm/check.sh                    lint + render the chart with several value sets + validate (exit 1 on
#                                           any problem); what deploy/ci.sh runs
#   deploy/helm/check.sh template [NAME] [--namespace NS] [--set k=v]...
#                                           print the manifests, like `helm template NAME deploy/helm/raftq -n NS`:
#                                           release NAME (default raftq) in namespace NS (default $HELM_NAMESPACE,
#                                           else `default`); the peers' DNS names hold both
#   deploy/helm/check.sh pods-in-docker IMAGE       run the rendered StatefulSet's pods as Docker containers
#                                                   (pod DNS names as network aliases) and check they form a cluster
#
# No helm binary is needed: the first run installs two PyPI packages into a venv (target/helm-venv, or
# $RAFTQ_HELM_VENV): helm-python-sdk (Helm's Go SDK behind a C ABI; its lint and its template engine) and
# kubernetes-validate (Kubernetes' OpenAPI schemas). With a helm binary, `helm lint deploy/helm/raftq` and
# `helm template raftq deploy/helm/raftq` do the same lint and rendering.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${RAFTQ_HELM_VENV:-${CARGO_TARGET_DIR:-target}/helm-venv}
# Pinned: the lint messages and the rendering are Helm 4.2.3's.
pkgs=(helm-python-sdk==0.2.2 kubernetes-validate==1.37.0)
if ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  echo "[helm/check.sh] installing ${pkgs[*]} into $venv" >&2
  # 75 (EX_TEMPFAIL): the tools could not be had, which deploy/ci.sh reports as a skip, not as a broken chart.
  python3 -m venv "$venv" || exit 75
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}" || exit 75
fi
if [ "${1:-}" = pods-in-docker ]; then
  shift
  exec "$venv/bin/python" deploy/helm/pods-in-docker.py "$@"
fi
exec "$venv/bin/python" deploy/helm/check.py "${@:-lint}"

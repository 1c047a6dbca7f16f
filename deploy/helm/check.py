"""Lint and render the raftq chart with Helm's own Go library, offline, and validate what it renders.

Run through deploy/helm/check.sh, which installs the two PyPI packages this needs into a venv:
- helm-python-sdk: ctypes bindings to libhelm_c, a C ABI over Helm's Go SDK (v4): `lint` is Helm's linter (what
  `helm lint` runs) and `Chart.render` is Helm's template engine (what `helm template` runs), no cluster needed.
- kubernetes-validate: the Kubernetes OpenAPI schemas, checked strictly (an unknown field is an error).

    check.py lint                      lint + render every value set below + validate; exit 1 on any problem
    check.py template [NAME] [--namespace NS] [--set k=v]...
                                       print the rendered manifests, like `helm template NAME deploy/helm/raftq
                                       --namespace NS`: release NAME (default raftq) in namespace NS (default
                                       $HELM_NAMESPACE, else `default`, as helm), which the peers' DNS names hold
"""

import base64
import json
import os
import sys

import helm_python as helm
import kubernetes_validate
import yaml

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raftq")
KUBE_VERSION = "1.30.0"
RELEASE = "raftq"
# The namespace the lint renders into; `template` takes the release's (see template_args).
NAMESPACE = "queue"
SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}

# Value sets rendered and validated. "defaults" has authentication on with the Secret the chart makes; "everything"
# turns on every optional part (TLS included: the Secret mounted, RAFTQ_TLS_* set, the probes on HTTPS).
VALUE_SETS = {
    "defaults": {},
    "everything": {
        "replicaCount": 5,
        "fullnameOverride": "tasks",
        "config": {"shards": 8, "lease_default_ms": 10000},
        "auth": {"existingSecret": "raftq-auth", "hs256SecretKey": "issuer.hs256", "clusterSecretKey": "raft"},
        "tls": {"enabled": True, "secretName": "raftq-tls"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "networkPolicy": {"enabled": True},
        "podAntiAffinity": "hard",
        "persistence": {"storageClassName": "fast", "size": "50Gi"},
        "podAnnotations": {"example.com/team": "queues"},
        "extraEnv": [{"name": "RAFTQ_SHARDS", "value": "8"}],
    },
    "existing secret, public keys only": {"auth": {"existingSecret": "raftq-keys", "hs256SecretKey": ""}},
    "auth off (insecure)": {"auth": {"enabled": False}},
}
# Value sets that must fail to render, with the message they must fail with.
MUST_FAIL = {
    "chart's secret with a key not named <kid>.hs256": ({"auth": {"hs256SecretKey": "chart"}},
                                                         "auth.hs256SecretKey must be named <kid>.hs256"),
    "chart's secret without an HS256 key": ({"auth": {"hs256SecretKey": ""}},
                                             "auth.hs256SecretKey must be named <kid>.hs256"),
    "auth without a cluster secret key": ({"auth": {"clusterSecretKey": ""}}, "auth.enabled needs auth.clusterSecretKey"),
    "one key for both secrets": ({"auth": {"clusterSecretKey": "chart.hs256"}},
                                 "auth.clusterSecretKey and auth.hs256SecretKey must differ"),
    "tls without a secret": ({"tls": {"enabled": True}}, "tls.enabled needs tls.secretName"),
}


def render(values, name=RELEASE, namespace=NAMESPACE):
    chart = helm.Chart.load(CHART)
    out = chart.render(values or None, name=name, namespace=namespace, is_install=True)
    return {path: text for path, text in sorted(out.items()) if text.strip() and not path.endswith("NOTES.txt")}


def documents(rendered):
    for path, text in rendered.items():
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def invariants(docs, values):
    """What the chart promises (issue 7), checked on the rendered objects."""
    problems = []
    by_kind = {}
    for _, d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    replicas = values.get("replicaCount", 3)
    sts = by_kind["StatefulSet"][0]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}

    def want(ok, what):
        if not ok:
            problems.append(what)

    want(spec["replicas"] == replicas, f"replicas != {replicas}")
    want(spec["podManagementPolicy"] == "Parallel", "podManagementPolicy must be Parallel")
    want(len(env["RAFTQ_PEERS"].split(";")) == replicas, "RAFTQ_PEERS must list every replica")
    want([p.split("=")[0] for p in env["RAFTQ_PEERS"].split(";")] == [str(i + 1) for i in range(replicas)],
         "peer ids must be ordinal + 1")
    want(c["command"][0] == "/usr/local/bin/raftq-entrypoint", "node id must come from the pod ordinal")
    want(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness probe on /readyz")
    want(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness probe on /healthz")
    want(pod["securityContext"]["runAsNonRoot"] is True, "pods run as non-root")
    want(c["securityContext"]["readOnlyRootFilesystem"] is True, "read-only root filesystem")
    want(spec["volumeClaimTemplates"][0]["metadata"]["name"] == "data", "a PVC per pod for /data")
    want(any(m["mountPath"] == "/data" for m in c["volumeMounts"]), "/data mounted")
    headless = [s for s in by_kind["Service"] if s["spec"].get("clusterIP") == "None"]
    want(len(headless) == 1 and headless[0]["spec"]["publishNotReadyAddresses"] is True,
         "a headless Service publishing not-ready addresses")
    want(headless and spec["serviceName"] == headless[0]["metadata"]["name"], "serviceName is the headless Service")
    clients = [s for s in by_kind["Service"] if s["spec"].get("clusterIP") != "None"]
    want(len(clients) == 1 and {p["name"] for p in clients[0]["spec"]["ports"]} == {"grpc", "http"},
         "a client Service with gRPC and HTTP, without the Raft port")
    pdb = by_kind.get("PodDisruptionBudget", [])
    want(len(pdb) == 1 and pdb[0]["spec"]["maxUnavailable"] == 1, "a PodDisruptionBudget with maxUnavailable 1")
    problems += auth_invariants(by_kind, pod, c, env, values.get("auth", {}))
    return problems


def auth_invariants(by_kind, pod, c, env, auth):
    """Secure by default: auth on unless turned off, and then RAFTQ_AUTH=none said out loud."""
    problems = []

    def want(ok, what):
        if not ok:
            problems.append(what)

    enabled = auth.get("enabled", True)
    existing = auth.get("existingSecret", "")
    hs256_key = auth.get("hs256SecretKey", "chart.hs256")
    cluster_key = auth.get("clusterSecretKey", "cluster-secret")
    secrets = [s for s in by_kind.get("Secret", []) if s["metadata"]["name"].endswith("-auth")]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    if not enabled:
        want(env.get("RAFTQ_AUTH") == "none", "auth.enabled=false must set RAFTQ_AUTH=none explicitly")
        want(not secrets and "auth" not in volumes, "auth.enabled=false: no auth Secret, nothing mounted")
        return problems
    want(env.get("RAFTQ_AUTH") == "jwt", "auth on: RAFTQ_AUTH=jwt")
    want(env.get("RAFTQ_AUTH_KEYS_DIR") == "/etc/raftq/auth", "auth on: RAFTQ_AUTH_KEYS_DIR=/etc/raftq/auth")
    want(env.get("RAFTQ_CLUSTER_SECRET_FILE") == f"/etc/raftq/auth/{cluster_key}",
         "auth on: RAFTQ_CLUSTER_SECRET_FILE in the keys directory")
    want(env.get("RAFTQ_AUTH_HS256_SECRET_FILE") == (f"/etc/raftq/auth/{hs256_key}" if hs256_key else None),
         "RAFTQ_AUTH_HS256_SECRET_FILE (the in-pod CLI's token source) iff auth.hs256SecretKey")
    want(mounts.get("/etc/raftq/auth", {}).get("readOnly") is True, "the auth Secret mounted read-only")
    name = volumes.get("auth", {}).get("secret", {}).get("secretName")
    if existing:
        want(name == existing, "the existing auth Secret is mounted")
        want(not secrets, "with auth.existingSecret the chart makes no Secret")
    else:
        want(len(secrets) == 1 and name == secrets[0]["metadata"]["name"], "the chart's auth Secret is mounted")
        data = secrets[0].get("data", {}) if secrets else {}
        want(set(data) == {hs256_key, cluster_key}, f"the chart's Secret holds {hs256_key} and {cluster_key}")
        for k, v in data.items():
            want(len(base64.b64decode(v)) >= 32, f"the chart's secret {k} has at least 32 bytes")
    return problems


def peer_hosts(rendered):
    """The host of every peer address in the StatefulSet's RAFTQ_PEERS ("1=host:7000,host:9091;2=...")."""
    sts = next(d for _, d in documents(rendered) if d["kind"] == "StatefulSet")
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    return [addr.rsplit(":", 1)[0] for peer in env["RAFTQ_PEERS"].split(";") for addr in peer.split("=", 1)[1].split(",")]


def namespace_problems():
    """Peers find each other by DNS names that hold the release's namespace, whatever it is, and `template` takes
    the release name and namespace as `helm template` does."""
    problems = []
    for name, full, namespace in [("raftq", "raftq", "default"), ("jobs", "jobs-raftq", "prod")]:
        want = [f"{full}-{i}.{full}-peers.{namespace}.svc.cluster.local" for i in range(3) for _ in (0, 1)]
        got = peer_hosts(render({}, name=name, namespace=namespace))
        if got != want:
            problems.append(f"release {name} in namespace {namespace}: peers {got}, want {want}")
    cases = [
        ([], {}, ("raftq", "default", {})),
        (["jobs", "--namespace", "prod"], {}, ("jobs", "prod", {})),
        (["-n", "prod", "--set", "replicaCount=5"], {"HELM_NAMESPACE": "ignored"}, ("raftq", "prod", {"replicaCount": 5})),
        (["--namespace=stage"], {}, ("raftq", "stage", {})),
        ([], {"HELM_NAMESPACE": "team-a"}, ("raftq", "team-a", {})),
    ]
    for args, env, want in cases:
        got = template_args(list(args), env)
        if got != want:
            problems.append(f"template {args} with {env}: {got}, want {want}")
    return problems


def validate(docs):
    """Strict schema validation against Kubernetes KUBE_VERSION; CRDs (ServiceMonitor) have no schema there."""
    problems, notes = [], []
    for path, d in docs:
        what = f"{path}: {d['kind']}/{d['metadata']['name']}"
        try:
            kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            notes.append(f"{what}: no schema in Kubernetes {KUBE_VERSION} ({d['apiVersion']} is a CRD); not validated")
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{what}: {'.'.join(str(p) for p in e.path)}: {e.message}")
    return problems, notes


def lint_cmd():
    failed = False
    print(f"Helm SDK {helm.helm_sdk_version()} (helm-python-sdk, libhelm_c {helm.helm_c_version()}), "
          f"kubernetes-validate {kubernetes_validate.__version__} schemas for Kubernetes {KUBE_VERSION}")
    for name, values in VALUE_SETS.items():
        print(f"\n== helm lint --strict --kube-version {KUBE_VERSION} deploy/helm/raftq  (values: {name})")
        report = helm.lint(CHART, values or None, strict=True, kube_version="v" + KUBE_VERSION)
        for m in report["messages"]:
            print(f"[{SEVERITY.get(m['severity'], m['severity'])}] {m['path']}: {m['error']}")
        for e in report["errors"]:
            print(f"[ERROR] {e}")
        # --strict: a warning fails the chart, as with `helm lint --strict`.
        errors = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        print(f"{report['total_charts_linted']} chart(s) linted, {1 if errors else 0} chart(s) failed")
        failed |= bool(errors)

        print(f"== helm template {RELEASE} deploy/helm/raftq --namespace {NAMESPACE}  (values: {name})")
        try:
            rendered = render(values)
        except helm.HelmError as e:
            print(f"PROBLEM: rendering failed: {e}")
            failed = True
            continue
        docs = list(documents(rendered))
        kinds = ", ".join(f"{d['kind']}/{d['metadata']['name']}" for _, d in docs)
        print(f"rendered {len(docs)} objects: {kinds}")
        problems, notes = validate(docs)
        for n in notes:
            print(f"note: {n}")
        problems += invariants(docs, values)
        for p in problems:
            print(f"PROBLEM: {p}")
        print(f"schema and invariants: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        failed |= bool(problems)

    print(f"\n== peer DNS names follow the release's name and namespace (helm template NAME --namespace NS)")
    problems = namespace_problems()
    for p in problems:
        print(f"PROBLEM: {p}")
    print("namespaces:", "ok" if not problems else f"{len(problems)} problem(s)")
    failed |= bool(problems)

    print()
    for name, (values, message) in MUST_FAIL.items():
        try:
            render(values)
            print(f"PROBLEM: {name}: rendered, but must fail with {message!r}")
            failed = True
        except helm.HelmError as e:
            ok = message in str(e)
            print(f"{'ok' if ok else 'PROBLEM'}: {name}: refused: {str(e).strip().splitlines()[-1]}")
            failed |= not ok
    print("\nhelm chart check:", "FAILED" if failed else "passed")
    return 1 if failed else 0


def template_args(args, env):
    """(release name, namespace, values) from `[NAME] [--namespace NS | -n NS] [--set k=v]...`, with helm's
    default namespace: $HELM_NAMESPACE, else `default`. ValueError on anything else."""
    name, namespace, values = RELEASE, env.get("HELM_NAMESPACE") or "default", {}
    while args:
        flag = args.pop(0)
        if flag in ("--namespace", "-n") and args:
            namespace = args.pop(0)
        elif flag.startswith("--namespace="):
            namespace = flag.split("=", 1)[1]
        elif flag == "--set" and args:
            merge(values, helm.parse_set_string(args.pop(0)))
        elif not flag.startswith("-") and name == RELEASE and not values:
            name = flag
        else:
            raise ValueError(f"unknown argument {flag!r} (NAME, --namespace NS, --set k=v)")
    return name, namespace, values


def template_cmd(args):
    try:
        name, namespace, values = template_args(args, os.environ)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    for path, text in render(values, name=name, namespace=namespace).items():
        print(f"---\n# Source: {path}\n{text.strip()}")
    return 0


def merge(into, more):
    for k, v in more.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v


if __name__ == "__main__":
    cmd, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("lint", [])
    if cmd == "lint":
        sys.exit(lint_cmd())
    if cmd == "template":
        sys.exit(template_cmd(rest))
    print(json.dumps({"usage": "check.py lint | template [--set k=v]..."}), file=sys.stderr)
    sys.exit(2)

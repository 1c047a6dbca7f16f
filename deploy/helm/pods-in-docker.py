"""Run the chart's StatefulSet pods as plain Docker containers, as close to the rendered pod spec as Docker goes.

There is no Kubernetes here, so this checks what can be checked without one: the pod template Helm renders
(command through raftq-entrypoint, node id from the pod name, RAFTQ_PEERS, advertised addresses with $(VAR)
expanded as the kubelet does, uid/gid, read-only root with /tmp writable, no capabilities, authentication on
with the keys of the Secret the chart makes, mounted as the kubelet would) forms a cluster in the image, with
every pod reached by its headless-Service DNS name (given to Docker as a network alias); the CLI in a pod mints
its own token, a token minted as NOTES.txt says works elsewhere, and a call without a token is refused.

    deploy/helm/check.sh pods-in-docker IMAGE      (what deploy/ci.sh runs)
"""

import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import helm_python as helm
import yaml

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raftq")
NAMESPACE = "queue"
READY_TIMEOUT_S = 90


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def mounts_for(pod, c, name, secrets, workdir):
    """Docker arguments for the container's volume mounts: the volume claim "data" as a named volume, emptyDir as
    tmpfs, a Secret as a read-only directory holding its keys as files (owned by root, group fsGroup, mode
    defaultMode: what the kubelet writes)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    fs_group = pod["securityContext"].get("fsGroup", 0)
    args = []
    for m in c["volumeMounts"]:
        v = volumes.get(m["name"])
        if v is None:
            assert m["name"] == "data", m
            args += ["-v", f"{name}-data:{m['mountPath']}"]
        elif "emptyDir" in v:
            args += ["--tmpfs", m["mountPath"]]
        elif "secret" in v:
            src = v["secret"]
            data = secrets[src["secretName"]]
            d = os.path.join(workdir, m["name"])
            if not os.path.isdir(d):
                os.makedirs(d)
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for it in items:
                    f = os.path.join(d, it["path"])
                    with open(f, "wb") as out:
                        out.write(data[it["key"]])
                    os.chown(f, 0, fs_group)
                    os.chmod(f, src.get("defaultMode", 0o644))
                os.chmod(d, 0o755)
            args += ["-v", f"{d}:{m['mountPath']}:ro" if m.get("readOnly") else f"{d}:{m['mountPath']}"]
        else:
            raise SystemExit(f"volume {m['name']}: kind not simulated here: {v}")
    return args


def main(image):
    uid = os.getpid()
    release = f"rqsim{uid}"
    repo, tag = image.rsplit(":", 1)
    # The chart's defaults (authentication on, with the Secret the chart makes), only the image changed.
    values = {"image": {"repository": repo, "tag": tag}}
    out = helm.Chart.load(CHART).render(values, name=release, namespace=NAMESPACE, is_install=True)
    docs = [d for path, text in out.items() if text.strip() and path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    headless = next(d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None")
    secrets = {d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d.get("data", {}).items()}
               for d in docs if d["kind"] == "Secret"}
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    sc, psc = c["securityContext"], pod["securityContext"]
    net = f"{release}-net"
    names = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]
    workdir = tempfile.mkdtemp(prefix=f"{release}-")
    sh("docker", "network", "create", net)
    try:
        for name in names:
            env = {}
            for e in c["env"]:
                if "valueFrom" in e:
                    assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e
                    env[e["name"]] = name
                else:
                    env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
            fqdn = f"{name}.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
            args = ["docker", "run", "-d", "--name", name, "--hostname", name, "--network", net,
                    "--network-alias", fqdn, "--user", f"{psc['runAsUser']}:{psc['runAsGroup']}",
                    "--security-opt", "no-new-privileges", "--entrypoint", c["command"][0]]
            args += mounts_for(pod, c, name, secrets, workdir)
            if sc.get("readOnlyRootFilesystem"):
                args.append("--read-only")
            for cap in sc.get("capabilities", {}).get("drop", []):
                args += ["--cap-drop", cap]
            for k, v in env.items():
                args += ["-e", f"{k}={v}"]
            sh(*args, c["image"], *c["command"][1:])
            print(f"pod {name}: started as {fqdn}")
        print(f"auth: RAFTQ_AUTH={env.get('RAFTQ_AUTH')}, keys from Secret(s) {', '.join(secrets) or 'none'} "
              f"mounted at /etc/raftq/auth")
        deadline = time.time() + READY_TIMEOUT_S
        for name in names:
            while sh("docker", "exec", name, "raftq-probe", "/readyz", check=False).returncode != 0:
                if time.time() > deadline:
                    print(sh("docker", "logs", "--tail", "20", name, check=False).stderr)
                    raise SystemExit(f"pod {name} not ready after {READY_TIMEOUT_S} s")
                time.sleep(0.5)
        first = sh("docker", "logs", names[-1]).stderr.splitlines()[0]
        print(f"all {len(names)} ready; {names[-1]} logged: {first}")
        # The CLI in a pod mints its own token (RAFTQ_AUTH_HS256_SECRET_FILE names the chart's key).
        print(sh("docker", "exec", names[0], "raftq", "cluster", "status").stdout.rstrip())
        target = f"{names[-1]}.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{c['ports'][0]['containerPort']}"
        tid = sh("docker", "exec", names[1], "raftq", "task", "enqueue", "--addr", target,
                 "--queue", "sim", "--payload", "x").stdout.strip()
        # A token minted as NOTES.txt says, used by a CLI that has no secret to mint one from.
        key = env["RAFTQ_AUTH_HS256_SECRET_FILE"]
        token = sh("docker", "exec", names[2], "raftq", "token", "issue", "--secret-file", key,
                   "--scopes", "read").stdout.strip()
        got = sh("docker", "exec", "-e", "RAFTQ_AUTH_HS256_SECRET_FILE=", "-e", f"RAFTQ_TOKEN={token}", names[0],
                 "raftq", "task", "get", tid, "--output", "json").stdout
        assert '"state":"PENDING"' in got, got
        print(f"task {tid} enqueued through {target} and read back from {names[0]} with a minted read token: PENDING")
        refused = sh("docker", "exec", "-e", "RAFTQ_AUTH_HS256_SECRET_FILE=", names[0], "raftq", "task", "get", tid,
                     check=False)
        if refused.returncode == 0:
            raise SystemExit(f"a call without a token was accepted: {refused.stdout}")
        why = (refused.stderr.strip().splitlines() or ["no message"])[-1][:160]
        print(f"without a token: refused ({why})")
        print("helm pods in docker: passed")
    finally:
        for name in names:
            sh("docker", "rm", "-f", name, check=False)
            sh("docker", "volume", "rm", f"{name}-data", check=False)
        sh("docker", "network", "rm", net, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: pods-in-docker.py IMAGE")
    main(sys.argv[1])

"""Run the chart's StatefulSet pods as plain Docker containers, as close to the rendered pod spec as Docker goes.

There is no Kubernetes here, so this checks what can be checked without one: the pod template Helm renders
(command through raftq-entrypoint, node id from the pod name, RAFTQ_PEERS, advertised addresses with $(VAR)
expanded as the kubelet does, uid/gid, read-only root with /tmp writable, no capabilities) forms a cluster in
the image, with every pod reached by its headless-Service DNS name (given to Docker as a network alias).

    deploy/helm/check.sh pods-in-docker IMAGE      (what deploy/ci.sh runs)
"""

import os
import re
import subprocess
import sys
import time

import helm_python as helm
import yaml

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raftq")
NAMESPACE = "queue"
READY_TIMEOUT_S = 90


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def main(image):
    uid = os.getpid()
    release = f"rqsim{uid}"
    repo, tag = image.rsplit(":", 1)
    values = {"image": {"repository": repo, "tag": tag}}
    out = helm.Chart.load(CHART).render(values, name=release, namespace=NAMESPACE, is_install=True)
    docs = [d for path, text in out.items() if text.strip() and path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    headless = next(d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None")
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    sc, psc = c["securityContext"], pod["securityContext"]
    net = f"{release}-net"
    names = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]
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
                    "--tmpfs", "/tmp", "--security-opt", "no-new-privileges", "-v", f"{name}-data:/data",
                    "--entrypoint", c["command"][0]]
            if sc.get("readOnlyRootFilesystem"):
                args.append("--read-only")
            for cap in sc.get("capabilities", {}).get("drop", []):
                args += ["--cap-drop", cap]
            for k, v in env.items():
                args += ["-e", f"{k}={v}"]
            sh(*args, c["image"], *c["command"][1:])
            print(f"pod {name}: started as {fqdn}")
        deadline = time.time() + READY_TIMEOUT_S
        for name in names:
            while sh("docker", "exec", name, "raftq-probe", "/readyz", check=False).returncode != 0:
                if time.time() > deadline:
                    print(sh("docker", "logs", "--tail", "20", name, check=False).stderr)
                    raise SystemExit(f"pod {name} not ready after {READY_TIMEOUT_S} s")
                time.sleep(0.5)
        first = sh("docker", "logs", names[-1]).stderr.splitlines()[0]
        print(f"all {len(names)} ready; {names[-1]} logged: {first}")
        print(sh("docker", "exec", names[0], "raftq", "cluster", "status").stdout.rstrip())
        target = f"{names[-1]}.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{c['ports'][0]['containerPort']}"
        tid = sh("docker", "exec", names[1], "raftq", "task", "enqueue", "--addr", target,
                 "--queue", "sim", "--payload", "x").stdout.strip()
        got = sh("docker", "exec", names[0], "raftq", "task", "get", tid, "--output", "json").stdout
        assert '"state":"PENDING"' in got, got
        print(f"task {tid} enqueued through {target} and read back from {names[0]}: PENDING")
        print("helm pods in docker: passed")
    finally:
        for name in names:
            sh("docker", "rm", "-f", name, check=False)
            sh("docker", "volume", "rm", f"{name}-data", check=False)
        sh("docker", "network", "rm", net, check=False)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: pods-in-docker.py IMAGE")
    main(sys.argv[1])

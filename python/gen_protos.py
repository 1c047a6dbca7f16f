#!/usr/bin/env python3
"""Generates the protocol modules ``src/raftq/v1/*_pb2.py`` (and ``.pyi`` stubs) from ``../proto``.

The generated modules are committed, so ``pip install ./python`` needs nothing but PyPI's grpcio and protobuf
(no protoc, no grpcio-tools, no ``../proto`` beside the package: an sdist or a wheel built elsewhere installs
the same way). ``tests/test_protos.py`` regenerates them and fails when they differ from the committed ones.

grpcio-tools is pinned to 1.62.3: its generated code carries no protobuf runtime-version check, so it imports
under every protobuf from 4.25 to 7.x, which keeps Python 3.9 supported (its newest protobuf is 6.x). Newer
grpcio-tools pin the runtime to at least their own protobuf version.

Usage: ``python gen_protos.py`` (with grpcio-tools==1.62.3 installed) rewrites src/raftq/v1;
``python gen_protos.py --check`` exits 1 when the committed files are stale.
"""

import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

GRPCIO_TOOLS = "1.62.3"
HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent / "proto"
# The public protocol; raft.proto is the servers' internal one.
PROTOS = ["raftq/v1/task.proto", "raftq/v1/stream.proto", "raftq/v1/jobs.proto", "raftq/v1/admin.proto"]
OUT = HERE / "src"


def generated_names() -> List[str]:
    names = []
    for p in PROTOS:
        stem = p[: -len(".proto")]
        names += [stem + "_pb2.py", stem + "_pb2.pyi"]
    return names


def generate(out_dir: Path, python: str = sys.executable) -> None:
    """Runs grpcio-tools' protoc with ``python`` into ``out_dir`` (which gets raftq/v1/...)."""
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('grpcio-tools'))"],
        capture_output=True,
        text=True,
    )
    if version.returncode != 0:
        raise RuntimeError(f"grpcio-tools is not installed for {python}: pip install grpcio-tools=={GRPCIO_TOOLS}")
    if version.stdout.strip() != GRPCIO_TOOLS:
        raise RuntimeError(f"grpcio-tools {version.stdout.strip()} found; the generated code needs {GRPCIO_TOOLS}")
    subprocess.run(
        [python, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"--python_out={out_dir}", f"--pyi_out={out_dir}"]
        + [str(PROTO_ROOT / p) for p in PROTOS],
        check=True,
    )


def stale(python: str = sys.executable) -> List[str]:
    """The committed files that differ from freshly generated ones."""
    with tempfile.TemporaryDirectory() as d:
        generate(Path(d), python)
        return [n for n in generated_names() if not (OUT / n).exists() or not filecmp.cmp(Path(d) / n, OUT / n, False)]


if __name__ == "__main__":
    if "--check" in sys.argv:
        bad = stale()
        if bad:
            print("stale generated protocol modules (run python/gen_protos.py):", *bad, sep="\n  ")
            sys.exit(1)
        print("generated protocol modules match the protos")
    else:
        generate(OUT)
        print("regenerated", *generated_names(), sep="\n  ")

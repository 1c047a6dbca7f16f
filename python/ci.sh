#!/usr/bin/env bash
# CI stage: the Python SDK (python/) installed from this checkout into a virtual environment under target/, and
# its pytest suite run against real `raftq serve` processes (target/debug/raftq, built here when missing).
# Skips itself, saying so, only when no Python 3.9+ with the venv module is on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "python/ci.sh: SKIPPED: no $py on this machine (install Python 3.9+ to run the Python SDK's tests)"
  exit 0
fi
if ! "$py" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null; then
  echo "python/ci.sh: SKIPPED: $py is older than 3.9 or lacks venv/ensurepip (Debian: apt-get install python3-venv)"
  exit 0
fi

venv=target/py-venv
gen=target/py-gen-venv
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
[ -x "$gen/bin/python" ] || "$py" -m venv "$gen"
# The package as a user installs it (a PEP 517 build of ./python), then the test tools.
"$venv/bin/pip" install -q --disable-pip-version-check ./python pytest pytest-timeout mypy types-grpcio types-protobuf
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./python
# The pinned generator the committed protocol modules are checked against (tests/test_protos.py).
"$gen/bin/pip" install -q --disable-pip-version-check grpcio-tools==1.62.3

if [ ! -x target/debug/raftq ] || [ -n "$(find src proto client Cargo.toml -newer target/debug/raftq -print -quit)" ]; then
  cargo build -p raftq --bin raftq
fi

echo "== mypy --strict (python/src/raftq)"
(cd python && "../$venv/bin/mypy")

export RAFTQ_BIN=$PWD/target/debug/raftq RAFTQ_PROTOC_PYTHON=$PWD/$gen/bin/python
"$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider --timeout 300

#!/usr/bin/env bash
# The console's first paint with N tasks stored (default 1,000,000): a release node without authentication is
# filled with `raftq bench --workload enqueue`, then bench/console_paint.py loads every page RUNS times in
# headless Chromium (Debian's chromium and chromium-driver; selenium from tests/browser's virtual environment).
#   bench/console.sh [TASKS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-1000000} runs=${2:-3}
bin=$PWD/target/release/raftq
[ -x "$bin" ] || cargo build --release --bin raftq
venv=target/browser-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check 'selenium>=4.20,<5' 'pillow>=10,<12'
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
addr=127.0.0.1:17411 http=127.0.0.1:17413
RAFTQ_LOG=warn "$bin" serve --data-dir "$work/data" --grpc-addr $addr --raft-addr 127.0.0.1:17412 \
  --http-addr $http --auth none >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do "$bin" cluster status --addr $addr >/dev/null 2>&1 && break; sleep 0.2; done
have=0
while [ "$have" -lt "$tasks" ]; do
  secs=$(( (tasks - have) / 100000 )); [ "$secs" -ge 1 ] || secs=1; [ "$secs" -le 5 ] || secs=5
  "$bin" bench --addr $addr --workload enqueue --batch 1000 --producers 4 --duration "${secs}s" >/dev/null 2>&1
  have=$("$bin" cluster digest --addr $addr | sed -n 's/.* tasks \([0-9]*\).*/\1/p')
done
echo "console first paint: $have tasks stored, $runs loads a page, $(nproc) cores"
"$venv/bin/python" bench/console_paint.py "http://$http" "$runs"

#!/usr/bin/env bash
# Memory per pending task of one node: starts SERVER_BIN (`raftq serve`, one node, fresh data directory), fills
# its queue for DURATION with producers only (`raftq bench --workers 0`, DRIVER_BIN, default: SERVER_BIN), every
# task under one of KEYS concurrency keys (0: none), then prints the tasks enqueued, the server's resident memory
# before and after, and the bytes of memory per pending task.
#
#   bench/backlog-memory.sh SERVER_BIN KEYS [DURATION] [DRIVER_BIN]
#
# Example: bench/backlog-memory.sh target/release/raftq 16 10s
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
server=$(realpath "$1") keys=$2 duration=${3:-10s} driver=$(realpath "${4:-$1}")
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc=127.0.0.1:$(port)
: > "$dir/serve.log"
"$server" serve --node-id 1 --data-dir "$dir/node" --grpc-addr "$grpc" --raft-addr "127.0.0.1:$(port)" \
  --http-addr "127.0.0.1:$(port)" --auth none > "$dir/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q "raftq node started" "$dir/serve.log" && break
  sleep 0.1
done
sleep 1
rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$pid/status"; }
before=$(rss)
out=$("$driver" bench --addr "http://$grpc" --workers 0 --keys "$keys" --duration "$duration" --output json)
sleep 2
after=$(rss)
enqueued=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["enqueued"])' "$out")
echo "keys $keys enqueued $enqueued rss_before $before rss_after $after bytes_per_task $(( (after - before) / enqueued ))"

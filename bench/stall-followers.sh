#!/usr/bin/env bash
# Runs `latency-3` with both followers stopped (SIGSTOP) for a moment a few times, as a machine that stalls them
# together would: the leader's appends to them run out of time, and what follows is how quickly replication
# resumes once they answer again. Prints the suite's result line and how many appends failed.
#
#   bench/stall-followers.sh SERVER_BIN [RATE] [STALL_S] [COUNT]
#
# SERVER_BIN: the nodes' raftq (the suite's driver is target/release/raftq, or $DRIVER); RATE tasks/s (9000);
# STALL_S seconds each stall lasts (0.25); COUNT stalls (3), 4 s apart from 12 s after the start (node 1 leads
# the suite's fresh cluster, so nodes 2 and 3 are the followers). 20 s runs ($DURATION).
# KEEP=1 keeps the nodes' logs (their directory is printed).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
bin=$(realpath "$1") rate=${2:-9000} stall=${3:-0.25} count=${4:-3}
driver=${DRIVER:-target/release/raftq}
stop_followers() {
  sleep 12
  for _ in $(seq 1 "$count"); do
    pids=$(pgrep -f "^$bin serve --node-id [23] " || true)
    [ -n "$pids" ] || { echo "no followers of $bin running" >&2; return; }
    kill -STOP $pids; sleep "$stall"; kill -CONT $pids
    sleep 3.75
  done
}
mkdir -p target/stall-followers && out=$(mktemp -d -p target/stall-followers)
stop_followers &
RAFTQ_SUITE_NODE_LOG=warn "$driver" bench-suite --runs 1 --duration "${DURATION:-20s}" --only latency-3 \
  --paced-rate "$rate" --server-bin "$bin" --work-dir "$out" > "$out/run.txt" 2>&1 || true
wait
failed=$(cat "$out"/run-*.logs/node*.log 2>/dev/null | grep -c 'recv RPCError' || true)
echo "$(basename "$bin") $(grep -E '^   [0-9]|stages' "$out/run.txt" | tr -s ' ' | tr '\n' ' ') failed appends: $failed"
if [ -n "${KEEP:-}" ]; then echo "kept: $out"; else rm -rf "$out"; fi

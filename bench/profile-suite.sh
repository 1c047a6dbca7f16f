#!/usr/bin/env bash
# Profiles the nodes of one `raftq bench-suite` scenario as users load them: through the Rust SDK (which follows the
# leader), at the scenario's own load (`cycle-3`: its peak).
#
#   bench/profile-suite.sh [scenario] [seconds]      (default: cycle-3, 10 s)
#   WARMUP=45 bench/profile-suite.sh cycle-3 10      (record from 45 s in, after the nodes' memory has grown)
#   SUITE_ARGS="--paced-rate 4000" bench/profile-suite.sh latency-3 10   (more arguments for the suite)
#
# Builds the release binary (the suite's driver, with this tree's SDK) and the `profiling` profile with frame
# pointers into target/profiling (the nodes, as the suite's --server-bin), runs the scenario once for
# WARMUP + seconds + 3 s, and from WARMUP s in (default 12) records `perf record -g` on every node and `top` over the
# same window. Prints the suite's row, each process's CPU share and resident memory, the split by stage per node
# (bench/stages.py) and each node's hottest symbols; the recordings stay in target/profiling/perf-suite-<pid>.data.
# bench/profile.sh is the other way: nodes it starts itself, loaded by `raftq bench` at a paced rate, with CPU
# microseconds per task; its raw clients stay on the node they reach.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-cycle-3}
secs=${2:-10}
warmup=${WARMUP:-12}
out=target/profiling
mkdir -p "$out"
cargo build --release --bin raftq >&2
RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=$out cargo build --profile profiling --bin raftq >&2
server=$PWD/$out/profiling/raftq
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
target/release/raftq bench-suite --runs 1 --duration "$((warmup + secs + 3))s" --only "$scenario" --server-bin "$server" \
  ${SUITE_ARGS:-} > "$work/suite.txt" 2>&1 &
suite=$!
sleep "$warmup"
pids=$(pgrep -f "^$server serve" || true)
[ -n "$pids" ] || { echo "no node of $server runs (scenario $scenario?)" >&2; cat "$work/suite.txt" >&2; exit 1; }
recs=()
for p in $pids; do
  perf record -F 499 -g -p "$p" -o "$work/perf-$p.data" -- sleep "$secs" >/dev/null 2>&1 &
  recs+=($!)
done
top -b -d "$secs" -n 2 > "$work/top.txt" &
recs+=($!)
wait "${recs[@]}" || true
wait $suite || true
rm -f "$out"/perf-suite-*.data
for p in $pids; do cp "$work/perf-$p.data" "$out/perf-suite-$p.data"; done
grep '^| `' "$work/suite.txt"
echo "== CPU over the ${secs} s (top; the driver is target/release/raftq)"
awk '/^top -/{n++} n==2' "$work/top.txt" | sed -n '3p;7,12p'
for p in $pids; do
  echo "== node pid $p"
  perf script -i "$work/perf-$p.data" 2>/dev/null | python3 bench/stages.py
  perf report -i "$work/perf-$p.data" --no-children --sort symbol --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | head -8 |
    cut -c1-110 || true
done

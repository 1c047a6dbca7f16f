#!/usr/bin/env bash
# Profiles raftq under the full cycle: CPU per task by stage on each node, and a flame graph.
#
#   bench/profile.sh [1|3] [seconds]      (default: 3 nodes, 15 s)
#
# Builds the `profiling` profile (release with line tables) with frame pointers into target/profiling, starts the
# nodes with `raftq bench-suite`'s layout by hand (ports 127.0.0.1:19091..), loads them with `raftq bench`
# (capped at 10,000 tasks in flight is not needed here: the load is paced at --rate, default 10000/s, so every
# node works at the same known rate), records `perf record -g` on each node, and prints per node: CPU seconds,
# CPU microseconds per completed task, and the split by stage (bench/stages.py). Flame graphs (SVG) go to
# target/profiling/flame-node<N>.svg when `inferno` is installed (`cargo install inferno`).
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-3}
secs=${2:-15}
rate=${RATE:-10000}
out=target/profiling
mkdir -p "$out"
RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=$out cargo build --profile profiling --bin raftq >&2
bin=$out/profiling/raftq
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret"
peers=()
for i in $(seq "$nodes"); do peers+=(--peer "$i=127.0.0.1:$((19100 + i)),127.0.0.1:$((19090 + i))"); done
[ "$nodes" -gt 1 ] || peers=()
pids=()
for i in $(seq "$nodes"); do
  RAFTQ_LOG=warn "$bin" serve --node-id "$i" --data-dir "$work/node$i" --grpc-addr "127.0.0.1:$((19090 + i))" \
    --raft-addr "127.0.0.1:$((19100 + i))" --http-addr "127.0.0.1:$((19110 + i))" \
    --auth-hs256-secret-file "$work/secret" "${peers[@]}" 2>"$work/node$i.log" &
  pids+=($!)
done
token=$("$bin" token issue --secret-file "$work/secret" --scopes enqueue,work,read,admin)
addrs=$(seq -s, -f "127.0.0.1:%g" 19091 $((19090 + nodes)))
for _ in $(seq 100); do "$bin" cluster status --addr 127.0.0.1:19091 --auth-token "$token" 2>/dev/null | grep -q LEADER && break; sleep 0.2; done
"$bin" cluster status --addr 127.0.0.1:19091 --auth-token "$token" >&2
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
"$bin" bench --addr "$addrs" --auth-token "$token" --rate "$rate" --duration "$((secs + 4))s" --producers 4 --batch 1 \
  --inflight 256 > "$work/bench.txt" 2>&1 &
bench=$!
sleep 2
# A node's log fsyncs and synced entries so far, from its /metrics.
syncs() { curl -s "http://127.0.0.1:$((19110 + $1))/metrics" | awk '/^raftq_log_fsyncs_total /{f=$2} /^raftq_log_synced_entries_total /{e=$2} END{print f+0, e+0}'; }
declare -A c0 s0 s1
for i in $(seq "$nodes"); do s0[$i]=$(syncs "$i"); done
for p in "${pids[@]}"; do c0[$p]=$(cpu "$p"); perf record -F 499 -g -p "$p" -o "$work/perf-$p.data" -- sleep "$secs" >/dev/null 2>&1 & done
sleep "$secs"
declare -A c1
for p in "${pids[@]}"; do c1[$p]=$(cpu "$p"); done
for i in $(seq "$nodes"); do s1[$i]=$(syncs "$i"); done
wait $bench || true
cat "$work/bench.txt" | grep -E "^(enqueued|completed|enqueue->|log fsyncs|raft entries|enqueues per fsync)" >&2
rate_done=$(awk '/^completed /{gsub(/[(\/s]/,"",$3); print $3}' "$work/bench.txt")
tck=$(getconf CLK_TCK)
sleep 1
for i in $(seq "$nodes"); do
  p=${pids[$((i - 1))]}
  role=$("$bin" cluster status --addr "127.0.0.1:$((19090 + i))" --auth-token "$token" 2>/dev/null | awk -v id="$i" '$1==id{print $4}')
  used=$(echo "(${c1[$p]} - ${c0[$p]}) / $tck" | bc -l)
  echo "== node $i ($role): $(printf %.2f "$used") CPU s over ${secs} s, $(echo "$used * 1000000 / ($rate_done * $secs)" | bc -l | xargs printf %.1f) us per completed task"
  read -r f0 e0 <<<"${s0[$i]}"
  read -r f1 e1 <<<"${s1[$i]}"
  echo "   log fsyncs $(echo "($f1 - $f0) / $secs" | bc -l | xargs printf %.0f)/s, $(echo "($e1 - $e0) / ($f1 - $f0 + 0.000001)" | bc -l | xargs printf %.1f) entries and $(echo "$rate_done * $secs / ($f1 - $f0 + 0.000001)" | bc -l | xargs printf %.1f) completed tasks per fsync"
  perf script -i "$work/perf-$p.data" 2>/dev/null | python3 bench/stages.py
  if command -v inferno-collapse-perf >/dev/null; then
    perf script -i "$work/perf-$p.data" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph --minwidth 1 --title "raftq node $i ($role), full cycle at $rate/s" > "$out/flame-node$i.svg"
  fi
done

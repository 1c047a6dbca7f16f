#!/usr/bin/env bash
# Back-to-back A/B of two raftq builds with each build's own `raftq bench` (full cycles: producer streams ->
# worker streams -> results, fsync on): one node (the bench's embedded node) and three nodes (cluster/run.sh
# processes on this machine). Runs alternate A, B, A, B, ... so both builds see the same machine; the summary is
# the median of the runs and their spread (min-max), per build and setup.
#
#   bench/ab.sh BIN_A BIN_B [RUNS=3] [DURATION=20s]
#
# Example (the renovation's before/after): build the old commit into its own target directory, then
#   git worktree add --detach ../before 867db04 && (cd ../before && cargo build --release --bin raftq)
#   cargo build --release --bin raftq
#   bench/ab.sh ../before/target/release/raftq target/release/raftq
#
# The three-node runs use cluster/data/ (removed before each run): stop a cluster/run.sh cluster first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
a=$(realpath "$1") b=$(realpath "$2") runs=${3:-3} dur=${4:-20s}
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
for i in 1 2 3; do
  if [ -f "cluster/data/node$i.pid" ] && kill -0 "$(cat "cluster/data/node$i.pid")" 2>/dev/null; then
    echo "a cluster/run.sh node runs (node $i): stop it first (cluster/run.sh stop)" >&2
    exit 2
  fi
done

out=$(mktemp -d)
trap 'RAFTQ_BIN=$a cluster/run.sh stop >/dev/null 2>&1 || true; rm -rf "$out"' EXIT

rate() { sed -n 's/^completed .*(\([0-9]*\)\/s full cycles).*/\1/p' "$1"; }

one_node() {
  local bin=$1 log=$2
  "$bin" bench --duration "$dur" >"$log" 2>&1
}

three_nodes() {
  local bin=$1 log=$2
  rm -rf cluster/data
  RAFTQ_BIN=$bin cluster/run.sh start >/dev/null
  local token
  token=$("$bin" token issue --secret-file cluster/data/secret.hs256)
  RAFTQ_TOKEN=$token "$bin" bench --addr 127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093 --duration "$dur" >"$log" 2>&1
  RAFTQ_BIN=$bin cluster/run.sh stop >/dev/null
  rm -rf cluster/data
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "A = $a"
echo "B = $b"
for run in $(seq "$runs"); do
  for setup in one_node three_nodes; do
    for side in A B; do
      bin=$a
      [ "$side" = B ] && bin=$b
      log=$out/$setup-$side-$run.log
      "$setup" "$bin" "$log"
      r=$(rate "$log")
      echo "$r" >>"$out/$setup-$side"
      echo "run $run  $setup  $side  ${r:-?} cycles/s"
    done
  done
done

echo
echo "median (min-max) full cycles/s over $runs runs of $dur:"
for setup in one_node three_nodes; do
  for side in A B; do
    sort -n "$out/$setup-$side" | awk -v s="$setup" -v side="$side" '
      { v[NR] = $1 } END { printf "  %-12s %s  %6d  (%d-%d)\n", s, side, v[int((NR + 1) / 2)], v[1], v[NR] }'
  done
done

#!/usr/bin/env bash
# Alternating A/B of two suite drivers (the SDK's producers and workers) against one server build: ROUNDS pairs of
# single 20 s runs of one bench-suite scenario, driver A then driver B, the nodes always SERVER_BIN's. For each
# run, the driver's own CPU over 8 s from 10 s in (/proc/PID/stat, so builds that do not report
# `driver CPU µs/task` are measured the same way), per task at the run's rate, then the suite's result line.
# The server is the same in every run, so its CPU per task shows how fast the host was: compare the drivers by
# driver CPU over server CPU per task, within a pair.
#
#   bench/ab-driver.sh SCENARIO ROUNDS DRIVER_A DRIVER_B SERVER_BIN [more bench-suite arguments]
#
# Example: bench/ab-driver.sh cycle-1 4 /tmp/before/raftq target/release/raftq /tmp/before/raftq
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
scenario=$1 rounds=$2 a=$(realpath "$3") b=$(realpath "$4") server=$(realpath "$5")
shift 5
out=$(mktemp)
trap 'rm -f "$out"' EXIT
ticks=$(getconf CLK_TCK)
for r in $(seq 1 "$rounds"); do
  for d in "$a" "$b"; do
    "$d" bench-suite --runs 1 --duration 20s --only "$scenario" --server-bin "$server" "$@" > "$out" 2>&1 &
    pid=$!
    sleep 10
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    sleep 8
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    wait "$pid" || true
    line=$(grep -E '^\| `' "$out" | cut -d'|' -f4,5 | tr -s ' ' || true)
    rate=$(echo "$line" | awk '{print $1}')
    if [ -z "$rate" ]; then echo "$d no result"; cat "$out"; continue; fi
    awk -v d="$d" -v c0="$c0" -v c1="$c1" -v t="$ticks" -v r="$rate" -v l="$line" \
      'BEGIN { cores = (c1 - c0) / t / 8; printf "%s driver %.2f cores, %.1f µs/task |%s\n", d, cores, cores / r * 1e6, l }'
  done
done

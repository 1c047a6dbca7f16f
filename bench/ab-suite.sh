#!/usr/bin/env bash
# Alternating A/B of two server builds on one bench-suite scenario: ROUNDS pairs of single runs (10 s, or
# $DURATION as bench-suite's --duration takes it), A then B,
# every run driven by B's suite driver (`--server-bin` picks the nodes' binary), so only the server differs and
# both see the same machine. Prints one line per run: the build's file name and the suite's result line (with the
# enqueue->claim stages where the scenario measures them).
#
#   bench/ab-suite.sh SCENARIO ROUNDS BIN_A BIN_B [more bench-suite arguments]
#
# Example: bench/ab-suite.sh overload-1 3 ../before/target/release/raftq target/release/raftq
# Take the median and spread of each build's lines.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
scenario=$1 rounds=$2 a=$(realpath "$3") b=$(realpath "$4")
shift 4
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for bin in "$a" "$b"; do
    log="$out/round-$r-$(basename "$bin").log"
    "$b" bench-suite --runs 1 --duration "${DURATION:-10s}" --only "$scenario" --server-bin "$bin" "$@" > "$log" 2>&1 || true
    line=$(grep -E '^   [0-9]|stages' "$log" | tr -s ' ' | tr '\n' ' ' || true)
    # A run without a result line keeps its whole output.
    if grep -qE '^   [0-9]' "$log"; then rm -f "$log"; else line="no result: $log"; fi
    echo "$bin $line"
  done
done

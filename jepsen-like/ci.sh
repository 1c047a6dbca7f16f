#!/usr/bin/env bash
# CI stage: one mixed-fault run of raftq-jepsen against release binaries; fails on any violation.
#
# The whole stage aims at about 5 minutes: the release build (seconds when target/ is warm, a few minutes
# after server changes) plus a run whose fault time is what is left, between 60 and 150 seconds, plus heal,
# drain and checks (about 20 s). JEPSEN_TIME_LIMIT and JEPSEN_SEED override; the seed is printed, so a
# failing run can be repeated with the same schedule.
set -euo pipefail
cd "$(dirname "$0")/.."

# Clock-skew faults need libfaketime (Debian's faketime package); without it they are skipped, with a note.
if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -qq faketime >/dev/null 2>&1 ||
      (apt-get update -qq && apt-get install -y -qq faketime) >/dev/null 2>&1 ||
      echo "jepsen-like: faketime could not be installed; clock-skew faults will be skipped"
  else
    echo "jepsen-like: libfaketime is not installed; clock-skew faults will be skipped"
  fi
fi

start=$(date +%s)
cargo build --release -p raftq -p raftq-jepsen
built=$(( $(date +%s) - start ))

budget=${JEPSEN_BUDGET_S:-300}
limit=${JEPSEN_TIME_LIMIT:-$(( budget - built - 30 ))}
[ "$limit" -gt 150 ] && limit=150
[ "$limit" -lt 60 ] && limit=60
seed=${JEPSEN_SEED:-201}
out=target/jepsen/ci-$seed
echo "jepsen-like: build took ${built} s; ${limit} s of mixed faults, seed $seed, output $out"
status=0
target/release/raftq-jepsen run --time-limit "$limit" --seed "$seed" --faults all --out "$out" || status=$?
if [ "$status" -ne 0 ]; then
  echo "jepsen-like: FAILED (exit $status); history, summary, report and node logs in $out" >&2
  echo "jepsen-like: repeat with JEPSEN_SEED=$seed JEPSEN_TIME_LIMIT=$limit jepsen-like/ci.sh" >&2
fi
exit "$status"

#!/usr/bin/env bash
# CI stage: one mixed-fault run of raftq-jepsen against release binaries, then a short run of the limits
# workload under leader kills; fails on any violation of either.
#
# The whole stage aims at about 6-7 minutes: the release build (seconds when target/ is warm, a few minutes
# after server changes) plus a run whose fault time is what is left of 5 minutes, between 60 and 150 seconds,
# plus heal, drain and checks (about 20 s); then the limits run, 60 s of kill and kill-leader faults plus about
# 30 s of start, drain and checks. JEPSEN_TIME_LIMIT and JEPSEN_SEED (JEPSEN_LIMITS_TIME_LIMIT and
# JEPSEN_LIMITS_SEED for the second run) override; the seeds are printed, so a failing run can be repeated
# with the same schedule.
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
# The static release build the image and the browser stage share (.ci/static-release.sh); raftq-jepsen starts the
# raftq binary next to it.
. .ci/static-release.sh
static_release_build -p raftq -p raftq-jepsen
built=$(( $(date +%s) - start ))

budget=${JEPSEN_BUDGET_S:-300}
limit=${JEPSEN_TIME_LIMIT:-$(( budget - built - 30 ))}
[ "$limit" -gt 150 ] && limit=150
[ "$limit" -lt 60 ] && limit=60
seed=${JEPSEN_SEED:-201}
out=target/jepsen/ci-$seed
echo "jepsen-like: build took ${built} s; ${limit} s of mixed faults, seed $seed, output $out"
status=0
"$STATIC_RELEASE_DIR/raftq-jepsen" run --time-limit "$limit" --seed "$seed" --faults all --out "$out" || status=$?
if [ "$status" -ne 0 ]; then
  echo "jepsen-like: FAILED (exit $status); history, summary, report and node logs in $out" >&2
  echo "jepsen-like: repeat with JEPSEN_SEED=$seed JEPSEN_TIME_LIMIT=$limit jepsen-like/ci.sh" >&2
fi

# The limits workload: a running cap of 4, keys limited to 2 each, weights 3:1:1, a rate limit; the leader is
# killed again and again, and the history must show no more running than the cap or a key's limit.
lseed=${JEPSEN_LIMITS_SEED:-211}
llimit=${JEPSEN_LIMITS_TIME_LIMIT:-60}
lout=target/jepsen/ci-limits-$lseed
echo "jepsen-like: limits workload, ${llimit} s of kill-leader and kill faults, seed $lseed, output $lout"
lstatus=0
"$STATIC_RELEASE_DIR/raftq-jepsen" run --workload limits --time-limit "$llimit" --seed "$lseed" --faults kill-leader,kill \
  --out "$lout" || lstatus=$?
if [ "$lstatus" -ne 0 ]; then
  echo "jepsen-like: limits run FAILED (exit $lstatus); history, summary, report and node logs in $lout" >&2
  echo "jepsen-like: repeat with JEPSEN_LIMITS_SEED=$lseed JEPSEN_LIMITS_TIME_LIMIT=$llimit jepsen-like/ci.sh" >&2
fi
[ "$status" -ne 0 ] && exit "$status"
exit "$lstatus"

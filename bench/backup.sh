#!/usr/bin/env bash
# Backup and restore speed and memory: one release node filled with N pending tasks (`raftq bench --workload
# enqueue`, 100-byte payloads, batches of 1000), then RUNS x (`raftq backup` from the node, `raftq restore` of the
# file into a fresh data directory), each under /usr/bin/time -v. Per run: seconds, MB/s, tasks/s and the peak
# RSS of the CLI process, and the server's RSS before and after the backup (VmRSS, and VmHWM, its peak). The
# summary is the median of the runs and their spread (min-max). Compare sizes to see memory stay flat:
#
#   bench/backup.sh [TASKS=1000000] [RUNS=3] [BIN=target/release/raftq]
#   bench/backup.sh 100000 && bench/backup.sh 1000000
#
# Uses ports 17401-17403 and a temporary directory (removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-1000000} runs=${2:-3} bin=$(realpath "${3:-target/release/raftq}")
[ -x "$bin" ] || { echo "not an executable: $bin (cargo build --release --bin raftq)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time)" >&2; exit 2; }
addr=127.0.0.1:17401
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

RAFTQ_LOG=warn "$bin" serve --data-dir "$work/src" --grpc-addr $addr --raft-addr 127.0.0.1:17402 \
  --http-addr 127.0.0.1:17403 --auth none >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do "$bin" cluster status --addr $addr >/dev/null 2>&1 && break; sleep 0.2; done

count() { "$bin" cluster digest --addr $addr | sed -n 's/.* tasks \([0-9]*\).*/\1/p'; }
have=0
while [ "$have" -lt "$tasks" ]; do
  # About 100k tasks a second on a 2-core machine: fill in steps, the last one short.
  secs=$(( (tasks - have) / 100000 )); [ "$secs" -ge 1 ] || secs=1; [ "$secs" -le 5 ] || secs=5
  "$bin" bench --addr $addr --workload enqueue --batch 1000 --producers 4 --duration "${secs}s" >/dev/null 2>&1
  have=$(count)
  echo "filled: $have tasks" >&2
done

kb() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$pid/status"; }
# GNU time's wall clock (h:mm:ss or m:ss.ss) in seconds, and its peak RSS in kB.
wall() { sed -n 's/.*Elapsed (wall clock) time.*: //p' "$1" | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }'; }
rss() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1"; }

printf '%-4s %10s %9s %8s %9s %10s %10s %10s %11s | %9s %8s %9s %10s\n' run tasks MB backup_s MB/s tasks/s cli_rss_MB \
  srv_rss_MB srv_peak_MB restore_s MB/s tasks/s cli_rss_MB >"$work/table"
for run in $(seq "$runs"); do
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  before=$(kb VmRSS)
  /usr/bin/time -v "$bin" backup --out "$work/b.backup" --addr $addr >"$work/backup.out" 2>"$work/backup.time"
  after=$(kb VmRSS) peak=$(kb VmHWM)
  bytes=$(stat -c %s "$work/b.backup")
  n=$(sed -n 's/.* \([0-9]*\) tasks,.*/\1/p' "$work/backup.out")
  bs=$(wall "$work/backup.time")
  rm -rf "$work/restored"
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  /usr/bin/time -v "$bin" restore "$work/b.backup" --data-dir "$work/restored" --node-id 1 --auth none \
    >"$work/restore.out" 2>"$work/restore.time"
  rs=$(wall "$work/restore.time")
  awk -v run="$run" -v n="$n" -v bytes="$bytes" -v bs="$bs" -v brss="$(rss "$work/backup.time")" -v before="$before" \
    -v after="$after" -v peak="$peak" -v rs="$rs" -v rrss="$(rss "$work/restore.time")" 'BEGIN {
      mb = bytes / 1e6
      printf "%-4s %10d %9.1f %8.2f %9.1f %10.0f %10.1f %4.0f->%-5.0f %11.0f | %9.2f %8.1f %9.0f %10.1f\n", run, n, mb, bs,
        mb / bs, n / bs, brss / 1024, before / 1024, after / 1024, peak / 1024, rs, mb / rs, n / rs, rrss / 1024 }' \
    >>"$work/table"
done
cat "$work/table"
# Median and spread (min-max) of each measured column over the runs.
for c in 4:backup_s 5:backup_MB/s 6:backup_tasks/s 7:backup_cli_rss_MB 11:restore_s 12:restore_MB/s 13:restore_tasks/s \
  14:restore_cli_rss_MB; do
  col=${c%%:*} name=${c#*:}
  awk -v c="$col" 'NR > 1 { print $c }' "$work/table" | sort -g | awk -v name="$name" '{ v[NR] = $1 }
    END { printf "%-20s median %10.2f  spread %.2f-%.2f\n", name, v[int((NR + 1) / 2)], v[1], v[NR] }'
done

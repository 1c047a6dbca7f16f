#!/usr/bin/env python3
"""CPU per thread name of every running `raftq serve` process, over a window (default 8 s).

    python3 bench/threads.py [SECONDS]

Reads /proc/PID/task/TID/stat (utime + stime) at the start and the end of the window, and prints per node process
its share of one core in all and per thread name (tokio's workers, the log writer, the state machine's flusher),
largest first. Run it while a load runs, e.g. a `raftq bench-suite --duration 30s --only latency-3` started a few
seconds before.
"""
import collections
import os
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def nodes():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"raftq" in os.path.basename(argv[0]) and argv[1:2] == [b"serve"]:
            node = argv[argv.index(b"--node-id") + 1].decode() if b"--node-id" in argv else "?"
            yield pid, node


def snapshot():
    out = {}
    for pid, node in nodes():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(pid, node, tid, name)] = int(fields[11]) + int(fields[12])
    return out


def main():
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    before = snapshot()
    time.sleep(window)
    after = snapshot()
    share = collections.defaultdict(float)
    for key, ticks in after.items():
        pid, node, _, name = key
        share[(pid, node, name)] += (ticks - before.get(key, ticks)) / TICKS / window * 100
    for pid, node in sorted({(p, n) for p, n, _ in share}, key=lambda x: x[1]):
        rows = sorted(((v, name) for (p, _, name), v in share.items() if p == pid), reverse=True)
        total = sum(v for v, _ in rows)
        print(f"node {node} (pid {pid}): {total:.1f}% of a core; "
              + ", ".join(f"{name} {v:.1f}%" for v, name in rows if v >= 0.05))


if __name__ == "__main__":
    main()

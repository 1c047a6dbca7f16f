#!/usr/bin/env python3
"""When the slow claims happen, next to what the nodes were doing then.

    RAFTQ_SUITE_TRACE=/tmp/claims.txt RAFTQ_SUITE_NODE_LOG="warn,raftq::storage=trace" \
        target/release/raftq bench-suite --runs 1 --duration 20s --only latency-3 --paced-rate 13000
    python3 bench/episodes.py /tmp/claims.txt target/bench-suite/run-*.logs [--window-ms 100] [--over-ms 25]

The trace has one line per claim (send time in µs since the epoch, then send->stamp, stamp->claim and
claim->worker in µs); the node logs, at `raftq::storage=trace`, say when each state-machine flush ran ("flushed",
D when synced) and how long each Raft log checkpoint took, and at warn each append to a follower that failed
("RPCError", openraft's replication). Prints, per window of sends whose median enqueue->claim is over --over-ms: the
window's start (seconds of the minute), its median and send->stamp median (ms), the largest stamp->claim (ms), and
the flushes and checkpoints over 15 ms and the failed appends that overlapped it, by node.

With --by-flush it prints instead, for each phase of a flush (the shards' commits, synced or not, the write-back
of spilled pages, the freeing of the written layers; from the flusher's trace line) and for no flush at all, the
claims whose send fell in it, on any node: how many, their p50 and p99, and how many of the run's slowest 1 %.
"""
import argparse
import bisect
import collections
import datetime
import glob
import re


def events(logdir, phases=None):
    out = []
    for path in sorted(glob.glob(logdir + "/node*.log")):
        node = re.search(r"node(\d+)\.log$", path).group(1)
        for line in open(path, errors="replace"):
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            m = re.match(r"(\S+)Z\s+\w+\s+\S+: (.*)", line)
            if not m:
                continue
            end = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
            msg = m.group(2)
            if msg.startswith("flushed"):
                ms = int(re.search(r"ms=(\d+)", msg).group(1))
                synced = " D" if "durable=true" in msg else ""
                out.append((end - ms / 1000, end, f"n{node} flush{synced} {ms}ms"))
                if phases is not None:
                    commit, back, free = (int(re.search(rf"{k}=(\d+)", msg).group(1)) / 1000
                                          for k in ("commit_ms", "back_ms", "free_ms"))
                    start = end - ms / 1000
                    phases.append((start, start + commit, "synced commit" if synced else "unsynced commit"))
                    phases.append((start + commit, start + commit + back, "write-back"))
                    phases.append((end - free, end, "freeing layers"))
            elif msg.startswith("raft log checkpoint"):
                us = int(re.search(r"us=(\d+)", msg).group(1))
                if us > 15000:
                    out.append((end - us / 1e6, end, f"n{node} ckpt {us // 1000}ms"))
            elif "recv RPCError" in msg:
                late = "timeout after" in msg or "Timeout expired" in msg
                out.append((end - 0.001, end, f"n{node} append {'timed out' if late else 'failed'}"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("logdir")
    ap.add_argument("--window-ms", type=int, default=100)
    ap.add_argument("--over-ms", type=int, default=25)
    ap.add_argument("--by-flush", action="store_true",
                    help="instead: enqueue->claim by what any node's flusher was doing when the task was sent")
    a = ap.parse_args()
    if a.by_flush:
        return by_flush(a)
    w = a.window_ms * 1000
    windows = collections.defaultdict(list)
    for line in open(a.trace):
        sent, s1, s2, s3 = map(int, line.split())
        windows[sent // w].append((s1 + s2 + s3, s1, s2))
    ev = events(a.logdir)
    for k in sorted(windows):
        rows = windows[k]
        total = sorted(r[0] for r in rows)[len(rows) // 2] // 1000
        if total <= a.over_ms:
            continue
        start = k * w / 1e6
        s1 = sorted(r[1] for r in rows)[len(rows) // 2] // 1000
        s2 = max(r[2] for r in rows) // 1000
        near = [e[2] for e in ev if e[0] < start + w / 1e6 and e[1] > start]
        when = datetime.datetime.fromtimestamp(start, datetime.timezone.utc).strftime("%S.%f")[:-5]
        print(f"{when} {total:4d} {s1:3d} {s2:3d}  {', '.join(near)}")


def by_flush(a):
    """Each claim by the flusher phase (of any node) its send fell in, the first in time if several: how many, the
    share of all sends, p50 and p99 of enqueue->claim, and how many of the run's slowest 1 % it holds."""
    phases = []
    events(a.logdir, phases)
    phases.sort()
    starts = [p[0] for p in phases]
    longest = max((p[1] - p[0] for p in phases), default=0)
    groups = collections.defaultdict(list)
    for line in open(a.trace):
        sent, s1, s2, s3 = map(int, line.split())
        t, what = sent / 1e6, "no flush"
        i = bisect.bisect_right(starts, t)
        while i > 0 and starts[i - 1] >= t - longest:
            i -= 1
            if phases[i][0] <= t <= phases[i][1]:
                what = phases[i][2]
        groups[what].append((s1 + s2 + s3) / 1000)
    every = sorted(v for g in groups.values() for v in g)
    slow = every[int(len(every) * 0.99)]
    q = lambda v, p: v[min(len(v) - 1, int(len(v) * p))]
    print(f"all: {len(every)} claims, p50 {q(every, .5):.2f} ms, p99 {slow:.2f} ms")
    print("during            claims  share   p50 ms   p99 ms  of the slowest 1 %")
    for what, g in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        g.sort()
        over = sum(1 for v in g if v > slow)
        print(f"{what:16s} {len(g):7d} {len(g) / len(every):6.1%} {q(g, .5):8.2f} {q(g, .99):8.2f}  {over}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Buckets perf samples (`perf script` output on stdin) into raftq's pipeline stages by the frames of each stack.

Each sample counts once, in the first stage (in the order below) whose rule matches its thread or frames; the rest
is runtime, idle and anything unmatched. Used by bench/profile.sh."""
import sys, collections
rules = [
    ("log writer thread", lambda c, fr: c.startswith("raftq-log-write")),
    ("sm flush thread", lambda c, fr: c.startswith("raftq-sm-flush")),
    ("apply (state machine)", lambda c, fr: any("apply_batch" in f for f in fr)),
    ("log store append/read", lambda c, fr: any("log_store" in f for f in fr)),
    ("raft network (replication rpc)", lambda c, fr: any("raft::network" in f or "raft::service" in f or "RaftService" in f for f in fr)),
    ("openraft core", lambda c, fr: any("openraft::" in f for f in fr)),
    ("claim dispatcher", lambda c, fr: any("dispatcher" in f for f in fr)),
    ("proposer/coalesce", lambda c, fr: any("proposer" in f for f in fr)),
    ("api stream handlers", lambda c, fr: any("api::stream" in f for f in fr)),
    ("api unary/convert", lambda c, fr: any("raftq::api::" in f for f in fr)),
    ("protobuf encode/decode", lambda c, fr: any("prost::" in f or "ProstEncoder" in f or "ProstDecoder" in f for f in fr)),
    ("http2/hyper/tonic transport", lambda c, fr: any(x in f for f in fr for x in ("h2::", "hyper::", "tonic::"))),
    ("tokio runtime/idle", lambda c, fr: True),
]
counts = collections.Counter(); total = 0
comm = None; frames = []
def flush():
    global total
    if comm is None: return
    for name, f in rules:
        if f(comm, frames):
            counts[name] += 1; break
    total += 1
for line in sys.stdin:
    if not line.strip():
        flush(); comm = None; frames = []; continue
    if not line.startswith((" ", "\t")):
        comm = line.split()[0]; frames = []
    else:
        parts = line.strip().split(None, 1)
        if len(parts) == 2: frames.append(parts[1])
flush()
for name, n in counts.most_common():
    print(f"{100.0*n/total:6.1f}%  {name}")
print(f"samples: {total}")

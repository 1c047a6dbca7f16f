"""The fencing token guarding a downstream store: each delivery of a task carries a token larger than every
earlier delivery's, so a store that remembers the largest token it has seen per key can refuse a write from a
worker whose lease already ran out (a paused process, a long GC, a partition) after another worker took over.

Here the store is SQLite; the same conditional write works in Postgres (``UPDATE ... WHERE fence < $token``),
Redis (a Lua script), or an object store's conditional put.

    RAFTQ_TOKEN=$(raftq token issue) python examples/fencing.py
"""

import os
import sqlite3
import threading

import raftq

db = sqlite3.connect("fenced.db", check_same_thread=False)
db.execute("CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER, fence INTEGER)")
lock = threading.Lock()


def write_fenced(account: str, balance: int, token: int) -> bool:
    """Writes unless a later delivery (a larger token) already wrote this row."""
    with lock, db:
        cur = db.execute(
            "INSERT INTO accounts (id, balance, fence) VALUES (?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET balance = excluded.balance, fence = excluded.fence "
            "WHERE accounts.fence <= excluded.fence",
            (account, balance, token),
        )
        return cur.rowcount == 1


def handle(task: raftq.Task) -> raftq.Outcome:
    account, amount = task.text.split(":")
    if not write_fenced(account, int(amount), task.fencing_token):
        return raftq.Abandon()  # a newer delivery owns this task now; our write was refused
    return raftq.Complete(b"written")


raftq.Worker(
    addrs=[os.environ.get("RAFTQ_ADDR", "127.0.0.1:9091")], token=os.environ.get("RAFTQ_TOKEN"), queues=["accounts"]
).run(handle)

"""Acknowledged means durable (DESIGN.md invariant 2): kill -9 a publishing process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidings.messaging import MessagingService
from tidings.structs import MessageId

pytest.importorskip("lmdb")

ROOT = Path(__file__).resolve().parents[1]
THREADS = 4
BATCH = 50

# Publishes from several threads; prints "thread batch" only after publish() returned,
# i.e. once the batch was acknowledged as durable. Each line is one write() to the pipe,
# so a kill cannot leave half of one (print() may write a line in pieces).
CHILD = f"""
import os, sys, threading
from tidings.store.backends.lmdb import LmdbStore
from tidings.messaging import MessagingService
service = MessagingService(LmdbStore(sys.argv[1]))
service.create_topic("ns", "t")
lock = threading.Lock()
print("ready", flush=True)
def run(t):
    b = 0
    while True:
        service.publish("ns", "t", [b"%d:%d:%d" % (t, b, i) for i in range({BATCH})])
        with lock:
            os.write(1, b"%d %d\\n" % (t, b))
        b += 1
for t in range({THREADS}):
    threading.Thread(target=run, args=(t,), daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.slow
def test_every_acknowledged_batch_survives_sigkill(tmp_path: Path) -> None:
    from tidings.store.backends.lmdb import LmdbStore

    path = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    with child.stdout:
        try:
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(1.5)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        lines = child.stdout.read().decode().split("\n")
    acked: dict[int, int] = {}
    for line in lines[:-1]:  # the text after the last newline is not a whole line
        t, b = map(int, line.split())
        acked[t] = max(acked.get(t, -1), b)
    assert sum(b + 1 for b in acked.values()) > 4, "the child published too little to test"

    store = LmdbStore(path)
    try:
        service = MessagingService(store)
        messages = []
        start: MessageId | None = None
        while page := service.fetch("ns", "t", start=start, inclusive=False, limit=10_000):
            messages.extend(page)
            start = page[-1].id
    finally:
        store.close()
    ids = [m.id for m in messages]
    assert ids == sorted(set(ids))
    for t in range(THREADS):
        mine = [m.payload for m in messages if m.payload.startswith(b"%d:" % t)]
        batches = len(mine) // BATCH
        # Whole batches only, in publish order, and at least every acknowledged one.
        assert mine == [b"%d:%d:%d" % (t, b, i) for b in range(batches) for i in range(BATCH)]
        assert batches >= acked.get(t, -1) + 1

"""kill -9 in the middle of a stream of transactions: nothing acknowledged is lost.

A child process runs a durable manager with several threads of begin/commit/abort/
invalidate/register calls and prints one line per call *after* it returned (that line is
the acknowledgement). The test kills it with SIGKILL at a random moment, opens the data
directory itself, checks every acknowledgement against the recovered state without
changing anything, and starts the next round on the same directory.

Run as ``python tests/test_tx_crash.py DIR SEED`` it is the child.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 3
THREADS = 6
TIDS = 3


# -- the child ---------------------------------------------------------------------------


def child(data_dir: str, seed: int) -> None:
    from tidings.errors import TidingsError, TransactionTimedOut
    from tidings.tx import TransactionManager, TxConfig

    config = TxConfig(sweep_interval=0.05, snapshot_every=50)
    manager = TransactionManager(data_dir, config)
    manager.start()

    def ack(*words: object) -> None:
        os.write(1, (" ".join(map(str, words)) + "\n").encode())  # one atomic pipe write

    def work(n: int) -> None:
        rng = random.Random(seed * 100 + n)
        tid = f"p{n % TIDS}"
        epoch: int | None = None
        while True:
            try:
                if epoch is None or rng.random() < 0.02:
                    info = manager.register_producer(tid)
                    epoch = info.epoch
                    ack("R", tid, info.epoch)
                owner = {"transactional_id": tid, "epoch": epoch} if rng.random() < 0.5 else {}
                tx = manager.begin(0.3 if rng.random() < 0.1 else 30, **owner)  # type: ignore[arg-type]
                wp = tx.write_pointer
                ack("B", wp)
                choice = rng.random()
                if choice < 0.6:
                    try:
                        manager.commit(wp, [b"key%d" % rng.randrange(20)], **owner)  # type: ignore[arg-type]
                        ack("C", wp)
                    except TransactionTimedOut:
                        ack("T", wp)
                elif choice < 0.8:
                    manager.abort(wp, **owner)  # type: ignore[arg-type]
                    ack("A", wp)
                elif choice < 0.9:
                    manager.invalidate(wp)
                    ack("I", wp)
                # else: left open; it times out or is fenced later
            except TidingsError as exc:  # conflicts, fencing by a sibling thread
                if type(exc).__name__ == "ProducerFenced":
                    epoch = None

    for n in range(THREADS):
        threading.Thread(target=work, args=(n,), daemon=True).start()
    ack("READY")
    while True:
        time.sleep(1)


# -- the test ----------------------------------------------------------------------------


@dataclass
class Acks:
    begun: list[int] = field(default_factory=list)
    committed: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    invalidated: set[int] = field(default_factory=set)  # invalidate() or told "timed out"
    epochs: dict[str, int] = field(default_factory=dict)  # highest acknowledged epoch

    def add(self, line: str) -> None:
        kind, *args = line.split()
        if kind == "R":
            self.epochs[args[0]] = max(self.epochs.get(args[0], -1), int(args[1]))
        elif kind == "B":
            self.begun.append(int(args[0]))
        elif kind == "C":
            self.committed.add(int(args[0]))
        elif kind == "A":
            self.aborted.add(int(args[0]))
        elif kind in ("I", "T"):
            self.invalidated.add(int(args[0]))


def run_child_and_kill(data_dir: Path, seed: int, rng: random.Random) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, __file__, str(data_dir), str(seed)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if raw.endswith(b"\n"):  # a cut line was never acknowledged
                lines.append(raw.decode().strip())
                if lines[-1] == "READY":
                    ready.set()
        ready.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert ready.wait(15), "the child did not start"
        assert proc.poll() is None, "the child died"
        time.sleep(rng.uniform(0.6, 1.4))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return [line for line in lines if line != "READY"]


def verify(data_dir: Path, acks: Acks) -> int:
    """Check every acknowledgement against the recovered state; changes nothing."""
    from tidings.errors import (
        ProducerFenced,
        TransactionAborted,
        TransactionCommitted,
        TransactionNotFound,
    )
    from tidings.tx import TransactionManager, TxConfig

    with TransactionManager(data_dir, TxConfig(sweep_interval=3600)) as m:
        state = m.state()
        assert len(acks.begun) == len(set(acks.begun)), "a write pointer was handed out twice"
        assert state.last_write_pointer >= max(acks.begun)
        for wp in acks.committed:
            assert wp not in state.in_progress and wp not in state.invalid
            with pytest.raises(TransactionCommitted):
                m.commit(wp)
        for wp in acks.aborted:
            assert wp not in state.in_progress
            if wp not in state.invalid:  # else it had timed out or been fenced already
                with pytest.raises(TransactionAborted):
                    m.commit(wp)
        for wp in acks.invalidated:
            assert wp in state.invalid
        for wp in acks.begun:  # every transaction is still known, however it ended
            if wp not in state.in_progress and wp not in state.invalid:
                try:
                    m.abort(wp)  # not in progress: answers without changing anything
                except TransactionCommitted:
                    pass
                except TransactionNotFound:  # pragma: no cover - the failure we look for
                    pytest.fail(f"transaction {wp} was forgotten")
        for tid, epoch in acks.epochs.items():
            for old in range(max(0, epoch - 3), epoch):
                with pytest.raises(ProducerFenced):
                    m.begin(transactional_id=tid, epoch=old)
        assert m.state() == state
        return state.last_write_pointer


@pytest.mark.slow
def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(98)
    acks = Acks()
    last = 0
    started = time.monotonic()
    for round_ in range(ROUNDS):
        lines = run_child_and_kill(tmp_path, round_, rng)
        begun_before = len(acks.begun)
        for line in lines:
            acks.add(line)
        new = acks.begun[begun_before:]
        assert len(new) > 50, "the child did too little work to test anything"
        assert min(new) > last, "a pointer from before the restart was handed out again"
        assert acks.committed and acks.aborted
        last = verify(tmp_path, acks)
    assert time.monotonic() - started < 20


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]))

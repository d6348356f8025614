"""Latency of one small durable commit, by the ways a store could make it durable.

The question behind it (issue 4, W3): would a write-ahead log in front of LMDB, fsynced
in parallel with LMDB's data pages while LMDB skips its meta-page flush, make a commit
cheaper than LMDB's own two flushes? Cases, each a loop of one-row commits:

- ``log``: one pwrite of 200 B + fdatasync on a preallocated file (the one-flush floor)
- ``lmdb``: an LMDB commit as the store makes it (data pages flushed, then the meta page)
- ``lmdb-writemap``: the same with ``MDB_WRITEMAP`` (pages written through the map and
  flushed with msync instead of write + fdatasync)
- ``lmdb-nometasync``: LMDB skipping the meta-page flush (not durable on its own)
- ``lmdb-nometasync+log``: that, plus a 200 B log write + fdatasync on another thread,
  started with the commit and waited for after it (the write-ahead-log design)

Prints p50/p99/p99.9/max per case; rounds interleave the cases, since these machines'
disks drift from minute to minute.

    python -m benchmarks.commit_paths --commits 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable

import lmdb

CASES = ["log", "lmdb", "lmdb-writemap", "lmdb-nometasync", "lmdb-nometasync+log"]


class _Log:
    """A preallocated file written 4 KiB apart and flushed, in a thread or inline."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self.fd, 64 << 20)
        os.fsync(self.fd)
        self.offset = 0
        self._go = threading.Event()
        self._done = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def write(self) -> None:
        os.pwrite(self.fd, b"r" * 200, self.offset)
        os.fdatasync(self.fd)
        self.offset = (self.offset + 4096) % (64 << 20)

    def start_background(self) -> None:
        def run() -> None:
            while True:
                self._go.wait()
                self._go.clear()
                if self._stop:
                    return
                self.write()
                self._done.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def begin(self) -> None:
        self._go.set()

    def wait(self) -> None:
        self._done.wait()
        self._done.clear()

    def close(self) -> None:
        if self._thread is not None:
            self._stop = True
            self._go.set()
            self._thread.join()
        os.close(self.fd)


def run_case(case: str, commits: int, where: str | None) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="tidings-bench-", dir=where) as tmp:
        log = _Log(os.path.join(tmp, "log"))
        env = None
        if case != "log":
            env = lmdb.open(
                os.path.join(tmp, "db"),
                map_size=1 << 30,
                max_dbs=2,
                metasync=case in ("lmdb", "lmdb-writemap"),
                writemap=case == "lmdb-writemap",
            )
        parallel = case.endswith("+log")
        if parallel:
            log.start_background()
        step: Callable[[int], None]
        if env is None:

            def step(i: int) -> None:
                log.write()

        else:
            db = env.open_db(b"messages")

            def step(i: int) -> None:
                if parallel:
                    log.begin()
                with env.begin(write=True, db=db) as txn:
                    txn.put(i.to_bytes(8, "big"), b"v" * 100)
                if parallel:
                    log.wait()

        latencies = []
        for i in range(commits):
            started = time.perf_counter()
            step(i)
            latencies.append(time.perf_counter() - started)
        log.close()
        if env is not None:
            env.close()
        return latencies


def _summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    n = len(ordered)

    def at(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] * 1e3

    return (
        f"p50 {at(0.5):.3f} ms  p99 {at(0.99):.3f} ms  p99.9 {at(0.999):.3f} ms  "
        f"max {ordered[-1] * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=3000, help="commits per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the files go (default: temp dir)")
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    args = parser.parse_args()
    for r in range(args.rounds):
        for case in args.cases:
            print(f"round {r + 1}  {case:22s} {_summary(run_case(case, args.commits, args.dir))}")


if __name__ == "__main__":
    main()

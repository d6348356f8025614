"""Sizing a layout Tidings does not use: one stored row per publish batch.

Today every message is one row of the Message Table (docs/design.md). This measures,
on LMDB directly and in one process, what storing a batch of 500 messages as one row
(a count, the payloads' offsets, the payloads) would save, on both sides:

- write: 500 puts and a durable commit, against one put of the same bytes and a
  durable commit, ``--commits`` times each (median ms per batch);
- read: a page of 10,000 messages turned into a columnar poll body by
  ``MessagingService.fetch_columns`` (10,000 rows, as today), against reading 20 batch
  rows into the id and payload blocks such a body is made of (µs per message).

Not measured: what the rest of the system would need (transactional visibility, keys,
headers and per-message expiry inside a batch row, groups, queues, retention).

    python -m benchmarks.batch_rows [--commits 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import tempfile
import time
from array import array
from collections.abc import Callable
from typing import Any

import lmdb

from tidings.messaging import MessagingService
from tidings.store import LmdbStore

BATCH = 500
PAGE = 10_000
_KEY = struct.Struct(">QH")  # publish_ts | seq of a row's first message
_ID = struct.Struct(">QHQH")


def _batch_value(payloads: list[bytes]) -> bytes:
    offsets = array("i", [0])
    for payload in payloads:
        offsets.append(offsets[-1] + len(payload))
    return struct.pack(">H", len(payloads)) + offsets.tobytes() + b"".join(payloads)


def _write_ms(env: lmdb.Environment, payloads: list[bytes], commits: int, as_one: bool) -> float:
    """Median ms of one batch written and committed (durably: the env syncs)."""
    times = []
    ts = time.time_ns() // 1_000_000
    value = _batch_value(payloads)
    for i in range(commits):
        started = time.perf_counter()
        with env.begin(write=True) as txn:
            if as_one:
                txn.put(_KEY.pack(ts + i, 0), value, append=True)
            else:
                for seq, payload in enumerate(payloads):
                    txn.put(_KEY.pack(ts + i, seq), payload, append=True)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _read_batch_rows(env: lmdb.Environment) -> tuple[list[bytes], list[bytes], list[Any]]:
    """The id block, payload block and offsets of every batch row."""
    ids, payloads, offsets = [], [], []
    with env.begin(buffers=True) as txn:
        for key, value in txn.cursor():
            ts, first = _KEY.unpack(key)
            (count,) = struct.unpack_from(">H", value)
            ids.append(b"".join(_ID.pack(ts, first + i, 0, 0) for i in range(count)))
            end = 2 + 4 * (count + 1)
            offsets.append(array("i", bytes(value[2:end])))
            payloads.append(bytes(value[end:]))
    return ids, payloads, offsets


def _best_us(fn: Callable[[], Any], repeat: int = 7, rounds: int = 10) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - started) / rounds)
    return best / PAGE * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    payloads = [os.urandom(100) for _ in range(BATCH)]
    with tempfile.TemporaryDirectory() as where:
        service = MessagingService(LmdbStore(os.path.join(where, "service")))
        service.create_topic("bench", "t")
        for _ in range(PAGE // BATCH):
            service.publish("bench", "t", payloads)
        batch_env = lmdb.open(os.path.join(where, "batches"), map_size=1 << 30)
        with batch_env.begin(write=True) as txn:
            for i in range(PAGE // BATCH):
                txn.put(_KEY.pack(i, 0), _batch_value(payloads))
        assert service.fetch_columns("bench", "t", limit=PAGE)[1] == PAGE
        assert sum(len(o) - 1 for o in _read_batch_rows(batch_env)[2]) == PAGE
        for r in range(args.rounds):
            rows_env = lmdb.open(os.path.join(where, f"rows{r}"), map_size=1 << 30)
            one_env = lmdb.open(os.path.join(where, f"one{r}"), map_size=1 << 30)
            rows_ms = _write_ms(rows_env, payloads, args.commits, as_one=False)
            one_ms = _write_ms(one_env, payloads, args.commits, as_one=True)
            rows_env.close()
            one_env.close()
            read_rows = _best_us(lambda: service.fetch_columns("bench", "t", limit=PAGE))
            read_batches = _best_us(lambda: _read_batch_rows(batch_env))
            print(
                f"round {r + 1}: write 500 x 100 B, durable: {rows_ms:.3f} ms as 500 rows, "
                f"{one_ms:.3f} ms as one row; read a page: {read_rows:.3f} us/msg from "
                f"rows (fetch_columns), {read_batches:.3f} us/msg from batch rows"
            )
        batch_env.close()
        service.close()


if __name__ == "__main__":
    main()

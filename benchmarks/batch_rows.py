"""One stored row per publish batch (docs/design.md, "Batch entries"), sized on both sides.

What storing a batch of 500 messages as one row saves, in one process:

- write, on LMDB directly: 500 puts and a durable commit, against one put of the same
  bytes and a durable commit, ``--commits`` times each (median ms per batch);
- read: a page of 10,000 messages turned into a columnar poll body by
  ``MessagingService.fetch_columns``, from a topic of 10,000 rows (as before batch
  entries) and from one of 20 batch entries; and, as the floor, reading 20 rows of
  LMDB directly into the id and payload blocks such a body is made of, without making
  the body (µs per message).

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
from typing import Any

import lmdb

from benchmarks.poll_media import PAGE, _best
from tidings.messaging import MessagingService
from tidings.store import LmdbStore

BATCH = 500
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    payloads = [os.urandom(100) for _ in range(BATCH)]
    with tempfile.TemporaryDirectory() as where:
        service = MessagingService(LmdbStore(os.path.join(where, "service")))
        service.create_topic("bench", "t")
        service.create_topic("bench", "rows")
        for _ in range(PAGE // BATCH):
            service.publish("bench", "t", payloads)  # one batch entry each
        for payload in payloads * (PAGE // BATCH):
            service.publish("bench", "rows", [payload])  # a row each
        batch_env = lmdb.open(os.path.join(where, "batches"), map_size=1 << 30)
        with batch_env.begin(write=True) as txn:
            for i in range(PAGE // BATCH):
                txn.put(_KEY.pack(i, 0), _batch_value(payloads))
        assert service.fetch_columns("bench", "t", limit=PAGE)[1] == PAGE
        assert service.fetch_columns("bench", "rows", limit=PAGE)[1] == PAGE
        assert sum(len(o) - 1 for o in _read_batch_rows(batch_env)[2]) == PAGE
        for r in range(args.rounds):
            rows_env = lmdb.open(os.path.join(where, f"rows{r}"), map_size=1 << 30)
            one_env = lmdb.open(os.path.join(where, f"one{r}"), map_size=1 << 30)
            rows_ms = _write_ms(rows_env, payloads, args.commits, as_one=False)
            one_ms = _write_ms(one_env, payloads, args.commits, as_one=True)
            rows_env.close()
            one_env.close()
            read_rows = _best(lambda: service.fetch_columns("bench", "rows", limit=PAGE), 7, 10)
            read_entries = _best(lambda: service.fetch_columns("bench", "t", limit=PAGE), 7, 10)
            read_raw = _best(lambda: _read_batch_rows(batch_env), 7, 10)
            print(
                f"round {r + 1}: write 500 x 100 B, durable: {rows_ms:.3f} ms as 500 rows, "
                f"{one_ms:.3f} ms as one row; read a page (us/msg): fetch_columns "
                f"{read_rows:.3f} from rows, {read_entries:.3f} from batch entries; "
                f"{read_raw:.3f} from batch rows on LMDB, without a body"
            )
        batch_env.close()
        service.close()


if __name__ == "__main__":
    main()

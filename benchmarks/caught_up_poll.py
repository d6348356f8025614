"""What a caught-up poll costs, and what part of it is reading the store.

A consumer that is caught up polls from the last id it saw and gets the few messages
published since (0, 1 or 10 here). The issue behind the server asked for an in-memory
cache of recent messages so that such polls are served without reading the store; this
measures what such a cache could save before building one:

- ``fetch lmdb``: the poll's whole fetch as the server runs it (``fetch_encoded``, Avro),
  over the LMDB store;
- ``fetch memory``: the same over the in-memory store (sorted lists and dicts, no LMDB):
  the fetch a perfect cache would leave;
- ``store reads``: only the LMDB part of the first: a read snapshot, two point reads
  (the server reads the topic's state and the entry the start id names) and the scan
  of the new rows;
- ``list bisect``: what a cache would do instead of that scan: find the start in a
  sorted Python list of the recent keys and slice the rows after it.

Rounds interleave the cases, since these machines' speed drifts. Prints microseconds
per poll (median of the rounds).

    python -m benchmarks.caught_up_poll
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import tempfile
import time
from collections.abc import Callable

from tidings.codec import keys, values
from tidings.codec.wire import Media
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import MemoryStore, Store
from tidings.store.backends.lmdb import LmdbStore
from tidings.structs import MessageId

NS, TOPIC = "bench", "tail"


def _service(store: Store, backlog: int) -> tuple[MessagingService, list[MessageId]]:
    service = MessagingService(store, MessagingConfig())
    service.create_topic(NS, TOPIC)
    for _ in range(backlog // 500):
        service.publish(NS, TOPIC, [b"x" * 100] * 500)
    ids = service.fetch_ids(NS, TOPIC, limit=10_000)
    return service, ids


def _per_call(fn: Callable[[], object], calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="polls per case and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=10_000, help="messages in the topic")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tidings-bench-") as tmp:
        lmdb_store = LmdbStore(tmp, sync=False)
        on_lmdb, ids = _service(lmdb_store, args.backlog)
        on_memory, memory_ids = _service(MemoryStore(), args.backlog)
        record_key = keys.topic_record_key(NS, TOPIC)
        with lmdb_store.read() as view:
            raw = view.get("metadata", record_key)
            assert raw is not None
            topic_id, _ = values.decode_topic_record(raw)
            prefix, stop = keys.generation_range(topic_id, 1)
            rows = list(view.scan("messages", prefix, stop))
        recent_keys = [k for k, _ in rows]
        state_key = keys.state_key(topic_id)

        cases: dict[str, Callable[[int], Callable[[], object]]] = {}

        def fetch(
            service: MessagingService, ids_: list[MessageId]
        ) -> Callable[[int], Callable[[], object]]:
            def make(new: int) -> Callable[[], object]:
                start = ids_[-1 - new]
                return lambda: service.fetch_encoded(
                    NS, TOPIC, Media.AVRO, start=start, inclusive=False, limit=500
                )

            return make

        def store_reads(new: int) -> Callable[[], object]:
            first = prefix + recent_keys[-1 - new][8:18] + b"\0"

            def run() -> object:
                with lmdb_store.read() as view:
                    view.get("metadata", record_key)
                    view.get("metadata", state_key)
                    return list(view.scan("messages", first, stop))

            return run

        def list_bisect(new: int) -> Callable[[], object]:
            after = recent_keys[-1 - new]
            return lambda: rows[bisect.bisect_right(recent_keys, after) :][:500]

        cases["fetch lmdb"] = fetch(on_lmdb, ids)
        cases["fetch memory"] = fetch(on_memory, memory_ids)
        cases["store reads"] = store_reads
        cases["list bisect"] = list_bisect

        results: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for new in (0, 1, 10):
                for name, make in cases.items():
                    fn = make(new)
                    fn()
                    results.setdefault((name, new), []).append(_per_call(fn, args.calls))
        print(f"us per caught-up poll, median of {args.rounds} rounds of {args.calls:,}")
        print(f"{'':14s}" + "".join(f"{f'{n} new':>10s}" for n in (0, 1, 10)))
        for name in cases:
            cells = "".join(f"{statistics.median(results[(name, n)]):10.1f}" for n in (0, 1, 10))
            print(f"{name:14s}{cells}")
        on_lmdb.close()
        on_memory.close()
        lmdb_store.close()


if __name__ == "__main__":
    main()

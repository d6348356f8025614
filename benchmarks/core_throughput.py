"""Throughput of the messaging core without HTTP: publish, then fetch.

Publishes ``--batches`` batches of ``--batch`` messages of ``--size`` bytes to one topic
(sequentially, and from ``--threads`` threads at once so the store can group-commit),
then fetches everything back in pages of the maximum limit. Prints messages/s.

    python benchmarks/core_throughput.py                  # LMDB in a temp dir, fsync on
    python benchmarks/core_throughput.py --store memory
    python benchmarks/core_throughput.py --no-sync        # LMDB without fsync
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable

from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import MemoryStore, Store


def _open(kind: str, path: str, sync: bool) -> Store:
    if kind == "memory":
        return MemoryStore()
    from tidings.store.backends.lmdb import LmdbStore

    return LmdbStore(path, sync=sync)


def _timed(label: str, messages: int, size: int, fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    seconds = time.perf_counter() - began
    rate = messages / seconds
    print(
        f"{label:<34} {messages:>9,} msgs in {seconds:6.2f} s  "
        f"{rate:>11,.0f} msg/s  {rate * size / 1e6:7.1f} MB/s"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["lmdb", "memory"], default="lmdb")
    parser.add_argument("--no-sync", action="store_true", help="LMDB without fsync")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()

    batch = [os.urandom(args.size) for _ in range(args.batch)]
    total = args.batches * args.batch
    config = MessagingConfig(fetch_max_limit=10_000)
    with tempfile.TemporaryDirectory(prefix="tidings-bench-") as tmp:
        store = _open(args.store, tmp, sync=not args.no_sync)
        service = MessagingService(store, config)
        service.create_topic("bench", "seq")
        service.create_topic("bench", "par")
        fsync = "off" if args.no_sync or args.store == "memory" else "on"
        print(
            f"store={args.store} fsync={fsync} batch={args.batch} x {args.size} B, "
            f"{args.batches} batches, {os.cpu_count()} cpus"
        )

        def sequential() -> None:
            for _ in range(args.batches):
                service.publish("bench", "seq", batch)

        def parallel() -> None:
            per_thread = args.batches // args.threads

            def worker() -> None:
                for _ in range(per_thread):
                    service.publish("bench", "par", batch)

            threads = [threading.Thread(target=worker) for _ in range(args.threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        def pipelined() -> None:
            futures = [service.publish_future("bench", "par", batch) for _ in range(args.batches)]
            for f in futures:
                f.result()

        def fetch_all(topic: str, expected: int) -> Callable[[], None]:
            def run() -> None:
                got = 0
                start = None
                while True:
                    page = service.fetch("bench", topic, start=start, inclusive=False, limit=10_000)
                    if not page:
                        break
                    got += len(page)
                    start = page[-1].id
                assert got == expected, (got, expected)

            return run

        _timed("publish, 1 thread (sync each)", total, args.size, sequential)
        per = (args.batches // args.threads) * args.threads * args.batch
        _timed(f"publish, {args.threads} threads", per, args.size, parallel)
        _timed("publish_future, pipelined", total, args.size, pipelined)
        _timed("fetch (pages of 10,000)", total, args.size, fetch_all("seq", total))
        _timed("fetch again (warm)", per + total, args.size, fetch_all("par", per + total))
        service.close()
        store.close()


if __name__ == "__main__":
    main()

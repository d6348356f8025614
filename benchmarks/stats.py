"""Topic stats at 10 messages and at 10,000,000: the same cost (issue: topic stats
without scanning the topic).

    python -m benchmarks.stats [--large 10000000] [--calls 200]

Fills two topics of one data directory through ``MessagingService`` on the LMDB store
directly (100 B payloads, batches of 10,000, no fsync: filling is not what is measured),
then starts a real ``tidings serve`` on that directory and times
``GET /v1/namespaces/default/topics/{t}/stats`` over one kept-alive connection: the
median and p99 of ``--calls`` calls per topic, interleaved. ``--scan`` also times, once,
the count the stats call made before (reading the topic page by page), for comparison.
Every loop is bounded in count; the server listens on 127.0.0.1 and is stopped at the
end, and the data directory is removed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.workloads import Server
from tidings.messaging import MessagingService
from tidings.store.backends.lmdb import LmdbStore
from tidings.structs import MessageId

NAMESPACE = "default"
BATCH = 10_000
PAYLOAD = b"x" * 100


def fill(store_dir: Path, topics: dict[str, int], scan: bool) -> float | None:
    """Publish ``topics[name]`` messages to each topic; with ``scan``, the seconds the
    former stats count (a read of the whole largest topic) takes."""
    store = LmdbStore(store_dir, sync=False)
    service = MessagingService(store)
    try:
        for topic, count in topics.items():
            service.create_topic(NAMESPACE, topic)
            pending = []
            for start in range(0, count, BATCH):
                batch = [PAYLOAD] * min(BATCH, count - start)
                pending.append(service.publish_future(NAMESPACE, topic, batch))
                if len(pending) >= 16:  # bounded in flight
                    pending.pop(0).result()
            for future in pending:
                future.result()
        if not scan:
            return None
        return _scan(service, max(topics, key=topics.__getitem__))
    finally:
        service.close()
        store.close()


def _scan(service: MessagingService, topic: str) -> float:
    began = time.perf_counter()
    count = size = 0
    start: MessageId | None = None
    while page := service.fetch(NAMESPACE, topic, start=start, inclusive=False, limit=10_000):
        count += len(page)
        size += sum(len(m.payload) for m in page)
        start = page[-1].id
    return time.perf_counter() - began


def time_stats(url: str, topics: dict[str, int], calls: int) -> dict[str, list[float]]:
    """Seconds per stats call, per topic, interleaved; checks each answer's count."""
    times: dict[str, list[float]] = {topic: [] for topic in topics}
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(calls):
            for topic, count in topics.items():
                began = time.perf_counter()
                response = client.get(f"/v1/namespaces/{NAMESPACE}/topics/{topic}/stats")
                times[topic].append(time.perf_counter() - began)
                response.raise_for_status()
                body = response.json()
                assert body["messageCount"] == count, (topic, body["messageCount"])
                assert body["bytes"] == count * len(PAYLOAD), (topic, body["bytes"])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--scan", action="store_true", help="also time the former count")
    args = parser.parse_args()
    topics = {"small": args.small, "large": args.large}
    root = Path(tempfile.mkdtemp(prefix="tidings-bench-stats-"))
    try:
        began = time.perf_counter()
        scanned = fill(root / "data" / "store", topics, args.scan)
        print(f"filled {args.small:,} + {args.large:,} messages "
              f"in {time.perf_counter() - began:.1f} s")  # fmt: skip
        server = Server([], data_dir=root / "data", start_timeout=60)  # a big store opens slowly
        try:
            times = time_stats(server.url, topics, args.calls)
        finally:
            server.stop()
        for topic, count in topics.items():
            ms = sorted(t * 1000 for t in times[topic])
            p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
            print(f"stats, {count:>12,} messages: median {statistics.median(ms):.3f} ms, "
                  f"p99 {p99:.3f} ms ({len(ms)} calls)")  # fmt: skip
        if scanned is not None:
            print(f"former count (reading the {args.large:,}-message topic): {scanned:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

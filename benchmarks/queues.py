"""Queues: 4 workers popping and acking, a transactional worker, pop-to-ack latency,
and the ack state with many messages in flight (issue: queues, benchmarks).

    python -m benchmarks.queues [--messages 200000] [--large 1000000]

100 B messages published in batches of 500. Each worker of the throughput figure is a
process of its own (a worker is one application instance) with the async client,
popping 100 and acking them, round after round; the figure is messages over the time
from the first worker's start to the last worker's end. The transactional worker pops
100, publishes 100 results and acks the 100 in one transaction. The latency figure
offers 1,000 msg/s (10 every 10 ms) to one worker that pops with a long-poll and acks
each batch at once: publish-to-pop and pop-to-ack, p50 and p99. The ack-state figure
pops ``--large`` messages in batches of 1,000, acks 90 % at once and holds a random 10 %
(the out-of-order acks), then acks those: the server's ack state (lease entries) and
resident memory at the peak and after. Bounded in count and time. With ``--prefetch``
the workers' queue handles fetch the next pop ahead (``client.queue(..., prefetch=True)``).
The last throughput figure runs the 4 workers with each pop carrying the acks of the
batch before (``pop(100, ack=batch)``): one request per round instead of two.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import statistics
import threading
import time
import uuid
from pathlib import Path

from benchmarks.workloads import Server
from tidings import AsyncClient, Client

PAYLOAD = b"x" * 100


def _fill(url: str, topic: str, messages: int) -> None:
    with Client(url) as client:
        client.create_topic(topic)
        for start in range(0, messages, 500):
            client.publish(topic, [PAYLOAD] * min(500, messages - start))


def _worker(
    url: str, topic: str, queue: str, out: mp.Queue, prefetch: bool, ack_with_pop: bool
) -> None:
    async def run() -> int:
        count = 0
        async with AsyncClient(url) as client:
            q = client.queue(topic, queue, prefetch=prefetch)
            if ack_with_pop:
                # One request per round: each pop carries the previous batch's acks.
                batch = await q.pop(100)
                while batch:
                    count += len(batch)
                    batch = await q.pop(100, ack=batch)
                return count
            while batch := await q.pop(100):
                await q.ack(batch)
                count += len(batch)
        return count

    started = time.monotonic()
    count = asyncio.run(run())
    out.put((started, time.monotonic(), count))


def workers_rate(
    url: str, topic: str, workers: int, prefetch: bool = False, ack_with_pop: bool = False
) -> float:
    queue = f"q-{uuid.uuid4().hex[:6]}"
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, topic, queue, out, prefetch, ack_with_pop))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = sum(r[2] for r in results)
    return total / (max(r[1] for r in results) - min(r[0] for r in results))


def transactional_rate(url: str, topic: str, messages: int, prefetch: bool = False) -> float:
    target = topic + "-results"
    with Client(url) as client:
        client.create_topic(target)
        q = client.queue(topic, "tx-worker", prefetch=prefetch)
        done = 0
        started = time.monotonic()
        while batch := q.pop(100):
            with client.transaction() as tx:
                tx.publish(target, [m.payload for m in batch])
                q.ack(batch, transaction=tx)
            done += len(batch)
        elapsed = time.monotonic() - started
    assert done == messages, done
    return done / elapsed


def latency(url: str, seconds: float) -> tuple[list[float], list[float]]:
    topic = f"lat-{uuid.uuid4().hex[:6]}"
    with Client(url) as client:
        client.create_topic(topic)
    sent: dict[bytes, float] = {}
    stop = threading.Event()

    def offer() -> None:
        with Client(url) as client:
            n = 0
            next_at = time.monotonic()
            end = next_at + seconds
            while next_at < end:
                batch = [f"{n + i}".encode() for i in range(10)]
                now = time.monotonic()
                for payload in batch:
                    sent[payload] = now
                client.publish(topic, batch)
                n += 10
                next_at += 0.01
                time.sleep(max(0.0, next_at - time.monotonic()))
        stop.set()

    to_pop: list[float] = []
    to_ack: list[float] = []
    publisher = threading.Thread(target=offer)
    with Client(url) as client:
        q = client.queue(topic, "lat")
        publisher.start()
        while not stop.is_set() or len(to_pop) < len(sent):
            batch = q.pop(100, wait=0.5)
            popped = time.monotonic()
            if not batch:
                if stop.is_set():
                    break
                continue
            q.ack(batch)
            acked = time.monotonic()
            for m in batch:
                to_pop.append(popped - sent[m.payload])
                to_ack.append(acked - popped)
    publisher.join()
    return to_pop, to_ack


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def ack_state(server: Server, messages: int) -> None:
    topic = f"ack-{uuid.uuid4().hex[:6]}"
    _fill(server.url, topic, messages)
    rng = random.Random(7)
    rss_before = _rss(server.proc.pid)
    with Client(server.url) as client:
        q = client.queue(topic, "state", ack_timeout=3600)
        held = []
        started = time.monotonic()
        while batch := q.pop(1000):
            late = set(rng.sample(range(len(batch)), len(batch) // 10))
            q.ack([m for i, m in enumerate(batch) if i not in late])
            held.extend(m for i, m in enumerate(batch) if i in late)
        elapsed = time.monotonic() - started
        peak = client.describe_queue(topic, "state")
        rss_peak = _rss(server.proc.pid)
        for i in range(0, len(held), 1000):
            q.ack(held[i : i + 1000])
        after = client.describe_queue(topic, "state")
        rss_after = _rss(server.proc.pid)
    print(
        f"ack state, {messages:,} messages, 10 % acked late: {elapsed:.1f} s to pop all "
        f"({messages / elapsed:,.0f} msg/s with 1,000 per pop)"
    )
    mib = 2**20
    print(f"  at the peak: {peak.ack_state:,} lease entries, server RSS "
          f"{rss_peak / mib:,.0f} MiB (before the test: {rss_before / mib:,.0f} MiB)")  # fmt: skip
    print(
        f"  all acked:   {after.ack_state:,} lease entries, server RSS "
        f"{rss_after / mib:,.0f} MiB; cursor at the end: {after.cursor == after.read}"
    )


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument(
        "--prefetch", action="store_true", help="the workers' handles fetch the next pop ahead"
    )
    args = parser.parse_args()
    server = Server([])
    try:
        topic = f"queues-{uuid.uuid4().hex[:6]}"
        _fill(server.url, topic, args.messages)
        for workers in (1, 4):
            rates = [
                workers_rate(server.url, topic, workers, args.prefetch) for _ in range(args.rounds)
            ]
            print(f"{workers} worker(s), pop 100 + ack: {statistics.median(rates):>10,.0f} msg/s"
                  f"   ({', '.join(f'{r:,.0f}' for r in rates)})")  # fmt: skip
        rates = [
            workers_rate(server.url, topic, 4, args.prefetch, ack_with_pop=True)
            for _ in range(args.rounds)
        ]
        print(f"4 workers, pop 100 carrying the last batch's ack: "
              f"{statistics.median(rates):>10,.0f} msg/s"
              f"   ({', '.join(f'{r:,.0f}' for r in rates)})")  # fmt: skip
        rate = transactional_rate(server.url, topic, args.messages, args.prefetch)
        print(f"transactional worker, 100 per transaction: {rate:,.0f} msg/s")
        to_pop, to_ack = latency(server.url, args.latency_seconds)
        print(f"1,000 msg/s offered, {len(to_pop):,} messages: publish->pop p50 "
              f"{_p(to_pop, 0.5):.2f} ms p99 {_p(to_pop, 0.99):.2f} ms; pop->ack p50 "
              f"{_p(to_ack, 0.5):.2f} ms p99 {_p(to_ack, 0.99):.2f} ms")  # fmt: skip
        if args.large:
            ack_state(server, args.large)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

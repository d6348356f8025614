"""Consumer groups: aggregate read rate with 1, 2 and 4 members, and an exactly-once
copier through a group (issue: consumer groups, benchmarks).

    python -m benchmarks.groups [--messages 200000] [--rounds 2]

W2's data (100 B messages, published in batches of 500) with keys spread over 1,000
values. Each member runs in a process of its own (a group member is one application
instance) with the async client, pages of 10,000; the figure is messages over the time
from the first member's start to the last member's end. The plain consumer of the
same topic is measured the same way for the ratio. The copier consumes through a group
in batches of 500 and publishes each batch to another topic in a transaction that also
commits the group's position, one transaction at a time. Bounded in count and time.

The topic is read once, untimed, before the first round: the first read after the
writes maps the store's pages into the server, and would slow round 1's first reader.
The ratio of 4 members to the plain consumer is printed from the medians and for each
round on its own.

The server keeps the pages group members scanned for a few seconds, for any group of
the topic; so that each figure is a read of the topic from the store, every group
configuration (and the copier) starts after those pages expired (``--warm`` skips the
wait: later configurations then read what earlier ones left in memory).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
import uuid

from benchmarks.workloads import Server, context_switches, cpu_seconds
from tidings import AsyncClient, Client, Record

#: How long the server keeps a group's pages (tidings.consumers.pages.PAGE_LIFETIME),
#: plus a margin; written here so that the benchmark runs against older servers too.
_PAGES_EXPIRE = 10.0 + 1.0


def _fill(url: str, topic: str, messages: int) -> None:
    payload = b"x" * 100
    with Client(url) as client:
        client.create_topic(topic)
        for start in range(0, messages, 500):
            n = min(500, messages - start)
            client.publish(
                topic, [Record(payload, f"k{(start + i) % 1000}".encode()) for i in range(n)]
            )


def _member(url: str, topic: str, group: str | None, members: int, out: mp.Queue) -> None:
    async def run() -> int:
        count = 0
        async with AsyncClient(url) as client:
            if group is None:
                consumer = client.consume(topic, follow=False, batch_size=10_000)
                while page := await consumer.poll():
                    count += len(page)
                return count
            member = client.consume(
                topic, group=group, follow=False, batch_size=10_000, partitions=32
            )
            # Wait until every member has joined, so that the split is final.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assignment = await member.heartbeat()
                if len(assignment.partitions) <= -(-32 // members):
                    break
                await asyncio.sleep(0.05)
            out.put(("ready", time.monotonic()))
            while page := await member.poll():
                count += len(page)
            # Committed before leaving: the partitions it leaves to the others start
            # where it stopped, not at the group's start (read again, and counted).
            await member.commit()
            await member.close()
            return count

    started = time.monotonic()
    count = asyncio.run(run())
    out.put(("done", started, time.monotonic(), count))


def consume_rate(url: str, topic: str, members: int, grouped: bool) -> float:
    group = f"g-{uuid.uuid4().hex[:6]}" if grouped else None
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_member, args=(url, topic, group, members, out)) for _ in range(members)
    ]
    for p in procs:
        p.start()
    results = []
    readies = []
    while len(results) < members:
        item = out.get(timeout=600)
        if item[0] == "ready":
            readies.append(item[1])
        else:
            results.append(item)
    for p in procs:
        p.join()
    total = sum(r[3] for r in results)
    begin = max(readies) if readies else min(r[1] for r in results)
    end = max(r[2] for r in results)
    return total / (end - begin)


def copier_rate(url: str, source: str, messages: int) -> float:
    run = uuid.uuid4().hex[:6]  # a fresh output topic and group on each call
    target = f"{source}-copy-{run}"
    with Client(url) as client:
        client.create_topic(target)
        consumer = client.consume(source, group=f"copier-{run}", batch_size=500, follow=False)
        copied = 0
        started = time.monotonic()
        while page := consumer.poll():
            with client.transaction() as tx:
                tx.publish(target, [Record(m.payload, m.key) for m in page])
                consumer.commit(transaction=tx)
            copied += len(page)
        elapsed = time.monotonic() - started
        consumer.close()
    assert copied == messages, copied
    return copied / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="do not wait for pages to expire")
    parser.add_argument(
        "--copier-only", action="store_true", help="only the copier, once per round"
    )
    args = parser.parse_args()
    server = Server([])
    try:
        topic = f"groups-{uuid.uuid4().hex[:6]}"
        _fill(server.url, topic, args.messages)
        figures: dict[str, list[float]] = {}
        if not args.copier_only:
            # Untimed: the first read of a topic after it was written maps the store's
            # pages into the server, which would count against round 1's first reader.
            consume_rate(server.url, topic, 1, False)
        for _ in range(0 if args.copier_only else args.rounds):
            for name, members, grouped in (
                ("plain consumer", 1, False),
                ("group, 1 member", 1, True),
                ("group, 2 members", 2, True),
                ("group, 4 members", 4, True),
            ):
                if grouped and not args.warm:
                    time.sleep(_PAGES_EXPIRE)
                rate = consume_rate(server.url, topic, members, grouped)
                figures.setdefault(name, []).append(rate)
        for name, rates in figures.items():
            print(f"{name:<20} {statistics.median(rates):>12,.0f} msg/s   "
                  f"({', '.join(f'{r:,.0f}' for r in rates)})")  # fmt: skip
        if figures:
            plain = statistics.median(figures["plain consumer"])
            four = statistics.median(figures["group, 4 members"])
            # Each round's own ratio too: the machine's speed drifts between rounds.
            pairs = zip(figures["group, 4 members"], figures["plain consumer"], strict=True)
            rounds = [f / p for f, p in pairs]
            print(
                f"4 members / plain consumer: {four / plain:.2f} (each round: "
                f"{', '.join(f'{r:.2f}' for r in rounds)}; median {statistics.median(rounds):.2f})"
            )
        for _ in range(args.rounds if args.copier_only else 1):
            if not args.warm:
                time.sleep(_PAGES_EXPIRE)
            cpu, switches = cpu_seconds(server.proc.pid), context_switches(server.proc.pid)
            rate = copier_rate(server.url, topic, args.messages)
            transactions = args.messages / 500
            per_tx = (cpu_seconds(server.proc.pid) - cpu) / transactions * 1000
            switched = (context_switches(server.proc.pid) - switches) / transactions
            print(f"exactly-once copier, 500 per transaction: {rate:,.0f} msg/s "
                  f"(server CPU {per_tx:.1f} ms and {switched:.0f} context switches "
                  "per transaction)")  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()

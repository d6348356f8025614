"""W1 and W2 one request at a time: where the CPU of each request goes.

The W1 and W2 shapes of ``benchmarks.vs_postgres`` against one ``tidings serve``: the
sync client publishes batches of 500, each acknowledged before the next, then a
consumer reads them all back in pages of 10,000 (in this process, so its CPU is
counted). Printed beside the rates, the time split the other benchmarks do not print:
the client's CPU and the server's, user and system (kernel) apart, read from /proc,
per published batch and per message read. The kernel's share is where memory that is
faulted in afresh for each request shows (docs/operations.md, "Performance notes").

    python -m benchmarks.request_cpu [--messages 200000] [--size 1024] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.workloads import Server, user_system_seconds
from tidings import Client

BATCH = 500
PAGE = 10_000


def run(messages: int, size: int) -> None:
    server = Server([])
    try:
        with Client(server.url, timeout=60) as client:
            client.create_topic("w1")
            batch = [os.urandom(size)] * BATCH
            for _ in range(20):  # connections, the first pages of the store
                client.publish("w1", batch)
            batches = messages // BATCH
            user0, sys0 = user_system_seconds(server.proc.pid)
            own0 = time.process_time()
            started = time.perf_counter()
            each: list[float] = []
            for _ in range(batches):
                sent = time.perf_counter()
                client.publish("w1", batch)
                each.append(time.perf_counter() - sent)
            elapsed = time.perf_counter() - started
            own = (time.process_time() - own0) / batches * 1e3
            user1, sys1 = user_system_seconds(server.proc.pid)
            user, system = (user1 - user0) / batches * 1e3, (sys1 - sys0) / batches * 1e3
            print(
                f"publish {messages:,} x {size} B: {batches * BATCH / elapsed:,.0f} msg/s, "
                f"p50 {statistics.median(each) * 1e3:.2f} ms per batch; "
                f"client CPU {own:.2f} ms, server CPU {user + system:.2f} ms "
                f"(user {user:.2f}, system {system:.2f}) per batch"
            )
            own0 = time.process_time()
            started = time.perf_counter()
            consumer = client.consume(
                "w1", "earliest", transactional=True, follow=False, batch_size=PAGE
            )
            read = sum(1 for _ in consumer)
            consumer.close()
            elapsed = time.perf_counter() - started
            own = (time.process_time() - own0) / read * 1e6
            user2, sys2 = user_system_seconds(server.proc.pid)
    finally:
        server.stop()
    user, system = (user2 - user1) / read * 1e6, (sys2 - sys1) / read * 1e6
    print(
        f"read {read:,} in pages of {PAGE:,}: {read / elapsed:,.0f} msg/s; "
        f"client CPU {own:.2f} us, server CPU {user + system:.2f} us "
        f"(user {user:.2f}, system {system:.2f}) per message"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.rounds):
        run(args.messages, args.size)


if __name__ == "__main__":
    main()

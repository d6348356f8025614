"""Publishing one batch at a time: where the CPU of each acknowledged batch goes.

The W1 shape of ``benchmarks.vs_postgres`` (the sync client, batches of 500, each
acknowledged before the next) against one ``tidings serve``, with the time split the
other benchmarks do not print: the client's CPU per batch, and the server's, user and
system (kernel) apart, read from /proc. The kernel's share is where memory that is
faulted in afresh for each request shows (docs/operations.md, "Performance notes").

    python -m benchmarks.publish_cpu [--messages 200000] [--size 1024] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.workloads import Server
from tidings import Client

BATCH = 500


def _user_system(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run(messages: int, size: int) -> None:
    server = Server([])
    try:
        with Client(server.url, timeout=60) as client:
            client.create_topic("w1")
            batch = [os.urandom(size)] * BATCH
            for _ in range(20):  # connections, the first pages of the store
                client.publish("w1", batch)
            batches = messages // BATCH
            user0, sys0 = _user_system(server.proc.pid)
            own0 = time.process_time()
            started = time.perf_counter()
            each: list[float] = []
            for _ in range(batches):
                sent = time.perf_counter()
                client.publish("w1", batch)
                each.append(time.perf_counter() - sent)
            elapsed = time.perf_counter() - started
            own = (time.process_time() - own0) / batches * 1e3
            user1, sys1 = _user_system(server.proc.pid)
    finally:
        server.stop()
    user, system = (user1 - user0) / batches * 1e3, (sys1 - sys0) / batches * 1e3
    print(
        f"{messages:,} x {size} B: {batches * BATCH / elapsed:,.0f} msg/s, "
        f"p50 {statistics.median(each) * 1e3:.2f} ms per batch; "
        f"client CPU {own:.2f} ms, server CPU {user + system:.2f} ms "
        f"(user {user:.2f}, system {system:.2f}) per batch"
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

"""The Spark sink's store calls without Spark: the server's CPU per stored message.

Two threads (two tasks of ``local[2]``) each send ``store`` calls of 2,000 messages of
1 KiB under one write pointer, as the sink's executors do, each message with the
``source-id`` header the example pipeline writes (``--no-headers``: without). Prints
the messages per second and the server's CPU per message.

    python -m benchmarks.sink_stores [--messages 200000] [--batch 2000] [--no-headers]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from benchmarks.workloads import Server, cpu_seconds
from tidings import Client, Record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--no-headers", action="store_true")
    args = parser.parse_args()
    payload = os.urandom(1024)
    records = [
        payload
        if args.no_headers
        else Record(payload, None, {"source-id": os.urandom(20).hex().encode()})
        for _ in range(args.batch)
    ]
    server = Server([])
    try:
        with Client(server.url, timeout=120) as client:
            client.create_topic("sink")
            tx = client.begin()
            rounds = args.messages // args.batch // 2

            def task() -> None:
                with Client(server.url, timeout=120) as own:
                    for _ in range(rounds):
                        own.store("sink", records, write_pointer=tx.write_pointer)

            before = cpu_seconds(server.proc.pid)
            started = time.perf_counter()
            threads = [threading.Thread(target=task) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(server.proc.pid) - before
            stored = rounds * 2 * args.batch
            print(
                f"{stored:,} stores of 1 KiB{'' if args.no_headers else ' with a header'}: "
                f"{stored / elapsed:,.0f} msg/s, server CPU {cpu / stored * 1e6:.2f} us per message"
            )
            client.abort(tx)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""A consumer reading a topic of large messages: how long until its first message,
how fast it reads, and how much memory the server and the consumer take for it.

A real ``tidings serve`` (its settings as they are) holds ``--count`` messages of
``--size`` bytes; one sync consumer (``batch_size`` ``--batch``, the default 500 or
more) reads them through, in its own process. Pages are bounded by the server's
``fetch_max_bytes`` (16 MiB unless set): without that bound the first poll asks for
every message at once, and server and consumer each hold the whole topic.

    python -m benchmarks.large_messages [--count 300] [--size 1048576] [--batch 1000]

Prints the seconds to the first message and to the last, MB/s, and the peak resident
memory (VmHWM) of the server and of the consumer's process, in MiB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.workloads import Server
from tidings import Client

NS, TOPIC = "bench", "large"
_READ = """
import sys, time
from tidings import Client
url, topic, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
began = time.perf_counter()
first = None
count = size = 0
with Client(url, "bench") as client:
    for message in client.consume(topic, batch_size=batch, follow=False):
        if first is None:
            first = time.perf_counter() - began
        count += 1
        size += len(message.payload)
took = time.perf_counter() - began
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(first, took, count, size, int(hwm.split()[1]) // 1024)
"""


def _hwm_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    server = Server([])
    try:
        with Client(server.url, NS) as client:
            client.create_topic(TOPIC)
            per_request = max(1, (32 << 20) // args.size)
            payload = b"x" * args.size
            for at in range(0, args.count, per_request):
                client.publish(TOPIC, [payload] * min(per_request, args.count - at))
        before = _hwm_mib(server.proc.pid)
        began = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _READ, server.url, TOPIC, str(args.batch)],
            check=True, capture_output=True, text=True, timeout=600,
        ).stdout.split()  # fmt: skip
        wall = time.perf_counter() - began
        first, took, count, size, reader_hwm = (float(v) for v in out)
        assert int(count) == args.count and int(size) == args.count * args.size
        print(
            f"{args.count} x {args.size} B, batch_size {args.batch}: first message "
            f"{first:.2f} s, all {took:.2f} s ({size / took / 1e6:.0f} MB/s; "
            f"{wall:.2f} s with the reader's start); peak memory: server {before} MiB "
            f"after publishing, {_hwm_mib(server.proc.pid)} MiB after reading; "
            f"reader {reader_hwm:.0f} MiB"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""Takeover time after kill -9 of the leader, two instances on one PostgreSQL.

Starts a throwaway PostgreSQL cluster and two ``tidings serve`` instances on it. Each
trial: a publisher keeps publishing through the leader; the leader is killed with
SIGKILL; the clock runs from the kill until the standby has taken the lease, recovered,
and acknowledged its first publish. The killed instance is then started again (it
stands by) for the next trial. Prints p50 and max, and checks after every trial that
the topic holds every acknowledged message once, in order.

    python -m benchmarks.takeover --trials 20 [--lease-seconds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.vs_postgres import PgCluster, _free_port
from tidings import Client, RetryPolicy
from tidings.errors import TidingsError


class Instance:
    """One ``tidings serve`` on the shared database; started without waiting."""

    def __init__(self, dsn: str, lease: float) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-takeover-"))
        self.cmd = [sys.executable, "-m", "tidings", "serve", "--port", str(self.port),
                    "--data-dir", str(self.dir), "--store", dsn,
                    "--lease-seconds", str(lease)]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=0.3).status_code == 200
        except httpx.HTTPError:
            return False


def _publish_once(url: str) -> bool:
    try:
        with Client(url, timeout=2.0, retry=RetryPolicy(attempts=1)) as client:
            client.publish("bench", [b"probe"])
        return True
    except TidingsError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    parser.add_argument("--limit", type=float, default=60.0, help="most seconds per trial")
    args = parser.parse_args()
    cluster = PgCluster()
    nodes = [Instance(cluster.dsn, args.lease_seconds), Instance(cluster.dsn, args.lease_seconds)]
    times: list[float] = []
    try:
        nodes[0].start()
        deadline = time.monotonic() + 30
        while not nodes[0].healthy():
            if time.monotonic() > deadline:
                raise SystemExit("the first instance did not start")
            time.sleep(0.05)
        nodes[1].start()
        with Client(nodes[0].url) as client:
            client.create_topic("bench")
        leader, standby = nodes
        acked = 0
        for trial in range(args.trials):
            time.sleep(1.0)  # the standby is up and polling for the lease
            for _ in range(10):
                acked += _publish_once(leader.url)
            leader.kill()
            killed = time.monotonic()
            while not _publish_once(standby.url):
                if time.monotonic() - killed > args.limit:
                    raise SystemExit(f"trial {trial}: no takeover within {args.limit} s")
                time.sleep(0.02)
            took = time.monotonic() - killed
            acked += 1
            times.append(took)
            with Client(standby.url) as client:
                count = client.stats("bench").message_count
            if count != acked:
                raise SystemExit(f"trial {trial}: {count} messages, {acked} acknowledged")
            print(f"trial {trial + 1}: takeover in {took:.2f} s ({count} messages, all there)")
            leader.start()  # comes back as the standby
            leader, standby = standby, leader
    finally:
        for node in nodes:
            node.kill()
        cluster.stop()
    print(
        f"takeover after kill -9, lease {args.lease_seconds:g} s, {len(times)} trials: "
        f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s, "
        f"min {min(times):.2f} s (cpus: {os.cpu_count()})"
    )


if __name__ == "__main__":
    main()

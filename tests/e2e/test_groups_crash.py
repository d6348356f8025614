"""Exactly-once through a consumer group, with kill -9 (issue: consumer groups, tests).

Two copiers (tests/e2e/copier.py) share one group: each consumes its share of the input,
publishes it to the output and commits the group's position in the same transaction.
They are killed with kill -9 at random moments and restarted, and the server is killed
and restarted once mid-run. Afterwards the committed output must equal the input:
nothing lost, nothing twice, and per key in the input's order.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client, Record

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 3000
KEYS = 40


def start_copier(url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.copier", url, *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def committed(client: Client, topic: str) -> list[Record]:
    out: list[Record] = []
    for message in client.consume(topic, follow=False, batch_size=1000):
        out.append(Record(message.payload, message.key))
    return out


def test_copiers_killed_at_random_copy_exactly_once(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    rng = random.Random(20261124)
    # Short transaction timeouts: a copier killed mid-transaction leaves an open one.
    srv = start_server(TIDINGS_TX_DEFAULT_TIMEOUT="3")
    source, target, group = "in", "out", "copy"
    sent = [Record(f"{i}".encode(), f"k{i % KEYS}".encode()) for i in range(MESSAGES)]
    with Client(srv.url) as client:
        client.create_topic(source)
        client.create_topic(target)
    log = tmp_path / "copiers.log"
    copiers = [start_copier(srv.url, log, source, target, group) for _ in range(2)]
    try:
        # Publish while the copiers run and die, in small batches.
        with Client(srv.url, timeout=5.0) as client:
            for i in range(0, MESSAGES, 100):
                for attempt in range(50):
                    try:
                        client.publish(source, sent[i : i + 100])
                        break
                    except Exception:
                        if attempt == 49:
                            raise
                        time.sleep(0.2)
                time.sleep(0.05)  # the copiers keep up: kills land mid-copy
                if i and i % 300 == 0:
                    victim = rng.randrange(len(copiers))
                    time.sleep(rng.uniform(0, 0.3))
                    os.kill(copiers[victim].pid, signal.SIGKILL)
                    copiers[victim].wait()
                    copiers[victim] = start_copier(srv.url, log, source, target, group)
                if i == 1500:
                    srv.kill()  # the server too, mid-run
                    srv.start()
        # Let them finish: the output has every message once it is complete.
        deadline = time.monotonic() + 90
        with Client(srv.url) as client:
            while time.monotonic() < deadline:
                got = committed(client, target)
                if len(got) >= MESSAGES:
                    break
                time.sleep(0.5)
            time.sleep(1.0)  # anything extra would show now
            got = committed(client, target)
    finally:
        for copier in copiers:
            copier.kill()
            copier.wait()
    assert len(got) == MESSAGES, (len(got), log.read_text()[-3000:])
    # The chaos happened: transactions fenced or broken by the kills.
    assert "copier:" in log.read_text()
    assert sorted(r.payload for r in got) == sorted(r.payload for r in sent)
    by_key: dict[bytes | None, list[int]] = defaultdict(list)
    for record in got:
        by_key[record.key].append(int(record.payload))
    for values in by_key.values():
        assert values == sorted(values)  # per key, the input's order

"""Queues with kill -9: of workers in processes, and of the server (issue: queues).

Workers run as processes (tests/e2e/queue_worker.py). A worker killed while it holds
leases gives its messages to the others once the leases run out; transactional copiers
killed at random moments, and the server killed mid-run, leave an output with every
input exactly once; a server killed after acks delivers none of them again.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    url: str, out: Path, *args: str, idle: float = 3600.0, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    with open(out, "ab") as stdout, open(out.with_suffix(".err"), "ab") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.e2e.queue_worker",
                url,
                *args,
                "--idle",
                str(idle),
                *extra,
            ],
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )


def publish_retrying(client: Client, topic: str, payloads: list[bytes]) -> None:
    for attempt in range(50):
        try:
            client.publish(topic, payloads)
            return
        except Exception:
            if attempt == 49:
                raise
            time.sleep(0.2)


def test_processes_compete_and_a_killed_workers_leases_come_back(
    server: ServerProcess, topic: str, tmp_path: Path
) -> None:
    payloads = [f"job-{i}".encode() for i in range(900)]
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, payloads)
    holder_out = tmp_path / "holder.out"
    holder = start_worker(server.url, holder_out, topic, "work", "hold")
    deadline = time.monotonic() + 30
    while not holder_out.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    held = int(holder_out.read_text().split()[0])
    assert held == 20
    os.kill(holder.pid, signal.SIGKILL)  # dies holding 20 leases of 2 s
    holder.wait()
    outs = [tmp_path / f"w{i}.out" for i in range(3)]
    # They start popping together, each spending a little on each batch: otherwise the
    # first one started may finish the queue before the others are up.
    go = tmp_path / "go"
    workers = [
        start_worker(
            server.url,
            out,
            topic,
            "work",
            "ack",
            idle=4.0,
            extra=("--go", str(go), "--pace", "0.005"),
        )
        for out in outs
    ]
    go.touch()
    for worker in workers:
        worker.wait(timeout=120)
    seen = Counter(line for out in outs for line in out.read_text().splitlines())
    assert seen == Counter(p.decode() for p in payloads)  # each once, the held ones too
    assert sum(1 for out in outs if out.read_text()) >= 2  # they did compete
    with Client(server.url) as client:
        stats = client.describe_queue(topic, "work")
        assert stats.expired >= held and stats.redelivered >= held
        assert (stats.pending, stats.waiting) == (0, 0)


def test_transactional_copiers_killed_at_random_copy_exactly_once(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    rng = random.Random(20261125)
    # Short transaction timeouts: a copier killed mid-transaction leaves an open one.
    srv = start_server(TIDINGS_TX_DEFAULT_TIMEOUT="3")
    total = 2000
    sent = [f"m{i}".encode() for i in range(total)]
    with Client(srv.url) as client:
        client.create_topic("in")
        client.create_topic("out")
    outs = [tmp_path / f"c{i}.out" for i in range(3)]
    copiers = [start_worker(srv.url, out, "in", "copy", "copy", "out") for out in outs]
    try:
        with Client(srv.url, timeout=5.0) as client:
            for i in range(0, total, 100):
                publish_retrying(client, "in", sent[i : i + 100])
                time.sleep(0.05)
                if i and i % 300 == 0:
                    victim = rng.randrange(len(copiers))
                    time.sleep(rng.uniform(0, 0.3))
                    os.kill(copiers[victim].pid, signal.SIGKILL)
                    copiers[victim].wait()
                    copiers[victim] = start_worker(
                        srv.url, outs[victim], "in", "copy", "copy", "out"
                    )
                if i == 1000:
                    srv.kill()  # the server too, mid-run
                    srv.start()
        deadline = time.monotonic() + 90
        with Client(srv.url) as client:
            while time.monotonic() < deadline:
                got = [m.payload for m in client.consume("out", follow=False, batch_size=1000)]
                if len(got) >= total:
                    break
                time.sleep(0.5)
            time.sleep(2.5)  # a lease or transaction still running would show now
            got = [m.payload for m in client.consume("out", follow=False, batch_size=1000)]
    finally:
        for copier in copiers:
            copier.kill()
            copier.wait()
    errors = "".join(out.with_suffix(".err").read_text() for out in outs)
    assert Counter(got) == Counter(p.upper() for p in sent), errors[-3000:]
    assert "worker:" in errors  # the chaos happened


def test_server_kill_loses_no_ack_and_no_message(
    start_store_server: Callable[..., ServerProcess], topic: str
) -> None:
    srv = start_store_server()
    with Client(srv.url) as client:
        client.create_topic(topic)
        client.publish(topic, [f"{i}".encode() for i in range(50)])
        q = client.queue(topic, "work")
        acked = q.pop(20)
        q.ack(acked)
        holder = client.queue(topic, "work", ack_timeout=5.0)
        # Before the pop: the server starts the lease while the pop runs, so a clock
        # read after it could be later than the lease's start by the pop's own time.
        leased_at = time.monotonic()
        held = holder.pop(10)  # leased, not acked: back after its timeout
        nacked = q.pop(5)
        q.nack(nacked)
    srv.kill()
    srv.start()
    with Client(srv.url) as client:
        q = client.queue(topic, "work")
        first = q.pop(100)
        # The nacked ones at once, then the ones never handed out; the held lease
        # keeps its deadline across the restart.
        assert [m.payload for m in first] == [m.payload for m in nacked] + [
            f"{i}".encode() for i in range(35, 50)
        ]
        assert [m.delivery_count for m in first[:5]] == [2] * 5
        late = q.pop(100, wait=10.0)
        assert [m.id for m in late] == [m.id for m in held]
        # (Deadlines are kept in whole milliseconds: a few ms of slack.)
        assert time.monotonic() - leased_at >= 5.0 - 0.005
        q.ack(first + late)
        assert q.pop(100) == []
        stats = client.describe_queue(topic, "work")
        assert (stats.pending, stats.waiting, stats.ack_state) == (0, 0, 0)


def test_acks_carried_by_a_pop_survive_a_server_kill(
    start_store_server: Callable[..., ServerProcess], topic: str
) -> None:
    srv = start_store_server()
    with Client(srv.url) as client:
        client.create_topic(topic)
        client.publish(topic, [f"{i}".encode() for i in range(30)])
        q = client.queue(topic, "work")
        first = q.pop(10)
        second = q.pop(10, ack=first)  # first acked and durable once this returns
        assert [m.payload for m in second] == [f"{i}".encode() for i in range(10, 20)]
    srv.kill()
    srv.start()
    with Client(srv.url) as client:
        # The second batch's lease was not written yet (a pop writes nothing): it is
        # handed out again at once; the acked batch never.
        again = client.queue(topic, "work").pop(100)
        assert [m.payload for m in again] == [f"{i}".encode() for i in range(10, 30)]
        assert client.describe_queue(topic, "work").pending == 20

"""The examples in examples/ run against a real server and print what they promise.
(examples/spark_pipeline.py is run by tests/spark/test_crash.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess, free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, server: ServerProcess) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), "--url", server.url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart(server: ServerProcess) -> None:
    out = run_example("quickstart.py", server)
    assert "hello" in out and "world" in out and "order 42 shipped" in out
    assert "key=b'42'" in out
    assert "background publisher: 100 sent" in out
    assert "103 messages" in out


def test_transactions(server: ServerProcess) -> None:
    out = run_example("transactions.py", server)
    assert "committed: {'alice': 100}" in out
    assert "rolled back: balances may not go negative {'alice': 100}" in out
    assert "conflict, rolled back:" in out
    committed = next(line for line in out.splitlines() if "read-committed" in line)
    # Never the rolled-back or the conflicting writer's messages.
    assert "alice: -5" not in committed and "loses" not in committed
    assert "alice: 100" in committed and "carol: 5" in committed


def test_consumer_group(server: ServerProcess) -> None:
    out = run_example("consumer_group.py", server)
    workers = [line for line in out.splitlines() if line.startswith("worker ")]
    assert len(workers) == 2
    assert sum(int(line.split(": ")[1].split()[0]) for line in workers) == 20
    assert "invoices: 20" in out
    assert "lag 0" in out


def test_queue_worker(server: ServerProcess) -> None:
    out = run_example("queue_worker.py", server)
    assert "jobs done: 9" in out and "results: 9" in out
    assert "dead letters: ['broken image']" in out
    assert "acked 9, waiting 0, pending 0, dead-lettered 1" in out
    assert "(delivery 2): nack" in out


@pytest.mark.parametrize(
    "name", ["quickstart.py", "transactions.py", "consumer_group.py", "queue_worker.py"]
)
def test_an_example_without_a_server_says_so_in_one_line(name: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: TidingsConnectionError: cannot connect to"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

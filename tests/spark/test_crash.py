"""Kill the driver (SIGKILL) mid-commit, restart from the checkpoint: exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.spark.conftest import spark_env
from tidings.client import Client
from tidings.structs import Record

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("crash_pipeline.py")


def _run(
    server: ServerProcess,
    source: str,
    sink: str,
    checkpoint: Path,
    mode: str,
    batch: int,
    log: Path,
) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                server.url,
                source,
                sink,
                str(checkpoint),
                mode,
                str(batch),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spark_env()},
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=240)
        except BaseException:
            # Also when pytest-timeout fails the test first (it raises its own error
            # here): a driver left running keeps polling the session's server.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def test_killed_driver_restarts_exactly_once(
    server: ServerProcess, client: Client, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    source, sink = new_topic(), new_topic()
    client.publish(source, [Record(f"m{i:02}".encode(), f"k{i}".encode()) for i in range(12)])
    inputs = client.poll(source)
    checkpoint, log = tmp_path / "ckpt", tmp_path / "driver.log"

    # (a) batch 1 (messages 4-7) is stored by the executors; the driver dies before the
    # sink commits it.
    code = _run(server, source, sink, checkpoint, "before-commit", 1, log)
    assert code == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    assert len(client.poll(sink, transaction=client.snapshot())) == 4

    # (b) the restart replays batch 1, then batch 2 is published and committed and the
    # driver dies before Spark records it.
    code = _run(server, source, sink, checkpoint, "after-commit", 2, log)
    assert code == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    assert len(client.poll(sink, transaction=client.snapshot())) == 12

    # The last restart replays batch 2 and must publish nothing.
    code = _run(server, source, sink, checkpoint, "none", -1, log)
    assert code == 0, log.read_text(errors="replace")[-3000:]

    out = client.poll(sink, transaction=client.snapshot())
    assert [m.payload for m in out] == [m.payload.upper() for m in inputs]
    assert [m.headers["source-id"].decode() for m in out] == [m.id.hex for m in inputs]
    assert [m.key for m in out] == [m.key for m in inputs]
    assert len(client.poll(sink)) == 12  # not even an uncommitted duplicate was published

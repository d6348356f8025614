"""What a new user meets first, through real processes: a ``tidings serve`` that cannot
start says why in one line (and changes nothing), and followers outlive a restart of
the server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import Client, Record

pytestmark = pytest.mark.e2e


def _serve(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tidings", "serve", *args],
        capture_output=True,
        timeout=30,
        env=os.environ.copy(),
    )


def _one_error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The line for people on stdout; the JSON log lines on stderr, without tracebacks."""
    lines = done.stdout.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stdout
    logged = [orjson.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert logged and all("exception" not in line for line in logged), done.stderr
    assert b"Traceback" not in done.stdout + done.stderr
    return lines[0]


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_a_second_server_on_a_data_directory_in_use_changes_nothing(
    start_server: Callable[..., ServerProcess], tmp_path: Path, topic: str
) -> None:
    first = start_server(data_dir=tmp_path / "shared")
    with Client(first.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"kept"])
    before = _tree(tmp_path)
    began = time.monotonic()
    done = _serve("--port", str(free_port()), "--data-dir", str(tmp_path / "shared"))
    assert time.monotonic() - began < 15  # at once, not after a timeout
    assert done.returncode == 1
    line = _one_error_line(done)
    assert "in use by another process" in line and f"pid {first.proc.pid}" in line  # type: ignore[union-attr]
    assert _tree(tmp_path) == before
    # The first one serves on; read-only inspection works beside it.
    with Client(first.url) as client:
        client.publish(topic, [b"after"])
        assert [m.payload for m in client.consume(topic, follow=False)] == [b"kept", b"after"]
    inspected = subprocess.run(
        [sys.executable, "-m", "tidings", "inspect", str(tmp_path / "shared")],
        capture_output=True,
        timeout=30,
    )
    assert inspected.returncode == 0 and topic.encode() in inspected.stdout


def test_a_data_directory_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    done = _serve("--port", str(free_port()), "--data-dir", str(tmp_path / "file"))
    assert done.returncode == 1
    assert "Not a directory" in _one_error_line(done)


def test_a_port_in_use_is_one_line(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    first = start_server()
    done = _serve("--port", str(first.port), "--data-dir", str(tmp_path / "other"))
    assert done.returncode == 1
    line = done.stdout.decode().strip().splitlines()[-1]
    assert line.startswith(f"Error: cannot listen on 127.0.0.1:{first.port}: ")
    assert "in use" in line and b"Traceback" not in done.stdout + done.stderr


def test_tls_files_that_do_not_load_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate")
    done = _serve(
        "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
        "--tls-cert", str(tmp_path / "bad.pem"), "--tls-key", str(tmp_path / "bad.pem"),
    )  # fmt: skip
    assert done.returncode == 2
    assert "cannot load tls_cert" in _one_error_line(done)
    assert not (tmp_path / "data").exists()


def _restart_and_publish(srv: ServerProcess, topic: str, payload: bytes) -> threading.Thread:
    def later() -> None:
        time.sleep(1.0)
        srv.start()  # the same port and data directory
        with Client(srv.url) as other:
            other.publish(topic, [payload])

    thread = threading.Thread(target=later)
    thread.start()
    return thread


def test_consume_follow_outlives_a_server_restart(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    srv = start_server()
    with Client(srv.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"before"])
    with subprocess.Popen(
        [sys.executable, "-m", "tidings", "--url", srv.url, "consume", topic, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as follower:
        try:
            assert follower.stdout is not None
            assert follower.stdout.readline() == b"before\n"
            srv.kill()
            thread = _restart_and_publish(srv, topic, b"after")
            assert follower.stdout.readline() == b"after\n"  # resumed after "before"
            thread.join()
            assert follower.poll() is None  # still following
        finally:
            follower.kill()
        _, errors = follower.communicate()
    # The outage is remarked on stderr (stdout stays the messages): one warning naming
    # the topic, as a user who sees nothing arrive needs to learn why.
    (line,) = errors.decode().splitlines()
    assert f"consumer of topic '{topic}'" in line and "TidingsConnectionError" in line


def test_a_group_member_follows_on_after_a_server_restart(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    srv = start_server()
    # Two keys in different partitions of a two-partition group.
    first, second = (Record(b"a", key=b"a"), Record(b"b", key=b"d"))
    assert zlib.crc32(b"a") % 2 != zlib.crc32(b"d") % 2
    with Client(srv.url, timeout=2.0) as client:
        client.create_topic(topic)
        client.publish(topic, [first, second])
        member = client.consume(topic, group="restart", wait=0.5, batch_size=1, partitions=2)
        assert [next(member).payload, next(member).payload] == [b"a", b"b"]  # not committed
        srv.kill()
        thread = _restart_and_publish(srv, topic, b"c")
        # From the committed positions (none): both again, at least once, then "c". A
        # commit between them names only what came after the restart.
        assert next(member).payload == b"a"
        member.commit()
        assert {next(member).payload, next(member).payload} == {b"b", b"c"}
        member.commit()
        thread.join()
        member.close()
        assert client.describe_group(topic, "restart").lag == 0
    with httpx.Client(base_url=srv.url) as api:
        assert api.get("/readyz").status_code == 200

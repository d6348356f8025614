"""Start, stop and crash: operations endpoints, logs, SIGTERM, kill -9."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.serverproc import ServerProcess, free_port

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/life"


def payloads(api: httpx.Client, path: str) -> list[bytes]:
    """Every payload of the topic, in order (paging through polls)."""
    out: list[bytes] = []
    body: dict[str, object] = {"limit": 10_000}
    while True:
        page = api.post(path + "/poll", json=body).json()
        if not page:
            return out
        out.extend(base64.b64decode(m["payload"]) for m in page)
        body = {"limit": 10_000, "startFrom": page[-1]["id"], "inclusive": False}


def log_lines(srv: ServerProcess) -> list[dict[str, object]]:
    """The JSON log lines (stderr); the test server's log file also holds stdout, where
    the one human line ("listening on ...") goes."""
    lines = [line for line in srv.log().splitlines() if line.strip()]
    assert all(line.startswith("{") or line.startswith("listening on ") for line in lines)
    return [orjson.loads(line) for line in lines if line.startswith("{")]


def test_operations_endpoints(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as api:
        assert api.get("/healthz").json() == {"status": "ok"}
        r = api.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        doc = api.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.")
        paths = doc["paths"]
        for path in (
            "/v1/namespaces/{ns}/topics",
            "/v1/namespaces/{ns}/topics/{topic}",
            "/v1/namespaces/{ns}/topics/{topic}/properties",
            "/v1/namespaces/{ns}/topics/{topic}/stats",
            "/v1/namespaces/{ns}/topics/{topic}/publish",
            "/v1/namespaces/{ns}/topics/{topic}/store",
            "/v1/namespaces/{ns}/topics/{topic}/rollback",
            "/v1/namespaces/{ns}/topics/{topic}/poll",
            "/v1/transactions",
            "/v1/transactions/{wp}/commit",
            "/v1/transactions/{wp}/abort",
            "/v1/transactions/{wp}/invalidate",
            "/v1/transactions/producers",
            "/v1/transactions/prune",
            "/healthz",
            "/readyz",
            "/metrics",
            "/openapi.json",
        ):
            assert path in paths, path
        assert set(
            paths["/v1/namespaces/{ns}/topics/{topic}/publish"]["post"]["requestBody"]["content"]
        ) == {
            "application/json",
            "avro/binary",
            "avro/binary; schema=tidings",
            "application/vnd.tidings.payloads",
        }

        api.put(f"{NS}/topics/metrics")
        api.post(f"{NS}/topics/metrics/publish", json={"messages": ["YWJj"]})
        api.post(f"{NS}/topics/metrics/poll", json={})
        r = api.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        text = r.text
        for line in (
            'tidings_messages_published_total{namespace="life",topic="metrics"} 1.0',
            'tidings_bytes_published_total{namespace="life",topic="metrics"} 3.0',
            'tidings_messages_fetched_total{namespace="life",topic="metrics"} 1.0',
            'tidings_fetches_total{namespace="life",topic="metrics"} 1.0',
        ):
            assert line in text
        for name in (
            "tidings_publish_latency_seconds_bucket",
            "tidings_http_request_duration_seconds_bucket",
            "tidings_store_commits_total",
            "tidings_transactions_begun_total",
            "tidings_transactions_committed_total",
            "tidings_transactions_aborted_total",
            "tidings_transactions_invalidated_total",
            "tidings_transactions_conflicts_total",
            "tidings_transactions_in_progress",
            "tidings_transactions_invalid",
        ):
            assert name in text, name
        route = "/v1/namespaces/{ns}/topics/{topic}/publish"
        assert f'tidings_http_requests_total{{method="POST",route="{route}",status="200"}}' in text


def test_data_layout(server: ServerProcess) -> None:
    assert (server.data_dir / "store" / "data.mdb").exists()
    assert (server.data_dir / "tx").is_dir()


def test_sigterm_finishes_in_flight_writes(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    api = httpx.Client(base_url=srv.url, timeout=30)
    api.put(f"{NS}/topics/t")
    body = orjson.dumps({"messages": [base64.b64encode(b"in flight").decode()]})
    half_sent, signalled = threading.Event(), threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield body[:10]
        half_sent.set()
        signalled.wait(10)
        time.sleep(0.3)
        yield body[10:]

    result: dict[str, httpx.Response] = {}
    writer = threading.Thread(
        target=lambda: result.update(
            r=httpx.post(
                f"{srv.url}{NS}/topics/t/publish",
                content=slow_body(),
                headers={"content-type": "application/json"},
                timeout=30,
            )
        )
    )
    writer.start()
    assert half_sent.wait(10)
    time.sleep(0.2)  # let the server start reading the body
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    signalled.set()
    writer.join(30)
    assert result["r"].status_code == 200
    assert srv.proc.wait(20) == 0
    api.close()

    events = [line.get("event") for line in log_lines(srv)]
    assert events.count("start") == 1 and events.count("stop") == 1
    assert "error" not in events

    again = ServerProcess(srv.data_dir).start()
    try:
        with httpx.Client(base_url=again.url, timeout=10) as api2:
            assert payloads(api2, f"{NS}/topics/t") == [b"in flight"]
    finally:
        assert again.stop() == 0


def test_sigterm_under_load_exits_0(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        api.put(f"{NS}/topics/load")
    acked: list[list[bytes]] = [[] for _ in range(4)]
    stop = threading.Event()

    def publisher(i: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            n = 0
            while not stop.is_set():
                batch = [f"{i}:{n + k}".encode() for k in range(20)]
                body = {"messages": [base64.b64encode(p).decode() for p in batch]}
                try:
                    r = client.post(f"{NS}/topics/load/publish", json=body)
                except httpx.HTTPError:
                    return
                if r.status_code != 200:
                    return
                acked[i].extend(batch)
                n += 20

    threads = [threading.Thread(target=publisher, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.7)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(20) == 0
    stop.set()
    for t in threads:
        t.join(10)
    assert all(acked)

    again = ServerProcess(srv.data_dir).start()
    try:
        with httpx.Client(base_url=again.url, timeout=10) as api:
            stored = payloads(api, f"{NS}/topics/load")
        for i, mine in enumerate(acked):
            theirs = [p for p in stored if p.startswith(f"{i}:".encode())]
            assert theirs[: len(mine)] == mine
    finally:
        again.stop()


def test_sigterm_releases_long_polls(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    httpx.put(f"{srv.url}{NS}/topics/lp")
    result: dict[str, httpx.Response] = {}
    poller = threading.Thread(
        target=lambda: result.update(
            r=httpx.post(
                f"{srv.url}{NS}/topics/lp/poll", params={"waitMs": 30_000}, json={}, timeout=60
            )
        )
    )
    poller.start()
    time.sleep(0.5)
    start = time.monotonic()
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(20) == 0
    poller.join(10)
    assert result["r"].status_code == 200 and result["r"].json() == []
    assert time.monotonic() - start < 5.0


def test_sigint_exits_0(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(20) == 0


def test_port_in_use_exits_1_with_a_json_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tidings", "serve", "--port", str(port),
             "--data-dir", str(tmp_path / "data")],
            capture_output=True, timeout=30, env=os.environ.copy(),
        )  # fmt: skip
    assert proc.returncode == 1
    lines = [orjson.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    assert lines and all(line["level"] in ("error", "warning") for line in lines)
    assert any(line.get("event") == "error" for line in lines)


def test_bad_configuration_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tidings", "serve", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "data")],
        capture_output=True, timeout=30,
        env={**os.environ, "TIDINGS_MAX_BODY_BYTES": "lots"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert b"TIDINGS_MAX_BODY_BYTES" in proc.stderr


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_message(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        api.put(f"{NS}/topics/crash")
    acked: list[list[bytes]] = [[] for _ in range(4)]

    def publisher(i: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            n = 0
            while True:
                batch = [f"{i}:{n + k}".encode() for k in range(50)]
                body = {"messages": [base64.b64encode(p).decode() for p in batch]}
                try:
                    r = client.post(f"{NS}/topics/crash/publish", json=body)
                except httpx.HTTPError:
                    return
                if r.status_code != 200:
                    return
                acked[i].extend(batch)
                n += 50

    threads = [threading.Thread(target=publisher, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    srv.kill()
    for t in threads:
        t.join(10)
    assert all(len(a) >= 50 for a in acked)

    again = ServerProcess(srv.data_dir).start()
    try:
        with httpx.Client(base_url=again.url, timeout=30) as api:
            stored = payloads(api, f"{NS}/topics/crash")
        assert len(stored) == len(set(stored))
        for i, mine in enumerate(acked):
            theirs = [p for p in stored if p.startswith(f"{i}:".encode())]
            # Every acknowledged batch, in order; at most the unacknowledged tail beyond.
            assert theirs[: len(mine)] == mine
            assert len(theirs) - len(mine) <= 50
    finally:
        again.stop()


def test_metrics_forget_deleted_topics(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as api:
        api.put("/v1/namespaces/default/topics/gone-soon").raise_for_status()
        api.post(
            "/v1/namespaces/default/topics/gone-soon/publish", json={"messages": ["eA=="]}
        ).raise_for_status()
        assert 'topic="gone-soon"' in api.get("/metrics").text
        api.delete("/v1/namespaces/default/topics/gone-soon").raise_for_status()
        assert 'topic="gone-soon"' not in api.get("/metrics").text


def test_a_data_directory_in_use_is_one_clear_line(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    first = start_server(data_dir=tmp_path / "shared")
    assert first.proc is not None
    proc = subprocess.run(
        [sys.executable, "-m", "tidings", "serve", "--port", "0",
         "--data-dir", str(tmp_path / "shared")],
        capture_output=True, timeout=30, env=os.environ.copy(),
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stdout.decode().strip().startswith("Error: ") and b"in use" in proc.stdout
    lines = [orjson.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    assert lines and all("exception" not in line for line in lines)

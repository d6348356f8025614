"""Operations against real servers: metric values, exit codes and settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess, free_port

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/opsreview"


def sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of one series in a Prometheus text exposition (None: not there)."""
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_a_retried_idempotent_publish_is_counted_once(server: ServerProcess, topic: str) -> None:
    labels = f'namespace="opsreview",topic="{topic}"'
    headers = {
        "Tidings-Producer-Id": "0123456789abcdef0123456789abcdef",
        "Tidings-Sequence": "0",
    }
    with httpx.Client(base_url=server.url, timeout=10) as api:
        assert api.put(f"{NS}/topics/{topic}").status_code == 200
        for _ in range(3):  # the first writes, the two retries are answered as done
            r = api.post(
                f"{NS}/topics/{topic}/publish", json={"messages": ["YWJj", "ZGVm"]}, headers=headers
            )
            assert r.status_code == 200, r.text
        text = api.get("/metrics").text
        stats = api.get(f"{NS}/topics/{topic}/stats").json()
    assert stats["messageCount"] == 2
    assert sample(text, "tidings_messages_published_total", labels) == 2
    assert sample(text, "tidings_bytes_published_total", labels) == 6
    assert stats["messagesPublished"] == 2 and stats["bytesPublished"] == 6


def test_deleting_a_topic_takes_nothing_out_of_the_publish_latency_histogram(
    server: ServerProcess, topic: str
) -> None:
    name = "tidings_publish_latency_seconds"
    with httpx.Client(base_url=server.url, timeout=10) as api:
        assert api.put(f"{NS}/topics/{topic}").status_code == 200
        for _ in range(3):
            api.post(f"{NS}/topics/{topic}/publish", json={"messages": ["YWJj"]})
        before = api.get("/metrics").text
        assert api.delete(f"{NS}/topics/{topic}").status_code == 200
        after = api.get("/metrics").text
    # Counts of a histogram are counters: they never go down while the process runs.
    count_before = sample(before, name + "_count")
    assert count_before is not None and count_before >= 3
    assert sample(after, name + "_count") == count_before
    assert sample(after, name + "_sum") == sample(before, name + "_sum")
    assert sample(after, name + "_bucket", 'le="+Inf"') == count_before


def test_a_repeated_abort_or_invalidate_is_counted_once(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server()  # of its own: the transaction counters are the process's
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        aborted = api.post("/v1/transactions", json={}).json()["writePointer"]
        invalidated = api.post("/v1/transactions", json={}).json()["writePointer"]
        for _ in range(2):  # a client that lost the first answer asks again: 200 again
            assert api.post(f"/v1/transactions/{aborted}/abort", json={}).status_code == 200
            assert api.post(f"/v1/transactions/{invalidated}/invalidate").status_code == 200
        text = api.get("/metrics").text
    assert sample(text, "tidings_transactions_begun_total") == 2
    assert sample(text, "tidings_transactions_aborted_total") == 1
    assert sample(text, "tidings_transactions_invalidated_total") == 1
    assert sample(text, "tidings_transactions_invalid") == 1


def serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """``tidings serve`` on a free port, expected to stop at once."""
    return subprocess.run(
        [sys.executable, "-m", "tidings", "serve", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "data"), *args],
        capture_output=True, timeout=30, env={**os.environ, **env},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--store", "mysql://db.example/tidings"], b"store must be a postgresql:// URL"),
        (
            ["--store", "postgresql://tidings@127.0.0.1:1/tidings", "--role", "messaging"],
            b"needs role `all`",
        ),
    ],
)
def test_a_bad_store_setting_exits_2(tmp_path: Path, args: list[str], fragment: bytes) -> None:
    proc = serve(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.count(b"Error: ") == 1 and fragment in proc.stdout
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("name", ["TIDINGS_SHUTDOWN_TIMEOUT", "TIDINGS_CLEANUP_INTERVAL"])
def test_a_time_that_is_not_finite_exits_2_before_anything_opens(tmp_path: Path, name: str) -> None:
    proc = serve(tmp_path, **{name: "inf"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and name in lines[0] and "finite" in lines[0], lines
    assert not (tmp_path / "data").exists()


def test_a_queue_keeps_its_metrics_across_a_restart(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data = tmp_path / "restarted"
    labels = 'namespace="opsreview",queue="q",topic="jobs"'
    srv = start_server(data_dir=data)
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        api.put(f"{NS}/topics/jobs")
        api.post(f"{NS}/topics/jobs/publish", json={"messages": ["YWJj"] * 5})
        body = {"consumerId": "w1", "start": "earliest", "maxMessages": 2}
        popped = api.post(f"{NS}/topics/jobs/queues/q/pop", json=body).json()
        ids = [m["id"] for m in popped]
        acked = api.post(f"{NS}/topics/jobs/queues/q/ack", json={"consumerId": "w1", "ids": ids})
        assert acked.status_code == 200 and len(ids) == 2
    assert srv.stop() == 0
    # Its workers are gone too: nothing touches the queue after the restart.
    srv = start_server(data_dir=data)
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        text = api.get("/metrics").text
        waiting = api.get(f"{NS}/topics/jobs/queues/q").json()["waiting"]
    assert waiting == 3
    assert sample(text, "tidings_queue_waiting", labels) == 3
    assert sample(text, "tidings_queue_pending", labels) == 0
    assert sample(text, "tidings_queue_acked_total", labels) == 0  # counted since the start


def test_a_store_url_refused_at_start_is_shown_without_its_password(tmp_path: Path) -> None:
    # The scheme a library of another kind would take: refused, password and all.
    proc = serve(tmp_path, "--store", "postgresql+psycopg://tidings:Zq81sEcret@db.example/t")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert b"postgresql+psycopg://tidings:***@db.example/t" in proc.stdout
    assert b"Zq81sEcret" not in proc.stdout + proc.stderr


def test_reading_lags_and_depths_is_no_fetch(server: ServerProcess, topic: str) -> None:
    labels = f'namespace="opsreview",topic="{topic}"'
    base = f"{NS}/topics/{topic}"
    with httpx.Client(base_url=server.url, timeout=10) as api:
        api.put(base)
        api.post(f"{base}/publish", json={"messages": ["YWJj"] * 5})
        api.post(f"{base}/groups/g/join", json={"start": "earliest"})
        pop = {"consumerId": "w1", "start": "earliest", "maxMessages": 2}
        assert len(api.post(f"{base}/queues/q/pop", json=pop).json()) == 2
        first = api.get("/metrics").text
        for _ in range(3):  # what a dashboard and an operator read all day
            api.get("/metrics")
            assert api.get(f"{base}/groups/g").json()["lag"] == 5
            assert api.get(f"{base}/queues/q").json()["waiting"] == 3
            api.get(f"{base}/stats")
        last = api.get("/metrics").text
    assert sample(last, "tidings_group_lag", f'group="g",{labels}') == 5
    for name in ("tidings_fetches_total", "tidings_messages_fetched_total"):
        assert sample(last, name, labels) == sample(first, name, labels), name
    assert sample(last, "tidings_messages_fetched_total", labels) == 2  # the pop's


def test_a_long_poll_woken_again_and_again_is_one_fetch(server: ServerProcess, topic: str) -> None:
    labels = f'namespace="opsreview",topic="{topic}"'
    with httpx.Client(base_url=server.url, timeout=10) as api:
        api.put(f"{NS}/topics/{topic}")
        answer: dict[str, httpx.Response] = {}
        poll = threading.Thread(
            target=lambda: answer.update(
                r=httpx.post(
                    f"{server.url}{NS}/topics/{topic}/poll?waitMs=1500&isolation=read_committed",
                    json={},
                    timeout=10,
                )
            )
        )
        poll.start()
        time.sleep(0.3)
        for _ in range(4):  # every end of a transaction wakes read-committed polls
            wp = api.post("/v1/transactions", json={}).json()["writePointer"]
            assert api.post(f"/v1/transactions/{wp}/abort", json={}).status_code == 200
        poll.join(10)
        assert answer["r"].status_code == 200 and answer["r"].json() == []
        api.post(f"{NS}/topics/{topic}/publish", json={"messages": ["YWJj"]})
        got = api.post(f"{NS}/topics/{topic}/poll?waitMs=1000", json={}).json()
        assert len(got) == 1
        text = api.get("/metrics").text
    assert sample(text, "tidings_fetches_total", labels) == 2
    assert sample(text, "tidings_messages_fetched_total", labels) == 1


@pytest.mark.parametrize("reader", ["queue", "group"])
def test_a_waiting_pop_or_group_poll_is_one_fetch(
    server: ServerProcess, topic: str, reader: str
) -> None:
    labels = f'namespace="opsreview",topic="{topic}"'
    base = f"{NS}/topics/{topic}"
    with httpx.Client(base_url=server.url, timeout=10) as api:
        api.put(base)
        if reader == "queue":
            url = f"{base}/queues/q/pop"
            body = {"consumerId": "w1", "start": "earliest", "maxMessages": 10}
        else:
            joined = api.post(f"{base}/groups/g/join", json={"start": "earliest"}).json()
            url, body = f"{base}/groups/g/poll", {"memberId": joined["memberId"]}
        answer: dict[str, httpx.Response] = {}
        waiting = threading.Thread(
            target=lambda: answer.update(
                r=httpx.post(f"{server.url}{url}?waitMs=1500", json=body, timeout=10)
            )
        )
        waiting.start()
        time.sleep(0.3)
        # Writes of an open transaction wake it; it finds nothing it may read each time.
        wp = api.post("/v1/transactions", json={}).json()["writePointer"]
        for _ in range(4):
            published = api.post(
                f"{base}/publish", json={"messages": ["YWJj"], "transactionWritePointer": wp}
            )
            assert published.status_code == 200
            time.sleep(0.05)
        waiting.join(10)
        assert answer["r"].status_code == 200 and answer["r"].json() == []
        assert api.post(f"/v1/transactions/{wp}/commit", json={}).status_code == 200
        got = api.post(url, json=body).json()
        assert len(got) == 4
        text = api.get("/metrics").text
    assert sample(text, "tidings_fetches_total", labels) == 2
    assert sample(text, "tidings_messages_fetched_total", labels) == 4


def test_a_sighup_without_an_auth_file_changes_nothing(
    start_server: Callable[..., ServerProcess],
) -> None:
    # A service manager's "reload" sends SIGHUP: with no auth file to reload, the
    # server carries on (it stopped as on a hangup, without its shutdown).
    srv = start_server()
    assert srv.proc is not None
    topics = srv.url + "/v1/namespaces/default/topics"
    assert httpx.put(topics + "/after-hup").status_code == 200
    os.kill(srv.proc.pid, signal.SIGHUP)
    time.sleep(0.5)
    assert srv.proc.poll() is None
    assert "after-hup" in httpx.get(topics).json()
    assert "no auth file to reload" in srv.log()
    assert srv.stop() == 0

"""Long-poll (``?waitMs=N``): wakes on a durable publish, or answers empty after N ms."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/longpoll-ns"


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def live(api: httpx.Client, topic: str) -> str:
    assert api.put(f"{NS}/topics/{topic}").status_code == 200
    return f"{NS}/topics/{topic}"


def in_background(fn: Callable[[], httpx.Response]) -> Callable[[], tuple[httpx.Response, float]]:
    """Start ``fn`` in a thread; the returned function joins it: (response, seconds)."""
    out: dict[str, object] = {}

    def target() -> None:
        start = time.monotonic()
        out["response"] = fn()
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=target)
    thread.start()

    def join() -> tuple[httpx.Response, float]:
        thread.join(30)
        return out["response"], out["seconds"]  # type: ignore[return-value]

    return join


def test_times_out_empty(api: httpx.Client, live: str) -> None:
    start = time.monotonic()
    r = api.post(live + "/poll", params={"waitMs": 300}, json={})
    elapsed = time.monotonic() - start
    assert (r.status_code, r.json()) == (200, [])
    assert 0.28 <= elapsed < 2.0


def test_answers_at_once_when_messages_exist(api: httpx.Client, live: str) -> None:
    api.post(live + "/publish", json={"messages": ["YQ=="]})
    start = time.monotonic()
    r = api.post(live + "/poll", params={"waitMs": 10_000}, json={})
    assert len(r.json()) == 1
    assert time.monotonic() - start < 1.0


def test_wakes_every_waiter_on_publish(server: ServerProcess, api: httpx.Client, live: str) -> None:
    def wait() -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            return client.post(live + "/poll", params={"waitMs": 20_000}, json={})

    joins = [in_background(wait) for _ in range(3)]
    time.sleep(0.5)
    assert api.post(live + "/publish", json={"messages": ["d2FrZQ=="]}).status_code == 200
    for join in joins:
        r, seconds = join()
        assert r.status_code == 200
        assert [base64.b64decode(m["payload"]) for m in r.json()] == [b"wake"]
        assert seconds < 5.0


def test_publish_elsewhere_does_not_answer(
    server: ServerProcess, api: httpx.Client, live: str
) -> None:
    other = live + "-other"
    api.put(other)
    join = in_background(
        lambda: httpx.post(server.url + live + "/poll", params={"waitMs": 800}, json={}, timeout=30)
    )
    time.sleep(0.2)
    api.post(other + "/publish", json={"messages": ["YQ=="]})
    r, seconds = join()
    assert r.json() == [] and seconds >= 0.75


def test_from_a_position(server: ServerProcess, api: httpx.Client, live: str) -> None:
    api.post(live + "/publish", json={"messages": ["b2xk"]})
    [old] = api.post(live + "/poll", json={}).json()
    join = in_background(
        lambda: httpx.post(
            server.url + live + "/poll",
            params={"waitMs": 20_000},
            json={"startFrom": old["id"], "inclusive": False},
            timeout=30,
        )
    )
    time.sleep(0.3)
    api.post(live + "/publish", json={"messages": ["bmV3"]})
    r, seconds = join()
    assert [base64.b64decode(m["payload"]) for m in r.json()] == [b"new"]
    assert seconds < 5.0


def test_transactional_waits_for_visible(
    server: ServerProcess, api: httpx.Client, live: str
) -> None:
    """An entry of a transaction in progress wakes the poll but is not visible: it waits on."""
    writer = api.post("/v1/transactions").json()
    reader = api.post("/v1/transactions").json()
    join = in_background(
        lambda: httpx.post(
            server.url + live + "/poll",
            params={"waitMs": 700},
            json={"transaction": reader["encoded"]},
            timeout=30,
        )
    )
    time.sleep(0.2)
    body = {"messages": ["YQ=="], "transactionWritePointer": writer["writePointer"]}
    assert api.post(live + "/publish", json=body).status_code == 200
    r, seconds = join()
    assert r.json() == [] and seconds >= 0.65


@pytest.mark.parametrize("wait", ["-1", "abc", "1.5", ""])
def test_bad_wait_is_400(api: httpx.Client, live: str, wait: str) -> None:
    assert api.post(live + "/poll", params={"waitMs": wait}, json={}).status_code == 400


def test_wait_is_capped(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server(TIDINGS_MAX_WAIT_MS="200")
    with httpx.Client(base_url=srv.url, timeout=30) as api:
        api.put(f"{NS}/topics/capped")
        start = time.monotonic()
        r = api.post(f"{NS}/topics/capped/poll", params={"waitMs": 60_000}, json={})
        assert r.json() == [] and time.monotonic() - start < 3.0

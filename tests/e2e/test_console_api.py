"""The read-only endpoints the web console reads (docs/api.md, "Web console"),
through a real server: whoami, transaction details, and the page before a position."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/default"


def _ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [base64.b64decode(m["id"]).hex() for m in answer.json()]


def test_messages_before_a_position_and_at_the_end(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        for batch in range(5):
            client.publish(topic, [f"{batch}-{i}".encode() for i in range(500)])
        every = [m.id.hex for m in client.poll(topic, limit=10_000)]
    assert len(every) == 2500
    url = f"{server.url}{NS}/topics/{topic}/messages"
    answer = httpx.get(url, params={"before": every[1234], "limit": 50})
    assert _ids(answer) == every[1184:1234]
    assert answer.headers["tidings-count"] == "50"
    assert _ids(httpx.get(url, params={"limit": 30})) == every[-30:]
    assert _ids(httpx.get(url)) == every[-20:]  # the default page
    assert _ids(httpx.get(url, params={"before": every[10], "limit": 50})) == every[:10]
    assert _ids(httpx.get(url, params={"before": every[0]})) == []
    # Upper-case hex is an id too; a limit above the maximum is clamped, as a poll's.
    assert _ids(httpx.get(url, params={"before": every[7].upper()})) == every[:7]
    assert len(_ids(httpx.get(url, params={"limit": 2**31 - 1}))) == 2500


def test_messages_before_show_the_newest_within_the_byte_bound(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    server = start_server(TIDINGS_FETCH_MAX_BYTES="1000")
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"%02d" % i + b"x" * 98 for i in range(25)])
        every = [m.id.hex for m in client.consume(topic, follow=False)]
    assert len(every) == 25
    url = f"{server.url}{NS}/topics/{topic}/messages"
    # 15 asked for, 1,000 bytes allowed: the newest 10 (the older ones a page before).
    newest = _ids(httpx.get(url, params={"limit": 15}))
    assert newest == every[-10:]
    assert _ids(httpx.get(url, params={"limit": 15, "before": newest[0]})) == every[5:15]
    assert _ids(httpx.get(url, params={"limit": 3, "before": every[2]})) == every[:2]


def test_messages_before_in_a_crowded_window(server: ServerProcess, topic: str) -> None:
    """More ids in the first time window than one scan reads: the window narrows."""
    with Client(server.url) as client:
        client.create_topic(topic)
        for _ in range(3):
            client.publish(topic, [b"x"] * 10_000)
        newest = client.end(topic).newest_id
    assert newest is not None
    url = f"{server.url}{NS}/topics/{topic}/messages"
    found = _ids(httpx.get(url, params={"limit": 5}))
    assert found[-1] == newest.hex and len(found) == 5 and found == sorted(found)


def test_messages_before_read_committed_stop_at_an_open_transaction(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        open_tx = client.begin(60)
        body = {"transactionWritePointer": open_tx.write_pointer, "messages": ["b3Blbg=="]}
        httpx.post(f"{server.url}{NS}/topics/{topic}/publish", json=body).raise_for_status()
        client.publish(topic, [b"c"])
        url = f"{server.url}{NS}/topics/{topic}/messages"
        uncommitted = httpx.get(url).json()
        committed = httpx.get(url, params={"isolation": "read_committed"}).json()
        client.abort(open_tx)
    assert [base64.b64decode(m["payload"]) for m in uncommitted] == [b"a", b"b", b"open", b"c"]
    assert [base64.b64decode(m["payload"]) for m in committed] == [b"a", b"b"]


@pytest.mark.parametrize(
    "params",
    [
        {"before": ""},
        {"before": "zz"},
        {"before": "00" * 19},
        {"before": " " + "0" * 39},
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "ten"},
        {"limit": "99999999999"},
        {"isolation": "serializable"},
    ],
)
def test_messages_before_refuses_bad_input(
    server: ServerProcess, topic: str, params: dict[str, str]
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
    answer = httpx.get(f"{server.url}{NS}/topics/{topic}/messages", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "BadRequest" and answer.json()["error"]


def test_messages_before_of_an_unknown_topic(server: ServerProcess) -> None:
    answer = httpx.get(f"{server.url}{NS}/topics/never-made/messages")
    assert answer.status_code == 404 and answer.json()["type"] == "TopicNotFound"
    bad = httpx.get(f"{server.url}/v1/namespaces/b@d/topics/t/messages")
    assert bad.status_code == 400 and "error" in bad.json()


def test_transaction_details_name_producers_epochs_and_ages(server: ServerProcess) -> None:
    with Client(server.url) as client:
        producer = client.register_producer("console-details-1")
        producer = client.register_producer("console-details-1")  # epoch 1
        tx = client.begin(120, transactional_id="console-details-1", epoch=producer.epoch)
        anonymous = client.begin()
        try:
            details = httpx.get(server.url + "/v1/transactions/details").json()
        finally:
            client.abort(tx, transactional_id="console-details-1", epoch=producer.epoch)
            client.abort(anonymous)
    by_wp = {t["writePointer"]: t for t in details["inProgress"]}
    mine = by_wp[tx.write_pointer]
    assert mine["transactionalId"] == "console-details-1" and mine["epoch"] == 1
    assert mine["producerId"] == producer.producer_id
    assert mine["timeoutMs"] == 120_000
    assert 0 <= details["now"] - mine["beganAt"] < 60_000
    assert mine["expiresAt"] == mine["beganAt"] + 120_000
    other = by_wp[anonymous.write_pointer]
    assert other["transactionalId"] is None and other["epoch"] is None
    assert other["timeoutMs"] == details["defaultTimeoutMs"] == 30_000
    assert {"transactionalId": "console-details-1", "producerId": producer.producer_id,
            "epoch": 1} in details["producers"]  # fmt: skip
    state = httpx.get(server.url + "/v1/transactions").json()
    assert details["invalid"] == state["invalid"]


def test_transaction_details_need_the_transaction_service(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server("--role", "messaging")
    answer = httpx.get(srv.url + "/v1/transactions/details")
    assert answer.status_code == 503 and answer.json()["type"] == "RoleUnavailable"
    assert httpx.get(srv.url + "/v1/whoami").json()["auth"] is False


def test_whoami_without_and_with_an_auth_file(
    server: ServerProcess, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    assert httpx.get(server.url + "/v1/whoami").json() == {
        "auth": False,
        "name": None,
        "admin": True,
        "publish": ["*"],
        "consume": ["*"],
        "groups": None,
        "queues": None,
    }
    token = "whoami-token-0123456789"
    digest = hashlib.sha256(token.encode()).hexdigest()
    auth = tmp_path / "auth.toml"
    auth.write_text(f'[[principal]]\nname = "ops"\ntoken_sha256 = "{digest}"\nconsume = ["a-*"]\n')
    secured = start_server("--auth-file", str(auth))
    anonymous = httpx.get(secured.url + "/v1/whoami")
    assert anonymous.status_code == 200  # open: the console asks for a token on it
    assert anonymous.json() == {
        "auth": True,
        "name": None,
        "admin": False,
        "publish": [],
        "consume": [],
        "groups": [],
        "queues": [],
    }
    wrong = httpx.get(secured.url + "/v1/whoami", headers={"Authorization": "Bearer nope"})
    assert wrong.json()["name"] is None and "nope" not in wrong.text
    known = httpx.get(secured.url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert known.json() == {
        "auth": True,
        "name": "ops",
        "admin": False,
        "publish": [],
        "consume": ["a-*"],
        "groups": None,
        "queues": None,
    }
    # The console's files are open; its data is not.
    assert httpx.get(secured.url + "/console/").status_code == 200
    assert httpx.get(secured.url + "/v1/transactions/details").status_code == 401
    forbidden = httpx.get(
        secured.url + "/v1/transactions/details", headers={"Authorization": f"Bearer {token}"}
    )
    assert forbidden.status_code == 403

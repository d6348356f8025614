"""Request bodies with unknown or misspelt fields, through the real server: each is a
400 whose JSON error names the field, and nothing changes (no message published, no
ack, no position moved, no transaction begun or ended).

A misspelt field read as an absent one used to be a 200 that did less than asked:
``queueAcks`` for ``acks`` committed a transaction without its acks."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@dataclass
class World:
    """A topic with a queue holding two leased messages, a group member holding a
    position, and an open transaction: what a bad body could change."""

    http: httpx.Client
    topic: str
    ids: list[str]
    member: str
    wp: int

    @property
    def t(self) -> str:
        return f"/v1/namespaces/default/topics/{self.topic}"

    def state(self) -> Any:
        """Everything the requests below could change, as the server reports it."""
        tx = self.http.get("/v1/transactions").json()
        return (
            self.http.get(self.t + "/stats").json()["messageCount"],
            self.http.get(self.t + "/queues/q").json(),
            self.http.get(self.t + "/groups/g").json(),
            sorted(i["writePointer"] for i in tx["inProgress"]),
            tx["invalid"],
        )


@pytest.fixture
def world(server: ServerProcess, topic: str) -> Iterator[World]:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        t = f"/v1/namespaces/default/topics/{topic}"
        assert http.put(t, json={}).status_code == 200
        assert http.post(t + "/publish", json={"messages": [_b64(b"a"), _b64(b"b")]}).is_success
        popped = http.post(t + "/queues/q/pop", json={"consumerId": "c1", "maxMessages": 2})
        assert popped.status_code == 200
        ids = [m["id"] for m in popped.json()]
        assert len(ids) == 2
        member = http.post(t + "/groups/g/join", json={}).json()["memberId"]
        polled = http.post(t + "/groups/g/poll", json={"memberId": member}).json()
        committed = http.post(
            t + "/groups/g/commit",
            json={"memberId": member, "positions": [{"partition": 0, "id": polled[0]["id"]}]},
        )
        assert committed.status_code == 200, committed.text
        wp = http.post("/v1/transactions", json={"timeout": 60}).json()["writePointer"]
        yield World(http, topic, ids, member, wp)
        http.post(f"/v1/transactions/{wp}/abort", json={})


def _cases(w: World) -> list[tuple[str, str, Any, str]]:
    """(method, path, body, the field the error must name)."""
    t, ids, m, wp = w.t, w.ids, w.member, w.wp
    q, g = t + "/queues/q", t + "/groups/g"
    position = {"partition": 0, "id": ids[1]}
    one = "/v1/namespaces/default/transactions/publish"
    ack = {"topic": w.topic, "queue": "q", "consumerId": "c1", "ids": ids}
    group_commit = {"topic": w.topic, "group": "g", "memberId": m, "positions": [position]}
    return [
        # The report: a misspelt list of a one-request transaction.
        ("POST", one, {"topics": [], "queueAcks": [ack]}, "queueAcks"),
        ("POST", one, {"topics": [{"topic": w.topic, "messages": [_b64(b"x")], "key": 1}]}, "key"),
        ("POST", one, {"topics": [], "acks": [{**ack, "consumer": "c2"}]}, "consumer"),
        ("POST", one, {"groupCommits": [{**group_commit, "member": "x"}]}, "member"),
        (
            "POST",
            one,
            {"groupCommits": [{**group_commit, "positions": [{**position, "partiton": 1}]}]},
            "partiton",
        ),
        ("POST", one, {"topics": [{"topic": w.topic, "messages": [1]}]}, "messages[0]"),
        ("POST", one, {"acks": [{**ack, "ids": None}]}, "ids"),
        ("POST", t + "/publish", {"messages": [_b64(b"x")], "extra": []}, "extra"),
        ("POST", t + "/publish", {"messages": [_b64(b"x")], "extras": [{"kye": ""}]}, "kye"),
        (
            "POST",
            t + "/publish",
            {
                "transactionWritePointer": wp,
                "messages": [],
                "payloadRanges": [{"first": [1, 0], "last": [1, 0], "lats": [1, 0]}],
            },
            "lats",
        ),
        ("POST", t + "/poll", {"limt": 1}, "limt"),
        ("POST", "/v1/transactions", {"timout": 5}, "timout"),
        ("POST", f"/v1/transactions/{wp}/commit", {"change": [_b64(b"k")]}, "change"),
        ("POST", f"/v1/transactions/{wp}/abort", {"transactionalID": "p"}, "transactionalID"),
        ("POST", "/v1/transactions/producers", {"transactionalId": "p", "epoch": 0}, "epoch"),
        ("POST", "/v1/transactions/prune", {"bellow": 5}, "bellow"),
        ("POST", g + "/join", {"memberID": "x"}, "memberID"),
        ("POST", g + "/heartbeat", {"memberId": m, "limit": 5}, "limit"),
        ("POST", g + "/leave", {"memberId": m, "force": True}, "force"),
        ("POST", g + "/poll", {"memberId": m, "limt": 5}, "limt"),
        (
            "POST",
            g + "/commit",
            {"memberId": m, "positions": [position], "generaton": 1},
            "generaton",
        ),
        (
            "POST",
            g + "/commit",
            {"memberId": m, "positions": [{**position, "partiton": 0}]},
            "partiton",
        ),
        (
            "POST",
            g + "/commit",
            {"memberId": m, "positions": [{**position, "partition": "0"}]},
            "partition",
        ),
        (
            "POST",
            g + "/rollback",
            {"memberId": m, "transactionWritePointr": wp},
            "transactionWritePointr",
        ),
        ("POST", g + "/reset", {"to": "earliest", "force": True}, "force"),
        ("POST", q + "/pop", {"consumerId": "c2", "maxMessage": 5}, "maxMessage"),
        (
            "POST",
            q + "/ack",
            {"consumerId": "c1", "ids": ids, "transactionWritePointr": wp},
            "transactionWritePointr",
        ),
        ("POST", q + "/ack", {"consumerId": "c1", "ids": None}, "ids"),
        ("POST", q + "/ack", {}, "consumerId"),
        ("POST", q + "/nack", {"consumerId": "c1", "ids": ids, "requeue": False}, "requeue"),
        ("POST", q + "/extend", {"consumerId": "c1", "ids": ids, "ackTimeout": 5}, "ackTimeout"),
        ("POST", q + "/rollback", {"transactionWritePointer": wp, "keepLease": True}, "keepLease"),
        ("POST", q + "/release", {"consumerID": "c1"}, "consumerID"),
    ]


def test_unknown_or_misspelt_fields_are_refused_naming_them_and_change_nothing(
    world: World,
) -> None:
    before = world.state()
    for method, path, body, field in _cases(world):
        answer = world.http.request(method, path, json=body)
        where = f"{path} {body}: {answer.status_code} {answer.text}"
        assert answer.status_code == 400, where
        assert field in answer.json()["error"], where
    assert world.state() == before


@pytest.mark.parametrize("body", [b"[]", b"null", b'"topics"', b"{"])
def test_a_body_that_is_no_json_object_is_refused(world: World, body: bytes) -> None:
    before = world.state()
    for path in (
        "/v1/namespaces/default/transactions/publish",
        world.t + "/queues/q/ack",
        world.t + "/groups/g/commit",
        "/v1/transactions",
    ):
        answer = world.http.post(path, content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, (path, answer.text)
        assert "error" in answer.json()
    assert world.state() == before


def test_a_one_request_transaction_with_nothing_in_it_commits_an_empty_one(
    world: World,
) -> None:
    one = "/v1/namespaces/default/transactions/publish"
    before = world.state()
    answer = world.http.post(one, json={"topics": []})
    assert answer.status_code == 200, answer.text
    # Committed (not left open, not invalid), and nothing else changed.
    assert world.state() == before
    # Without even an empty topics list it is no transaction body at all.
    answer = world.http.post(one, json={})
    assert answer.status_code == 400
    assert "topics" in answer.json()["error"]
    # beginId is taken (and ignored) here, as documented.
    assert world.http.post(one, json={"topics": [], "beginId": "b1"}).status_code == 200
    assert world.state() == before


def test_the_rollback_body_is_a_publish_answer_and_may_carry_more_fields(
    world: World,
) -> None:
    # Sent back as the publish answered it: an answer may gain fields (a newer node of
    # a cluster mid-upgrade), so the rollback lets unknown ones through.
    t = world.t
    published = world.http.post(
        t + "/publish", json={"transactionWritePointer": world.wp, "messages": [_b64(b"z")]}
    )
    assert published.status_code == 200, published.text
    echo = {**published.json(), "somethingNewer": 1}
    answer = world.http.post(t + "/rollback", json=echo)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"rolledBack": 1}

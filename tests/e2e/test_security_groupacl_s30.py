"""Who may use a consumer group or a queue: the auth file's ``groups`` and ``queues``
(Kafka's group ACLs, docs/security.md), through a real server with an auth file.

Every principal below may consume the topics; they differ in the group and queue
names they are granted. A refusal is 403 naming the group or queue and changes
nothing (checked as the admin); an auth file without the fields means what it always
did: every group and queue of a topic the principal may consume.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import Forbidden

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/default"
TOKENS = {
    name: f"{name}-token-{uuid.uuid4().hex}" for name in ("admin", "billing", "legacy", "none")
}
#: name -> the auth file's fields besides name and token.
GRANTS: dict[str, str] = {
    "admin": "admin = true\n",
    "billing": 'consume = ["t-*"]\ngroups = ["billing-*"]\nqueues = ["billing-*"]\n',
    # Written before the fields existed: every group and queue of its topics.
    "legacy": 'consume = ["t-*"]\n',
    "none": 'consume = ["t-*"]\ngroups = []\nqueues = []\n',
}
OURS, THEIRS = "billing-1", "shipping-1"


def _auth_file(path: Path) -> Path:
    text = ""
    for name, fields in GRANTS.items():
        digest = hashlib.sha256(TOKENS[name].encode()).hexdigest()
        text += f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n{fields}'
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("groupacl")
    proc = ServerProcess(where / "data", ["--auth-file", str(_auth_file(where / "auth.toml"))])
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def _http(server: ServerProcess, who: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url + NS,
        headers={"Authorization": f"Bearer {TOKENS[who]}"},
        timeout=10,
    )


def _allowed(who: str, name: str) -> bool:
    return who in ("admin", "legacy") or (who == "billing" and name.startswith("billing-"))


@pytest.fixture
def topic(secured: ServerProcess) -> Iterator[str]:
    """A fresh topic with a few messages, a group and a queue of each name: the group
    with a committed position, the queue with a leased message."""
    name = "t-" + uuid.uuid4().hex[:12]
    with _http(secured, "admin") as admin:
        assert admin.put(f"/topics/{name}", json={}).status_code in (200, 201)
        messages = [base64.b64encode(b"m%d" % i).decode() for i in range(4)]
        assert admin.post(f"/topics/{name}/publish", json={"messages": messages}).is_success
        for group in (OURS, THEIRS):
            url = f"/topics/{name}/groups/{group}"
            member = admin.post(url + "/join", json={"partitions": 1, "start": "earliest"})
            member_id = member.json()["memberId"]
            got = admin.post(url + "/poll", json={"memberId": member_id, "limit": 1})
            assert got.is_success
            last = got.headers["tidings-last-id"]
            positions = [{"partition": 0, "id": _b64_of_hex(last)}]
            done = admin.post(url + "/commit", json={"memberId": member_id, "positions": positions})
            assert done.is_success, done.text
            admin.post(url + "/leave", json={"memberId": member_id})
        for queue in (OURS, THEIRS):
            popped = admin.post(
                f"/topics/{name}/queues/{queue}/pop", json={"consumerId": "w1", "maxMessages": 1}
            )
            assert popped.is_success and popped.headers["tidings-count"] == "1", popped.text
    yield name


def _b64_of_hex(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode()


def _state(server: ServerProcess, topic: str) -> Any:
    """What a refused call must leave as it was: groups, queues and their numbers."""
    with _http(server, "admin") as admin:
        groups = {g: admin.get(f"/topics/{topic}/groups/{g}").json() for g in (OURS, THEIRS)}
        queues = {q: admin.get(f"/topics/{topic}/queues/{q}").json() for q in (OURS, THEIRS)}
        for g in groups.values():
            g.pop("members", None)  # a join that was let in adds one
        return (
            groups,
            queues,
            admin.get(f"/topics/{topic}/groups").json(),
            admin.get(f"/topics/{topic}/queues").json(),
        )


#: (kind, path tail after the group or queue, body); "{m}" is a member id of the
#: caller's own join, where the call is let in.
GROUP_CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "", None),
    ("POST", "/join", {}),
    ("POST", "/heartbeat", {"memberId": "m"}),
    ("POST", "/poll", {"memberId": "m"}),
    ("POST", "/commit", {"memberId": "m", "positions": []}),
    ("POST", "/rollback", {"memberId": "m"}),
    ("POST", "/leave", {"memberId": "m"}),
]
QUEUE_CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "", None),
    ("POST", "/pop", {"consumerId": "w2", "maxMessages": 1}),
    ("POST", "/ack", {"consumerId": "w1", "ids": []}),
    ("POST", "/nack", {"consumerId": "w1", "ids": []}),
    ("POST", "/extend", {"consumerId": "w1", "ids": []}),
    ("POST", "/release", {"consumerId": "w1"}),
    ("POST", "/rollback", {"transactionWritePointer": 1}),
]


@pytest.mark.parametrize("who", ["billing", "legacy", "none"])
def test_group_and_queue_calls_need_the_name(secured: ServerProcess, topic: str, who: str) -> None:
    with _http(secured, who) as http:
        for name in (THEIRS, OURS):
            for kind, base, calls in (
                ("group", f"/topics/{topic}/groups/{name}", GROUP_CALLS),
                ("queue", f"/topics/{topic}/queues/{name}", QUEUE_CALLS),
            ):
                for method, tail, body in calls:
                    if _allowed(who, name) and tail in ("/release", "/nack", "/extend"):
                        continue  # would give the fixture's lease back: not a refusal test
                    before = _state(secured, topic)
                    answer = http.request(method, base + tail, json=body)
                    what = f"{who} {method} {kind} {name}{tail}: {answer.status_code} {answer.text}"
                    assert answer.status_code != 500, what
                    if _allowed(who, name):
                        assert answer.status_code not in (401, 403) or (
                            answer.json().get("type") == "PartitionFenced"
                        ), what
                        continue
                    assert answer.status_code == 403, what
                    assert answer.json()["type"] == "Forbidden", what
                    assert f"{kind} {name!r}" in answer.json()["error"], what
                    assert TOKENS[who] not in answer.text
                    assert _state(secured, topic) == before, what
            # Resetting, deleting and purging stay the admins'.
            for method, tail in (
                ("POST", f"/topics/{topic}/groups/{name}/reset"),
                ("DELETE", f"/topics/{topic}/groups/{name}"),
                ("POST", f"/topics/{topic}/queues/{name}/purge"),
                ("DELETE", f"/topics/{topic}/queues/{name}"),
            ):
                answer = http.request(
                    method, tail, json={"to": "earliest"} if "reset" in tail else None
                )
                assert answer.status_code == 403, (who, method, tail, answer.text)


@pytest.mark.parametrize("who", ["admin", "billing", "legacy", "none"])
def test_lists_show_only_granted_names(secured: ServerProcess, topic: str, who: str) -> None:
    granted = [n for n in (OURS, THEIRS) if _allowed(who, n)]
    with _http(secured, who) as http:
        assert http.get(f"/topics/{topic}/groups").json() == granted
        assert http.get(f"/topics/{topic}/queues").json() == granted
        everywhere = http.get("/queues").json()
        assert [q["queue"] for q in everywhere if q["topic"] == topic] == granted
        lags = http.get(f"/topics/{topic}/stats").json()["groupLag"]
        assert sorted(lags) == granted


def _one_request(
    http: httpx.Client, topic: str, *, group: str | None = None, queue: str | None = None
) -> httpx.Response:
    body: dict[str, Any] = {"topics": []}
    if group is not None:
        positions = [{"partition": 0, "id": base64.b64encode(bytes(20)).decode()}]
        body["groupCommits"] = [
            {"topic": topic, "group": group, "memberId": "m", "positions": positions}
        ]
    if queue is not None:
        ids = [base64.b64encode(bytes(20)).decode()]
        body["acks"] = [{"topic": topic, "queue": queue, "consumerId": "w1", "ids": ids}]
    return http.post("/transactions/publish", json=body)


@pytest.mark.parametrize("who", ["billing", "legacy", "none"])
def test_one_request_transaction_needs_the_names(
    secured: ServerProcess, topic: str, who: str
) -> None:
    with _http(secured, who) as http:
        for name in (THEIRS, OURS):
            for kind, answer in (
                ("group", _one_request(http, topic, group=name)),
                ("queue", _one_request(http, topic, queue=name)),
            ):
                what = f"{who} {kind} {name}: {answer.status_code} {answer.text}"
                assert answer.status_code != 500, what
                if _allowed(who, name):
                    assert answer.status_code not in (401, 403) or (
                        answer.json().get("type") == "PartitionFenced"
                    ), what
                else:
                    assert answer.status_code == 403, what
                    assert f"{kind} {name!r}" in answer.json()["error"], what


def test_step_by_step_transaction_commit_needs_the_group(
    secured: ServerProcess, topic: str
) -> None:
    """A group commit and a queue ack under a transaction's write pointer, through the
    real client: the begin is anyone's, the positions and acks are the grant's."""
    before = _state(secured, topic)
    with Client(secured.url, token=TOKENS["billing"]) as client:
        tx = client.begin()
        try:
            with _http(secured, "billing") as http:
                for tail, body in (
                    (f"/groups/{THEIRS}/commit", {"memberId": "m", "positions": []}),
                    (f"/queues/{THEIRS}/ack", {"consumerId": "w1", "ids": []}),
                ):
                    body["transactionWritePointer"] = tx.write_pointer
                    answer = http.post(f"/topics/{topic}{tail}", json=body)
                    assert answer.status_code == 403, answer.text
        finally:
            client.abort(tx)
        with pytest.raises(Forbidden, match=THEIRS):
            client.describe_group(topic, THEIRS)
        with pytest.raises(Forbidden, match=THEIRS):
            client.describe_queue(topic, THEIRS)
        assert client.describe_group(topic, OURS).group == OURS
        assert client.groups(topic) == [OURS]
        assert client.queues(topic) == [(topic, OURS)]
    assert _state(secured, topic) == before


def test_auth_file_fields_must_be_lists(tmp_path: Path) -> None:
    from tidings.errors import ConfigError
    from tidings.server.auth import load_principals

    digest = hashlib.sha256(b"x").hexdigest()
    path = tmp_path / "auth.toml"
    for bad in ('groups = "billing-*"', "queues = [1]"):
        path.write_text(f'[[principal]]\nname = "p"\ntoken_sha256 = "{digest}"\n{bad}\n')
        with pytest.raises(ConfigError, match="must be a list of patterns"):
            load_principals(path)
    path.write_text(f'[[principal]]\nname = "p"\ntoken_sha256 = "{digest}"\nconsume = ["t"]\n')
    (legacy,) = load_principals(path)
    assert legacy.groups is None and legacy.queues is None
    assert legacy.may_use_group("anything") and legacy.may_use_queue("anything")

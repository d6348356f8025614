"""Group positions in the one-request transaction (``groupCommits``), through the real
server and the real clients (issue: consumer groups, the copier's benchmark goal)."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_groups import drain, fill
from tests.e2e.test_security import auth_file
from tidings import AsyncClient, Client
from tidings.errors import TopicNotFound
from tidings.structs import MessageId

pytestmark = pytest.mark.e2e


def b64(i: MessageId) -> str:
    return base64.b64encode(i.to_bytes()).decode()


def positions(client: Client, topic: str, group: str) -> list[MessageId | None]:
    return [p.position for p in client.describe_group(topic, group).partitions]


def no_step_by_step_commits(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a position goes by the group commit endpoint (not in the one
    request)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a group commit went outside the one request")

    monkeypatch.setattr(client._api, "group_commit", refuse)


def test_positions_in_one_request_move_iff_it_commits(
    server: ServerProcess, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 40, keys=4)
        client.create_topic(topic + "-out")
        consumer = client.consume(topic, group="g", follow=False, partitions=4, batch_size=10)
        no_step_by_step_commits(client, monkeypatch)
        first = consumer.poll()
        with client.transaction() as tx:
            tx.publish(topic + "-out", [m.payload for m in first])
            consumer.commit(transaction=tx)
        assert tx.state == "committed"
        after_first = positions(client, topic, "g")
        assert max(p for p in after_first if p is not None) == first[-1].id

        second = consumer.poll()
        with pytest.raises(RuntimeError, match="changed my mind"), client.transaction() as tx:
            tx.publish(topic + "-out", [m.payload for m in second])
            consumer.commit(transaction=tx)
            raise RuntimeError("changed my mind")
        # Nothing was sent: no output, no position; the batch comes again.
        assert positions(client, topic, "g") == after_first
        again = consumer.poll()
        assert [m.id for m in again] == [m.id for m in second]

        # The server refuses the transaction (an unknown output topic): it rolls the
        # positions back, and the member gets the batch once more.
        with pytest.raises(TopicNotFound), client.transaction() as tx:
            tx.publish(topic + "-nowhere", [m.payload for m in again])
            consumer.commit(transaction=tx)
        assert tx.state == "aborted"
        assert positions(client, topic, "g") == after_first
        assert [m.id for m in consumer.poll()] == [m.id for m in second]

        out = [m.payload for m in client.poll(topic + "-out", limit=100)]
        assert out == [m.payload for m in first]
        consumer.close()


def test_a_copier_in_one_request_copies_each_message_once(
    server: ServerProcess, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Client(server.url) as client:
        records = fill(client, topic, 95, keys=7)
        client.create_topic(topic + "-out")
        a = client.consume(topic, group="copy", follow=False, partitions=8, batch_size=10)
        no_step_by_step_commits(client, monkeypatch)
        copied = 0
        failed_once = False
        while page := a.poll():
            if not failed_once:
                failed_once = True  # an aborted transaction first: the page comes again
                with pytest.raises(ValueError), client.transaction() as tx:
                    a.commit(transaction=tx)
                    raise ValueError
                continue
            with client.transaction() as tx:
                tx.publish(topic + "-out", [m.payload for m in page])
                a.commit(transaction=tx)
            copied += len(page)
        a.close()
        out = client.poll(topic + "-out", limit=1000)
        assert sorted(m.payload for m in out) == sorted(r.payload for r in records)
        assert copied == 95
        info = client.describe_group(topic, "copy")
        assert sum(p.lag for p in info.partitions) == 0


async def test_async_member_commits_in_one_request(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as sync_client:
        fill(sync_client, topic, 30, keys=3)
        sync_client.create_topic(topic + "-out")
    async with AsyncClient(server.url) as client:
        consumer = client.consume(topic, group="g", follow=False, partitions=4, batch_size=100)
        page = await consumer.poll()
        async with client.transaction() as tx:
            await tx.publish(topic + "-out", [m.payload for m in page])
            await consumer.commit(transaction=tx)
        info = await client.describe_group(topic, "g")
        assert sum(p.lag for p in info.partitions) == 0
        await consumer.close()


def test_one_request_of_a_zombie_is_fenced_and_changes_nothing(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 10, keys=1)
        client.create_topic(topic + "-out")
        zombie = client.consume(topic, group="g", follow=False, partitions=1, session_timeout=0.3)
        batch = zombie.poll()
        assert zombie.member_id is not None
        fresh = client.consume(topic, group="g", follow=False, session_timeout=30)
        time.sleep(0.6)  # the zombie misses its session...
        fresh.heartbeat()  # ...and its partition moves
        body = {
            "topics": [{"topic": topic + "-out", "messages": ["eA=="]}],
            "groupCommits": [
                {"topic": topic, "group": "g", "memberId": zombie.member_id,
                 "positions": [{"partition": 0, "id": b64(batch[-1].id)}]},
            ],
        }  # fmt: skip
        url = f"{server.url}/v1/namespaces/default/transactions/publish"
        answer = httpx.post(url, json=body)
        assert answer.status_code == 403, answer.text
        assert answer.json()["type"] == "PartitionFenced" and answer.json()["error"]
        assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        assert positions(client, topic, "g") == [None]
        assert [m.id for m in drain(fresh)] == [m.id for m in batch]
        fresh.close()


def _bad_bodies(topic: str, member: str, delivered: MessageId, beyond: MessageId) -> list[Any]:
    def commit(**fields: Any) -> dict[str, Any]:
        item = {"topic": topic, "group": "g", "memberId": member,
                "positions": [{"partition": 0, "id": b64(delivered)}]}  # fmt: skip
        item.update(fields)
        return {"topics": [{"topic": topic + "-out", "messages": ["eA=="]}], "groupCommits": [item]}

    return [
        (400, commit(group="bad name!")),
        (400, commit(positions=[{"partition": 0, "id": b64(beyond)}])),
        (403, commit(memberId="nosuchmember")),
        (400, commit(memberId="not a member id")),
        (404, commit(group="nosuchgroup")),
        (400, commit(positions=[])),
        (400, commit(positions=[{"partition": 5000, "id": b64(delivered)}])),
        (400, commit(transactionWritePointer=5)),
        (400, {"topics": [], "groupCommits": "g"}),
        (400, {"topics": [], "groupCommits": [commit()["groupCommits"][0]] * 2}),
    ]


def test_bad_group_commits_answer_4xx_and_change_nothing(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        fill(client, topic, 20, keys=1)
        client.create_topic(topic + "-out")
        member = client.consume(topic, group="g", follow=False, partitions=1, batch_size=5)
        delivered = member.poll()
        assert member.member_id is not None
        everything = client.poll(topic, limit=100)
        url = f"{server.url}/v1/namespaces/default/transactions/publish"
        before = client.describe_group(topic, "g")
        # Other tests on this shared server may have left theirs open: none of ours.
        open_before = client.transactions().in_progress
        for status, body in _bad_bodies(
            topic, member.member_id, delivered[-1].id, everything[-1].id
        ):
            answer = httpx.post(url, json=body)
            assert answer.status_code == status, (body, answer.text)
            assert isinstance(answer.json()["error"], str)
            assert client.poll(topic + "-out", transaction=client.snapshot()) == []
            after = client.describe_group(topic, "g")
            assert after.partitions == before.partitions and after.members == before.members
        assert set(client.transactions().in_progress) <= set(open_before)  # none left
        # The member carries on where it was: what it was delivered counts.
        member.commit()
        assert positions(client, topic, "g") == [delivered[-1].id]
        member.close()


def test_another_open_transaction_on_the_partition_fails_the_one_request(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        fill(client, topic, 10, keys=1)
        client.create_topic(topic + "-out")
        member = client.consume(topic, group="g", follow=False, partitions=1, batch_size=5)
        batch = member.poll()
        assert member.member_id is not None
        holder = client.transaction(defer_begin=False)
        with holder:
            member.commit(transaction=holder)  # its position now waits under holder
            body = {
                "topics": [{"topic": topic + "-out", "messages": ["eA=="]}],
                "groupCommits": [
                    {"topic": topic, "group": "g", "memberId": member.member_id,
                     "positions": [{"partition": 0, "id": b64(batch[-1].id)}]},
                ],
            }  # fmt: skip
            url = f"{server.url}/v1/namespaces/default/transactions/publish"
            answer = httpx.post(url, json=body)
            assert answer.status_code == 409, answer.text
            assert answer.json()["type"] == "TransactionConflict"
            assert client.poll(topic + "-out", transaction=client.snapshot()) == []
        assert positions(client, topic, "g") == [batch[-1].id]  # the holder's
        member.close()


def _principal(name: str, token: str, **fields: list[str]) -> str:
    digest = hashlib.sha256(token.encode()).hexdigest()
    lines = ["[[principal]]", f'name = "{name}"', f'token_sha256 = "{digest}"']
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def test_group_commits_need_consume_on_their_topic(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # "copier" may publish to t-out and consume t-in; "publisher" may only publish.
    copier_token, publisher_token = "copier-token-0123456789", "publisher-token-0123456789"
    extra = _principal("copier", copier_token, publish=["t-*"], consume=["t-in"])
    extra += _principal("publisher", publisher_token, publish=["t-*"])
    srv = start_server("--auth-file", str(auth_file(tmp_path / "auth.toml", extra)))
    admin = Client(srv.url, token="admin-token-0123456789")
    fill(admin, "t-in", 5, keys=1)
    admin.create_topic("t-out")
    copier = Client(srv.url, token=copier_token)
    member = copier.consume("t-in", group="g", follow=False, partitions=1)
    batch = member.poll()
    assert member.member_id is not None
    body = {
        "topics": [{"topic": "t-out", "messages": ["eA=="]}],
        "groupCommits": [
            {"topic": "t-in", "group": "g", "memberId": member.member_id,
             "positions": [{"partition": 0, "id": b64(batch[-1].id)}]},
        ],
    }  # fmt: skip
    url = f"{srv.url}/v1/namespaces/default/transactions/publish"
    refused = httpx.post(url, json=body, headers={"Authorization": f"Bearer {publisher_token}"})
    assert refused.status_code == 403 and refused.json()["error"]
    assert admin.poll("t-out") == []
    assert positions(admin, "t-in", "g") == [None]
    allowed = httpx.post(url, json=body, headers={"Authorization": f"Bearer {copier_token}"})
    assert allowed.status_code == 200, allowed.text
    assert positions(admin, "t-in", "g") == [batch[-1].id]
    assert len(admin.poll("t-out")) == 1
    copier.close()
    admin.close()


def test_held_positions_go_under_the_write_pointer_when_the_transaction_begins_early(
    server: ServerProcess, topic: str
) -> None:
    # Held for the one request, then the publish passes the payload threshold: the
    # transaction begins, and the positions go under its write pointer (with their
    # change keys), moving iff it commits.
    with Client(server.url) as client:
        fill(client, topic, 20, keys=1)
        client.create_topic(topic + "-out")
        consumer = client.consume(topic, group="g", follow=False, partitions=1, batch_size=5)
        page = consumer.poll()
        with pytest.raises(ValueError), client.transaction(payload_threshold=10) as tx:
            consumer.commit(transaction=tx)
            tx.publish(topic + "-out", [b"x" * 100])  # past the threshold: begins now
            assert tx.state == "active" and tx.transaction.write_pointer > 0
            raise ValueError
        assert positions(client, topic, "g") == [None]
        assert [m.id for m in consumer.poll()] == [m.id for m in page]
        with client.transaction(payload_threshold=10) as tx:
            consumer.commit(transaction=tx)
            tx.publish(topic + "-out", [b"x" * 100])
        assert positions(client, topic, "g") == [page[-1].id]
        assert len(client.poll(topic + "-out", transaction=client.snapshot())) == 1
        consumer.close()


def _store_commits(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=5).text
    lines = [ln for ln in text.splitlines() if ln.startswith("tidings_store_commits")]
    assert lines, "the server reports its store commits"
    return int(float(lines[0].split()[-1]))


def test_positions_messages_and_commit_are_one_store_write(tmp_path: Path) -> None:
    """The copier's transaction (publish + positions in one request) is one durable
    write on the server: the positions ride in the store write of the messages, which
    also carries the commit."""
    own = ServerProcess(tmp_path / "data").start()
    try:
        with Client(own.url) as client:
            fill(client, "in", 60, keys=6)
            client.create_topic("out")
            consumer = client.consume("in", group="g", follow=False, partitions=4, batch_size=10)
            batches = []
            written = 0
            for _ in range(5):
                batch = consumer.poll()
                assert batch
                batches.append(batch)
                before = _store_commits(own.url)
                with client.transaction() as tx:
                    tx.publish("out", [m.payload for m in batch])
                    consumer.commit(transaction=tx)
                assert tx.state == "committed"
                written += _store_commits(own.url) - before
            # One store commit per transaction (two if the positions went alone); a
            # background write of the server's own may add one.
            assert len(batches) <= written <= len(batches) + 1, written
            assert positions(client, "in", "g") != [None] * 4
            copied = [m.payload for m in client.poll("out", limit=100)]
            assert copied == [m.payload for batch in batches for m in batch]
    finally:
        own.stop()

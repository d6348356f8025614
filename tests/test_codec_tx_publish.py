"""The one-request transaction's Avro body: the hand-written writer and reader agree
with fastavro; what the client writes, the server reads back as the same messages
(stored under the transaction's write pointer), acks and group positions as the JSON
body gives them."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.budget import examples
from tidings.client.api import _transaction_body
from tidings.codec import admin, avro, queue_bodies, tx_publish
from tidings.codec.stored_publish import StoredBatch
from tidings.errors import BadRequest
from tidings.messaging import publishing
from tidings.server.routes.transactions import _batches, _under
from tidings.structs import MessageId, Record

NOW = 1_700_000_000_000

names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
records = st.one_of(
    st.binary(max_size=300),
    st.builds(
        Record,
        st.binary(max_size=300),
        st.none() | st.binary(max_size=150),
        st.dictionaries(st.text(max_size=8), st.binary(max_size=40), max_size=2),
        st.none() | st.integers(1, 10**6),
    ),
)
ids = st.builds(
    MessageId,
    st.integers(0, 2**63 - 1),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**63 - 1),
    st.integers(0, 0xFFFF),
)
acks = st.builds(
    queue_bodies.TransactionAck,
    names,
    names,
    st.from_regex(r"[A-Za-z0-9]{1,20}", fullmatch=True),
    st.lists(ids, min_size=1, max_size=5),
)
generations = st.none() | st.integers(0, 2**31)


@st.composite
def group_commits(draw: st.DrawFn) -> admin.TransactionGroupCommit:
    positions = draw(st.dictionaries(st.integers(0, 1000), ids, min_size=1, max_size=4))
    # Some positions name the generation they are of (as the client's do where a
    # transaction holds positions of a member taken across a rebalance).
    named = draw(st.dictionaries(st.sampled_from(sorted(positions)), st.integers(0, 2**31)))
    return admin.TransactionGroupCommit(
        draw(names), draw(names), draw(names), positions, draw(generations), named or None
    )


@settings(max_examples=examples(60), deadline=None)
@given(
    st.dictionaries(names, st.lists(records, min_size=1, max_size=8), max_size=3),
    st.none() | st.floats(0.5, 3600),
    st.lists(acks, max_size=2),
    st.lists(group_commits(), max_size=2, unique_by=lambda c: (c.topic, c.group, c.member_id)),
    st.integers(1, 2**63 - 1),
)
def test_the_server_reads_what_the_client_wrote(
    topics: dict[str, list[Record | bytes]],
    timeout: float | None,
    ack_list: list[queue_bodies.TransactionAck],
    commits: list[admin.TransactionGroupCommit],
    write_pointer: int,
) -> None:
    batches = list(topics.items())
    body = _transaction_body(batches, timeout, "tid", 3, ack_list, commits)
    assert body is not None
    obj = tx_publish.read_transaction_publish(body)
    assert obj == _fastavro_read(body)
    # Without group positions, the body is what it was before their generations were
    # added (so servers from before then read it too).
    assert obj["groupCommitGenerations"] == [] or commits
    assert admin.read_begin_request(obj) == (timeout, ("tid", 3))
    assert queue_bodies.read_transaction_acks(obj, binary=True) == ack_list
    # The same as the JSON body's, field by field.
    as_json = orjson.loads(orjson.dumps({"acks": queue_bodies.transaction_acks_json(ack_list)}))
    assert queue_bodies.read_transaction_acks(as_json) == ack_list
    read_commits = admin.read_transaction_group_commits(obj, binary=True)
    # The generations the positions are of, as the JSON body gives them.
    assert read_commits == commits
    as_json = orjson.loads(
        orjson.dumps({"groupCommits": admin.transaction_group_commits_json(commits)})
    )
    assert admin.read_transaction_group_commits(as_json) == commits
    read = _under(_batches(obj, binary=True), write_pointer)
    assert [topic for topic, _ in read] == list(topics)
    for (_, messages), (_, sent) in zip(read, batches, strict=True):
        if isinstance(messages, StoredBatch):  # read straight into the stored values
            assert messages.values == publishing.encode_batch(sent, write_pointer, NOW).values
        else:  # the general path (a TTL, a long key): the records as sent
            assert [_fields(r) for r in messages] == [_fields(r) for r in sent]


def _fastavro_read(body: bytes) -> dict[str, object]:
    """The body as fastavro reads it: of the schema, or of the schema before
    ``groupCommitGenerations`` was added (which then names none)."""
    try:
        value: dict[str, object] = avro.read(body, avro.TRANSACTION_PUBLISH_REQUEST, "")
    except BadRequest:
        value = avro.read(body, avro.TRANSACTION_PUBLISH_REQUEST_V1, "")
        value["groupCommitGenerations"] = []
    return value


def _fields(r: Record | bytes) -> tuple[object, ...]:
    return (r, None, {}, None) if isinstance(r, bytes) else (r[0], r[1], dict(r[2]), r[3])


def test_values_read_without_a_pointer_take_the_transactions() -> None:
    sent: list[Record | bytes] = [
        b"plain",
        Record(b"keyed", key=b"k"),
        Record(b"headed", key=b"k2", headers={"h": b"v"}),
    ]
    obj = tx_publish.read_transaction_publish(
        _transaction_body([("t", sent)], None, None, None, (), ()) or b""
    )
    [(_, batch)] = _batches(obj, binary=True)
    assert isinstance(batch, StoredBatch) and batch.stored_pointer is None
    under = batch.under(42)
    assert (under.write_pointer, under.stored_pointer) == (42, 42)
    assert under.values == publishing.encode_batch(sent, 42, NOW).values
    assert batch.values == publishing.encode_batch(sent, None, NOW).values


envelopes = st.builds(
    lambda timeout, tid, epoch, topics, ack_list, commits: {
        "timeout": timeout,
        "transactionalId": tid,
        "epoch": epoch,
        "topics": [{"topic": t, "body": b} for t, b in topics],
        "acks": queue_bodies.transaction_acks_avro(ack_list),
        "groupCommits": admin.transaction_group_commits_avro(commits),
        "groupCommitGenerations": admin.transaction_group_generations_avro(commits),
    },
    st.none() | st.floats(allow_nan=False),
    st.none() | st.text(max_size=10),
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=40)), max_size=3),
    st.lists(acks, max_size=2),
    st.lists(group_commits(), max_size=2),
)


def _write(envelope: dict[str, object]) -> bytes:
    e: dict[str, object] = envelope
    return tx_publish.write_transaction_publish(
        [(t["topic"], t["body"]) for t in e["topics"]],  # type: ignore[attr-defined]
        e["timeout"],  # type: ignore[arg-type]
        e["transactionalId"],  # type: ignore[arg-type]
        e["epoch"],  # type: ignore[arg-type]
        queue_bodies.read_transaction_acks(e, binary=True),
        admin.read_transaction_group_commits(e, binary=True),
    )


@settings(max_examples=examples(50), deadline=None)
@given(envelopes)
def test_the_hand_written_body_is_fastavros(envelope: dict[str, object]) -> None:
    body = avro.write(envelope, avro.TRANSACTION_PUBLISH_REQUEST)
    assert tx_publish.read_transaction_publish(body) == envelope
    try:
        written = _write(envelope)
    except BadRequest:
        return  # names the acks and commits check would refuse anyway
    # Without group positions the client leaves out their (empty) generations.
    assert written == (body if envelope["groupCommits"] else body[:-1])
    assert tx_publish.read_transaction_publish(written) == envelope


@settings(max_examples=examples(60), deadline=None)
@given(envelopes, st.integers(0, 10**6), st.integers(0, 255), st.booleans())
def test_a_damaged_body_reads_as_fastavro_reads_it(
    envelope: dict[str, object], where: int, byte: int, cut: bool
) -> None:
    body = bytearray(avro.write(envelope, avro.TRANSACTION_PUBLISH_REQUEST))
    at = where % len(body)
    damaged = bytes(body[:at] if cut else body[:at] + bytes((byte,)) + body[at + 1 :])
    try:
        expected = _fastavro_read(damaged)
    except BadRequest:
        with pytest.raises(BadRequest):
            tx_publish.read_transaction_publish(damaged)
        return
    got = tx_publish.read_transaction_publish(damaged)
    # A damaged timeout may read as NaN, which equals nothing, itself included.
    assert got == expected or repr(got) == repr(expected)

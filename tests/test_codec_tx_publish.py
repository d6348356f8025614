"""The one-request transaction's Avro body: what the client writes, the server reads
back as the same messages (stored under the transaction's write pointer), acks and
group positions as the JSON body gives them."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.client.api import _avro_transaction
from tidings.codec import admin, avro, queue_bodies
from tidings.codec.stored_publish import StoredBatch
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
group_commits = st.builds(
    admin.TransactionGroupCommit,
    names,
    names,
    names,
    st.dictionaries(st.integers(0, 1000), ids, min_size=1, max_size=4),
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(names, st.lists(records, min_size=1, max_size=8), max_size=3),
    st.none() | st.floats(0.5, 3600),
    st.lists(acks, max_size=2),
    st.lists(group_commits, max_size=2, unique_by=lambda c: (c.topic, c.group, c.member_id)),
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
    body = _avro_transaction(batches, timeout, "tid", 3, ack_list, commits)
    obj = avro.read(body, avro.TRANSACTION_PUBLISH_REQUEST, "transactional publish")
    assert admin.read_begin_request(obj) == (timeout, ("tid", 3))
    assert queue_bodies.read_transaction_acks(obj, binary=True) == ack_list
    # The same as the JSON body's, field by field.
    as_json = orjson.loads(orjson.dumps({"acks": queue_bodies.transaction_acks_json(ack_list)}))
    assert queue_bodies.read_transaction_acks(as_json) == ack_list
    read_commits = admin.read_transaction_group_commits(obj, binary=True)
    assert read_commits == commits
    read = _under(_batches(obj, binary=True), write_pointer)
    assert [topic for topic, _ in read] == list(topics)
    for (_, messages), (_, sent) in zip(read, batches, strict=True):
        if isinstance(messages, StoredBatch):  # read straight into the stored values
            assert messages.values == publishing.encode_batch(sent, write_pointer, NOW).values
        else:  # the general path (a TTL, a long key): the records as sent
            assert [_fields(r) for r in messages] == [_fields(r) for r in sent]


def _fields(r: Record | bytes) -> tuple[object, ...]:
    return (r, None, {}, None) if isinstance(r, bytes) else (r[0], r[1], dict(r[2]), r[3])


def test_values_read_without_a_pointer_take_the_transactions() -> None:
    sent: list[Record | bytes] = [
        b"plain",
        Record(b"keyed", key=b"k"),
        Record(b"headed", key=b"k2", headers={"h": b"v"}),
    ]
    obj = avro.read(
        _avro_transaction([("t", sent)], None, None, None, (), ()),
        avro.TRANSACTION_PUBLISH_REQUEST,
        "transactional publish",
    )
    [(_, batch)] = _batches(obj, binary=True)
    assert isinstance(batch, StoredBatch) and batch.stored_pointer is None
    under = batch.under(42)
    assert (under.write_pointer, under.stored_pointer) == (42, 42)
    assert under.values == publishing.encode_batch(sent, 42, NOW).values
    assert batch.values == publishing.encode_batch(sent, None, NOW).values

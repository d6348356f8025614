"""The hand-written Avro poll-response encoder agrees with fastavro byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.codec import wire
from tidings.structs import Message, MessageId

ids = st.builds(
    MessageId,
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**16 - 1),
)
payloads = st.one_of(st.binary(max_size=200), st.binary(min_size=16380, max_size=16390))
messages = st.builds(
    Message,
    ids,
    payloads,
    st.none() | st.binary(max_size=100),
    st.dictionaries(st.text(max_size=80), st.binary(max_size=100), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, max_size=40))
def test_matches_fastavro(batch: list[Message]) -> None:
    plain = wire._avro_write(
        [{"id": m.id.to_bytes(), "payload": m.payload} for m in batch], wire.MESSAGES
    )
    assert wire.encode_messages(batch, wire.AVRO) == plain
    extended = wire._avro_write(
        [
            {"id": m.id.to_bytes(), "payload": m.payload, "key": m.key, "headers": m.headers}
            for m in batch
        ],
        wire.MESSAGES_EXT,
    )
    assert wire.encode_messages(batch, wire.AVRO_EXT) == extended
    assert wire.decode_messages(extended, wire.AVRO_EXT) == batch
    assert [(m.id, m.payload) for m in wire.decode_messages(plain, wire.AVRO)] == [
        (m.id, m.payload) for m in batch
    ]

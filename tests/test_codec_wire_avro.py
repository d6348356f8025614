"""The hand-written Avro poll-response encoder agrees with fastavro byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.codec import avro, wire
from tidings.errors import BadRequest, TidingsError
from tidings.structs import Message, MessageId, Record

ids = st.builds(
    MessageId,
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**16 - 1),
)
# Payloads around 16,384 bytes cross the varint length's second-byte boundary. They are
# built from a short random run repeated, not drawn byte by byte: hypothesis refuses
# (health check) examples that draw that much data.
big = st.builds(
    lambda size, run: (run * (size // len(run) + 1))[:size],
    st.integers(16380, 16390),
    st.binary(min_size=1, max_size=8),
)
payloads = st.one_of(st.binary(max_size=200), big)
messages = st.builds(
    Message,
    ids,
    payloads,
    st.none() | st.binary(max_size=100),
    st.dictionaries(st.text(max_size=80), st.binary(max_size=100), max_size=3),
    st.none(),
)
small_messages = st.builds(
    Message,
    ids,
    st.binary(max_size=30),
    st.none() | st.binary(max_size=10),
    st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=2),
    st.none(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, max_size=40))
def test_matches_fastavro(batch: list[Message]) -> None:
    plain = avro.write(
        [{"id": m.id.to_bytes(), "payload": m.payload} for m in batch], avro.MESSAGES
    )
    assert wire.encode_messages(batch, wire.AVRO) == plain
    extended = avro.write(
        [
            {"id": m.id.to_bytes(), "payload": m.payload, "key": m.key, "headers": m.headers}
            for m in batch
        ],
        avro.MESSAGES_EXT,
    )
    assert wire.encode_messages(batch, wire.AVRO_EXT) == extended
    assert [_plain(m) for m in wire.decode_messages(extended, wire.AVRO_EXT)] == [
        _plain(m) for m in batch
    ]
    assert [(m.id, m.payload) for m in wire.decode_messages(plain, wire.AVRO)] == [
        (m.id, m.payload) for m in batch
    ]


def _plain(m: Message) -> tuple[object, ...]:
    return (m.id, m.payload, m.key, dict(m.headers))


@settings(max_examples=30, deadline=None)
@given(st.lists(messages, max_size=20))
def test_hand_written_decoder_reads_what_fastavro_writes(batch: list[Message]) -> None:
    extended = avro.write(
        [
            {"id": m.id.to_bytes(), "payload": m.payload, "key": m.key, "headers": m.headers}
            for m in batch
        ],
        avro.MESSAGES_EXT,
    )
    assert [_plain(m) for m in wire.decode_messages(extended, wire.AVRO_EXT)] == [
        _plain(m) for m in batch
    ]
    plain = avro.write(
        [{"id": m.id.to_bytes(), "payload": m.payload} for m in batch], avro.MESSAGES
    )
    assert [(m.id, m.payload) for m in wire.decode_messages(plain, wire.AVRO)] == [
        (m.id, m.payload) for m in batch
    ]


@settings(max_examples=40, deadline=None)
@given(st.lists(small_messages, min_size=1, max_size=5), st.data())
def test_decoder_rejects_truncated_or_extended_bodies(
    batch: list[Message], data: st.DataObject
) -> None:
    for media in (wire.AVRO, wire.AVRO_EXT):
        body = wire.encode_messages(batch, media)
        cut = data.draw(st.integers(0, len(body) - 1))
        for broken in (body[:cut], body + b"\x00"):
            try:
                wire.decode_messages(broken, media)
            except BadRequest:
                continue
            raise AssertionError(f"accepted a broken body: {broken!r}")


@settings(max_examples=60, deadline=None)
@given(
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.lists(st.one_of(st.binary(max_size=200), big)),
)
def test_publish_encoder_matches_fastavro(write_pointer: int | None, payloads: list[bytes]) -> None:
    value = {"transactionWritePointer": write_pointer, "messages": payloads}
    assert wire.encode_publish_request(write_pointer, payloads, wire.AVRO) == avro.write(
        value, avro.PUBLISH_REQUEST
    )
    assert wire.encode_publish_request(write_pointer, payloads, wire.AVRO_EXT) == avro.write(
        {**value, "extras": None}, avro.PUBLISH_REQUEST_EXT
    )
    for media in (wire.AVRO, wire.AVRO_EXT):
        decoded = wire.decode_publish_request(
            wire.encode_publish_request(write_pointer, payloads, media), media
        )
        assert decoded.write_pointer == write_pointer
        assert [r if isinstance(r, bytes) else r.payload for r in decoded.records] == payloads


@settings(max_examples=200, deadline=None)
@given(
    st.none() | ids | st.integers(0, 2**63 - 1),
    st.booleans(),
    st.none() | st.integers(1, 2**31 - 1),
    st.none() | st.binary(max_size=300),
)
def test_consume_request_encoder_matches_fastavro(
    start: MessageId | int | None, inclusive: bool, limit: int | None, tx: bytes | None
) -> None:
    req = wire.ConsumeRequest(start, inclusive, limit, tx)
    value = {
        "startFrom": start.to_bytes() if isinstance(start, MessageId) else start,
        "inclusive": inclusive,
        "limit": limit,
        "transaction": tx,
    }
    for media in (wire.AVRO, wire.AVRO_EXT):
        body = wire.encode_consume_request(req, media)
        assert body == avro.write(value, avro.CONSUME_REQUEST)
        assert wire.decode_consume_request(body, media) == req


@settings(max_examples=60, deadline=None)
@given(st.lists(ids, max_size=80))
def test_id_lists_match_fastavro_and_round_trip(batch: list[MessageId]) -> None:
    raw = [i.to_bytes() for i in batch]
    for media in (wire.AVRO, wire.AVRO_EXT):
        body = wire.encode_message_ids(batch, media)
        assert avro.read(body, avro.MESSAGE_IDS, "ids") == raw
        assert wire.decode_message_ids(body, media) == batch
        # fastavro's own encoding (blocks may differ in layout) decodes the same.
        assert wire.decode_message_ids(avro.write(raw, avro.MESSAGE_IDS), media) == batch
    assert wire.decode_message_ids(wire.encode_message_ids(batch, wire.JSON), wire.JSON) == batch


def test_bad_id_lists_are_typed_errors() -> None:
    good = wire.encode_message_ids([MessageId(1, 2, 3, 4)], wire.AVRO)
    for body, media in [
        (good[:-1], wire.AVRO),  # truncated
        (good + b"\x00", wire.AVRO),  # trailing bytes
        (avro.write([b"short"], avro.MESSAGE_IDS), wire.AVRO),  # not 20 bytes
        # As long as two ids in all, but items of 19 and 21 bytes.
        (avro.write([b"a" * 19, b"b" * 21], avro.MESSAGE_IDS), wire.AVRO),
        (b"{", wire.JSON),
        (b'{"ids": []}', wire.JSON),
        (b'["not base64!"]', wire.JSON),
        (b'["AAAA"]', wire.JSON),  # base64 of 3 bytes, not an id
    ]:
        try:
            wire.decode_message_ids(body, media)
        except TidingsError:
            continue
        raise AssertionError(f"{body!r} was accepted")


Keyed = tuple[bytes, bytes | None, dict[str, bytes], int | None]


@settings(max_examples=80, deadline=None)
@given(
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.lists(
        st.tuples(
            st.binary(max_size=100),
            st.none() | st.binary(max_size=20),
            st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=3),
            st.none() | st.integers(1, 2**63 - 1),
        ),
        max_size=20,
    ),
)
def test_keyed_publish_encoder_matches_fastavro(
    write_pointer: int | None, records: list[Keyed]
) -> None:
    value = {
        "transactionWritePointer": write_pointer,
        "messages": [p for p, _, _, _ in records],
        "extras": [{"key": k, "headers": h, "ttl": t} for _, k, h, t in records],
    }
    assert avro.write_publish_ext(write_pointer, records) == avro.write(
        value, avro.PUBLISH_REQUEST_EXT
    )


@settings(max_examples=80, deadline=None)
@given(
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.lists(
        st.tuples(
            # Payload lengths on both sides of the one-byte and the table's limits.
            st.binary(max_size=100)
            | st.integers(16_380, 16_390).map(lambda n: bytes([n % 251]) * n),
            # Keys of every length the fixed heads cover, and past them (255 / 256).
            st.binary(max_size=70) | st.integers(250, 260).map(lambda n: b"k" * n),
        ),
        min_size=1,
        max_size=20,
    ),
    st.booleans(),
)
def test_keyed_only_publish_encoder_matches_fastavro(
    write_pointer: int | None, keyed: list[tuple[bytes, bytes]], as_records: bool
) -> None:
    # Every record keyed and nothing else: the encoder's two-items-per-record path.
    records = [Record(p, k) if as_records else (p, k, {}, None) for p, k in keyed]
    value = {
        "transactionWritePointer": write_pointer,
        "messages": [p for p, _ in keyed],
        "extras": [{"key": k, "headers": {}, "ttl": None} for _, k in keyed],
    }
    expected = avro.write(value, avro.PUBLISH_REQUEST_EXT)
    assert avro.write_publish_ext(write_pointer, records) == expected
    if as_records:
        assert wire.encode_publish_request(write_pointer, records, wire.AVRO_EXT) == expected

"""Batch entries: a publish of several plain messages is one Message Table row, and
every reader sees exactly the messages, ids and order that rows of their own gave."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.cli import main as cli_main
from tidings.clock import FakeClock
from tidings.codec import payload_frames, values, wire
from tidings.codec.media import AVRO, AVRO_EXT, COLUMNS, JSON
from tidings.codec.payload_frames import write_frames
from tidings.codec.stored_publish import StoredBatch
from tidings.messaging import MessagingService, publishing
from tidings.store import LmdbStore, MemoryStore, Store
from tidings.structs import Message, MessageId, Record, Transaction

NOW = 1_700_000_000_000


def rows(store: Store) -> list[tuple[bytes, bytes]]:
    return store.scan_list("messages", b"", b"\xff" * 32)


@pytest.fixture
def service(store: Store) -> Iterator[MessagingService]:
    s = MessagingService(store, clock=FakeClock(NOW))
    s.create_topic("ns", "t")
    yield s
    s.close()


def test_a_publish_of_several_plain_messages_is_one_row(
    service: MessagingService, store: Store
) -> None:
    service.publish("ns", "t", [b"a", b"bb", b"ccc"])
    (entry,) = rows(store)
    assert entry[1][0] == values.BATCH
    assert values.batch_counts(entry[1]) == (3, 6)
    got = service.fetch("ns", "t", limit=10)
    assert [m.payload for m in got] == [b"a", b"bb", b"ccc"]
    # The ids rows of their own would have had: consecutive seqs, no Payload Table part.
    assert [m.id for m in got] == [MessageId(NOW, s) for s in range(3)]
    stats = service.stats("ns", "t")
    assert (stats.message_count, stats.bytes) == (3, 6)
    assert stats.newest_id == MessageId(NOW, 2)
    assert stats.oldest_id == MessageId(NOW, 0)


def test_plain_payloads_reach_their_batch_entry_without_a_stored_value_each(
    service: MessagingService, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: publishing.EncodedBatch) -> list[bytes]:
        raise AssertionError("a stored value made per message")

    monkeypatch.setattr(publishing.EncodedBatch, "values", property(refuse))
    body = payload_frames.write_frames(None, [b"c", b"dd"])
    service.publish("ns", "t", [b"a", b"bb"])
    service.publish("ns", "t", payload_frames.read_frames(body))
    assert [v[0] for _, v in rows(store)] == [values.BATCH] * 2
    assert [m.payload for m in service.fetch("ns", "t")] == [b"a", b"bb", b"c", b"dd"]


def test_a_keyed_payloads_body_is_a_keyed_batch_entry_when_it_can_be_one(
    service: MessagingService, store: Store
) -> None:
    def publish(messages: list[Record | bytes], write_pointer: int | None = None) -> None:
        body = payload_frames.write_frames(write_pointer, messages)
        service.publish("ns", "t", payload_frames.read_frames(body), write_pointer=write_pointer)

    publish([Record(b"a", b"k1"), Record(b"b", b"")])  # every message keyed, keys short
    publish([Record(b"c", b"k1"), b"d"])  # one without a key: rows of their own
    publish([Record(b"e", b"x" * 200), Record(b"f", b"k2")])  # a long key: rows
    publish([Record(b"g", b"k3"), Record(b"h", b"k3")], write_pointer=7)  # a transaction's
    assert [v[0] for _, v in rows(store)] == [
        values.KEYED_BATCH, values.KEYED, values.PLAIN, values.KEYED, values.KEYED,
        values.TX_KEYED_BATCH,
    ]  # fmt: skip
    got = service.fetch("ns", "t", limit=20)
    assert [(m.payload, m.key) for m in got] == [
        (b"a", b"k1"), (b"b", b""), (b"c", b"k1"), (b"d", None),
        (b"e", b"x" * 200), (b"f", b"k2"), (b"g", b"k3"), (b"h", b"k3"),
    ]  # fmt: skip
    assert [m.write_pointer for m in got][-2:] == [7, 7]
    assert service.stats("ns", "t").message_count == 8


def test_reading_resumes_inside_a_batch_entry_on_every_store(
    service: MessagingService,
) -> None:
    service.publish("ns", "t", [b"before"])
    service.publish("ns", "t", [b"m%d" % i for i in range(6)])
    service.publish("ns", "t", [b"after"])
    everything = service.fetch("ns", "t", limit=100)
    ids = [m.id for m in everything]
    for i in range(1, 7):  # the messages of the batch entry
        assert service.fetch("ns", "t", start=ids[i], limit=100) == everything[i:]
        assert (
            service.fetch("ns", "t", start=ids[i], inclusive=False, limit=2)
            == everything[i + 1 : i + 3]
        )
        assert (
            service.fetch_ids("ns", "t", start=ids[i], inclusive=False, limit=100) == ids[i + 1 :]
        )
    # Page by page, two at a time, in the columnar medium.
    paged: list[Message] = []
    start: MessageId | None = None
    while True:
        body, count, last = service.fetch_columns("ns", "t", start=start, inclusive=False, limit=2)
        if not count:
            break
        paged += wire.decode_messages(body, COLUMNS)
        start = last
    assert paged == everything


def test_which_publishes_stay_rows_of_their_own(service: MessagingService, store: Store) -> None:
    service.publish("ns", "t", [b"alone"])  # one message
    service.publish("ns", "t", [b"x", Record(b"y", key=b"k")])  # a key
    service.publish("ns", "t", [b"x", Record(b"y", ttl=60)])  # an expiry
    service.publish("ns", "t", [b"tx1", Record(b"tx2", ttl=60)], write_pointer=9)
    assert [v[0] in values.BATCH_FLAGS for _, v in rows(store)] == [False] * 7
    assert service.stats("ns", "t").message_count == 7


@pytest.mark.parametrize("framed", [False, True], ids=["records", "payloads body"])
def test_a_transactions_publish_is_one_entry_that_a_rollback_flips(
    service: MessagingService, store: Store, framed: bool
) -> None:
    plain: list[Record | bytes] = [b"a", b"b", b"c"]
    keyed: list[Record | bytes] = [Record(b"d", b"k"), Record(b"e", b"")]
    if framed:  # as a one-request transaction's payloads body comes
        info = service.publish(
            "ns", "t", payload_frames.read_frames(write_frames(None, plain)), write_pointer=9
        )
        second = service.publish(
            "ns", "t", payload_frames.read_frames(write_frames(None, keyed)), write_pointer=9
        )
    else:
        info = service.publish("ns", "t", plain, write_pointer=9)
        second = service.publish("ns", "t", keyed, write_pointer=9)
    assert info is not None and second is not None
    assert [v[0] for _, v in rows(store)] == [values.TX_BATCH, values.TX_KEYED_BATCH]
    snapshot = Transaction(read_pointer=10, write_pointer=11)
    seen = service.fetch("ns", "t", transaction=snapshot)
    assert [(m.payload, m.key, m.write_pointer) for m in seen] == [
        (b"a", None, 9), (b"b", None, 9), (b"c", None, 9), (b"d", b"k", 9), (b"e", b"", 9),
    ]  # fmt: skip
    # A rollback rewrites the entry's write pointer once, and counts its messages.
    assert service.rollback("ns", "t", info) == 3
    assert [values.read_write_pointer(v) for _, v in rows(store)] == [-9, 9]
    assert [m.payload for m in service.fetch("ns", "t", transaction=snapshot)] == [b"d", b"e"]
    # Readers without a snapshot still see what was rolled back (as CDAP TMS's do).
    assert len(service.fetch("ns", "t")) == 5
    # A reader whose snapshot has the transaction in progress stops before it, from a
    # start inside the entry too.
    open_tx = Transaction(read_pointer=10, write_pointer=11, in_progress=(9,))
    assert service.fetch("ns", "t", transaction=open_tx) == []
    inside = MessageId(seen[3].id.publish_ts, seen[3].id.seq + 1)
    assert service.fetch("ns", "t", start=inside, transaction=open_tx) == []
    assert [m.payload for m in service.fetch("ns", "t", start=inside, transaction=snapshot)] == [
        b"e"
    ]


def test_a_publish_of_several_keyed_messages_is_one_keyed_row(
    service: MessagingService, store: Store
) -> None:
    service.publish("ns", "t", [Record(b"p%d" % i, key=b"k" * i) for i in range(4)])
    (entry,) = rows(store)
    assert entry[1][0] == values.KEYED_BATCH
    assert values.batch_counts(entry[1]) == (4, 8)
    got = service.fetch("ns", "t", limit=10)
    assert [(m.payload, m.key) for m in got] == [(b"p%d" % i, b"k" * i) for i in range(4)]
    body, _, _ = service.fetch_columns("ns", "t", limit=10)
    assert wire.decode_messages(body, COLUMNS) == got
    # A key of 128 bytes or more is not a short key: rows of their own.
    service.publish("ns", "t", [Record(b"a", key=b"x" * 128), Record(b"b", key=b"y")])
    assert [v[0] for _, v in rows(store)][1:] == [values.KEYED, values.KEYED]


def test_a_large_publish_is_split_into_entries_of_bounded_size(
    service: MessagingService, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "BATCH_ENTRY_BYTES", 100)
    batch = [bytes([i]) * 30 for i in range(10)]  # 31 stored bytes each: 3 per entry
    service.publish("ns", "t", batch)
    counts = [values.batch_counts(v)[0] if v[0] == values.BATCH else 1 for _, v in rows(store)]
    assert counts == [3, 3, 3, 1]
    got = service.fetch("ns", "t", limit=100)
    assert [m.payload for m in got] == batch
    assert [m.id.seq for m in got] == list(range(10))


@pytest.mark.parametrize("keyed", [False, True])
def test_a_large_payloads_body_in_a_transaction_is_split_too(
    service: MessagingService, store: Store, monkeypatch: pytest.MonkeyPatch, keyed: bool
) -> None:
    monkeypatch.setattr(publishing, "BATCH_ENTRY_BYTES", 100)
    batch: list[Record | bytes] = [
        Record(bytes([i]) * 30, b"k") if keyed else bytes([i]) * 30 for i in range(10)
    ]
    frames = payload_frames.read_frames(write_frames(None, batch))
    info = service.publish("ns", "t", frames, write_pointer=7)
    assert info is not None
    entries = [v for _, v in rows(store)]
    assert len(entries) > 1 and all(values.read_write_pointer(v) == 7 for v in entries)
    seen = service.fetch("ns", "t", limit=100, transaction=Transaction(8, 9))
    assert [(m.payload, m.key, m.write_pointer) for m in seen] == [
        (r.payload, r.key, 7) if isinstance(r, Record) else (r, None, 7) for r in batch
    ]
    assert service.rollback("ns", "t", info) == 10


def test_retention_deletes_a_batch_entry_and_its_counts(store: Store) -> None:
    clock = FakeClock(NOW)
    service = MessagingService(store, clock=clock)
    service.create_topic("ns", "t", {"ttl": 5})
    service.publish("ns", "t", [b"old"] * 4)
    clock.advance(3_000)
    service.publish("ns", "t", [b"new", b"newer"])
    clock.advance(2_500)
    assert [m.payload for m in service.fetch("ns", "t")] == [b"new", b"newer"]
    service.clean_once()
    assert len(rows(store)) == 1
    stats = service.stats("ns", "t")
    assert (stats.message_count, stats.bytes) == (2, 8)
    service.close()


def test_a_topic_counted_by_a_scan_counts_the_messages_of_batch_entries(
    service: MessagingService,
) -> None:
    from tidings.messaging import accounting

    service.publish("ns", "t", [b"a", b"b", b"c"])
    service.publish("ns", "t", [b"d"])
    with service._store.read() as view:  # the scan that counts a topic of unknown count
        ref = service._topics.resolve(view, "ns", "t")
        assert accounting._scan_entries(view, ref.topic_id, ref.state.generation)[:2] == (4, 4)


def test_inspect_lists_every_message_of_a_batch_entry(tmp_path: object) -> None:
    from pathlib import Path

    where = Path(str(tmp_path)) / "data"
    store = LmdbStore(str(where / "store"))
    service = MessagingService(store, clock=FakeClock(NOW))
    service.create_topic("default", "t")
    service.publish("default", "t", [b"first", b"second"])
    service.close()
    store.close()
    result = CliRunner().invoke(cli_main, ["inspect", str(where), "--topic", "t"])
    assert result.exit_code == 0, result.output
    assert "batch entry of 2 messages" in result.output
    assert MessageId(NOW, 1).hex in result.output
    assert "second" in result.output


# --- property: every reader, every start, every page size ----------------------------

_publishes = st.lists(
    st.tuples(
        st.sampled_from(["plain", "stored", "keyed", "tx", "body", "keyed body"]),
        st.integers(1, 7),
        st.integers(0, 1),  # milliseconds until the next publish
    ),
    min_size=1,
    max_size=6,
)


def _read_all(
    service: MessagingService, medium: str, start: MessageId | int | None, inclusive: bool,
    page: int, tx: Transaction | None,
) -> list[Message]:  # fmt: skip
    """Page through the topic from ``start`` in ``medium`` (each page after the last id)."""
    out: list[Message] = []
    while True:
        if medium == "columns":
            body, count, _ = service.fetch_columns(
                "ns", "t", start=start, inclusive=inclusive, limit=page, transaction=tx
            )
            chunk = wire.decode_messages(body, COLUMNS)
            assert len(chunk) == count
        elif medium in ("avro", "avro-ext", "json"):
            media = {"avro": AVRO, "avro-ext": AVRO_EXT, "json": JSON}[medium]
            body, count, last = service.fetch_encoded(
                "ns", "t", media, start=start, inclusive=inclusive, limit=page, transaction=tx
            )
            chunk = wire.decode_messages(body, media)
            assert len(chunk) == count and (last is None or last == chunk[-1].id)
        elif medium == "ids":
            ids = service.fetch_ids(
                "ns", "t", start=start, inclusive=inclusive, limit=page, transaction=tx
            )
            chunk = [Message(i, b"") for i in ids]
        else:
            chunk = service.fetch(
                "ns", "t", start=start, inclusive=inclusive, limit=page, transaction=tx
            )
        assert len(chunk) <= page
        if not chunk:
            return out
        out.extend(chunk)
        start, inclusive = chunk[-1].id, False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _publishes,
    st.sampled_from(["messages", "columns", "avro", "avro-ext", "json", "ids"]),
    st.integers(1, 9),
    st.booleans(),
    st.data(),
)
def test_every_reader_pages_through_batch_entries_as_through_rows(
    publishes: list[tuple[str, int, int]],
    medium: str,
    page: int,
    transactional: bool,
    data: st.DataObject,
) -> None:
    clock = FakeClock(NOW)
    service = MessagingService(MemoryStore(), clock=clock)
    service.create_topic("ns", "t")
    expected: list[tuple[bytes, bytes | None]] = []
    for n, (kind, count, pause) in enumerate(publishes):
        batch = [b"%d-%d" % (n, i) for i in range(count)]
        if kind == "keyed":
            service.publish("ns", "t", [Record(p, b"k") for p in batch])
            expected += [(p, b"k") for p in batch]
        elif kind == "stored":
            # A body read straight into stored values: a batch entry of the first form,
            # each message with a flags byte of its own.
            stored = [values.payload_header() + p for p in batch]
            service.publish("ns", "t", StoredBatch(None, None, stored, sum(map(len, batch))))
            expected += [(p, None) for p in batch]
        elif kind == "body":  # a payloads request body, read as the server reads it
            service.publish("ns", "t", payload_frames.read_frames(write_frames(None, batch)))
            expected += [(p, None) for p in batch]
        elif kind == "keyed body":
            body = write_frames(None, [Record(p, b"k%d" % (n % 2)) for p in batch])
            service.publish("ns", "t", payload_frames.read_frames(body))
            expected += [(p, b"k%d" % (n % 2)) for p in batch]
        elif kind == "tx":
            service.publish("ns", "t", batch, write_pointer=100 + n)
            expected += [(p, None) for p in batch]
        else:
            service.publish("ns", "t", batch)
            expected += [(p, None) for p in batch]
        clock.advance(pause)
    tx = Transaction(read_pointer=10_000, write_pointer=10_001) if transactional else None
    everything = service.fetch("ns", "t", limit=1_000, transaction=tx)
    assert [(m.payload, m.key) for m in everything] == expected
    ids = [m.id for m in everything]
    assert ids == sorted(set(ids))

    def seen(messages: list[Message]) -> list[object]:
        if medium == "ids":
            return [m.id for m in messages]
        if medium in ("avro", "json"):  # no key in the plain schemas
            return [(m.id, m.payload) for m in messages]
        return [(m.id, m.payload, m.key) for m in messages]

    assert seen(_read_all(service, medium, None, True, page, tx)) == seen(everything)
    # From any message, inclusive and not; and from ids that are no message's.
    i = data.draw(st.integers(0, len(everything) - 1))
    at = everything[i].id
    assert seen(_read_all(service, medium, at, True, page, tx)) == seen(everything[i:])
    assert seen(_read_all(service, medium, at, False, page, tx)) == seen(everything[i + 1 :])
    between = MessageId(at.publish_ts, at.seq, 0, 1)  # after ``at``, before the next
    assert seen(_read_all(service, medium, between, True, page, tx)) == seen(everything[i + 1 :])
    by_time = data.draw(st.integers(NOW - 1, NOW + len(publishes)))
    later = [m for m in everything if m.id.publish_ts >= by_time]
    assert seen(_read_all(service, medium, by_time, True, page, tx)) == seen(later)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.none() | st.sampled_from([3, 5, 8, 9, 12]),  # the publish's write pointer
            st.integers(1, 4),  # messages
            st.booleans(),  # keyed
        ),
        min_size=1,
        max_size=8,
    ),
    st.sets(st.sampled_from([3, 8])),  # rolled back
    st.sampled_from(["messages", "columns", "avro-ext", "ids"]),
    st.integers(1, 5),
    st.data(),
)
def test_transactions_batch_entries_are_seen_as_the_visibility_rule_says(
    publishes: list[tuple[int | None, int, bool]],
    rolled_back: set[int],
    medium: str,
    page: int,
    data: st.DataObject,
) -> None:
    # The rule spelled out here, not taken from the readers: a snapshot with 5 invalid,
    # 9 in progress and 12 begun after it skips 5 and what was rolled back, and stops
    # at the first message of 9 or 12.
    service = MessagingService(MemoryStore(), clock=FakeClock(NOW))
    service.create_topic("ns", "t")
    published: list[tuple[bytes, bytes | None, int | None]] = []
    infos = []
    for n, (wp, count, keyed) in enumerate(publishes):
        batch = [Record(b"%d-%d" % (n, i), b"k" if keyed else None) for i in range(count)]
        info = service.publish("ns", "t", batch, write_pointer=wp)
        if wp in rolled_back and info is not None:
            infos.append(info)
        published += [(r.payload, r.key, wp) for r in batch]
    for info in infos:
        service.rollback("ns", "t", info)
    tx = Transaction(read_pointer=10, write_pointer=11, invalid=(5,), in_progress=(9,))
    everything = service.fetch("ns", "t", limit=1_000)
    assert [(m.payload, m.key) for m in everything] == [(p, k) for p, k, _ in published]
    ids = {m.payload: m.id for m in everything}

    def rule(messages: list[tuple[bytes, bytes | None, int | None]]) -> list[object]:
        out: list[object] = []
        for payload, key, wp in messages:
            if wp in (9, 12):
                break
            if wp is None or (wp != 5 and wp not in rolled_back):
                out.append(ids[payload] if medium == "ids" else (payload, key))
        return out

    def seen(messages: list[Message]) -> list[object]:
        if medium == "ids":
            return [m.id for m in messages]
        return [(m.payload, m.key) for m in messages]

    assert seen(_read_all(service, medium, None, True, page, tx)) == rule(published)
    # From any message, inside an entry too, whatever its transaction: inclusive.
    j = data.draw(st.integers(0, len(published) - 1))
    got = _read_all(service, medium, everything[j].id, True, page, tx)
    assert seen(got) == rule(published[j:])

"""The sink's commit protocol against a real server (no Spark session needed)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.client import Client
from tidings.errors import TransactionAborted
from tidings.spark.sink import (
    begin_write,
    control_topic,
    last_committed_batch,
    marker,
    publish_and_commit,
    store_rows,
)
from tidings.spark.writer import SinkMessage, _ranges
from tidings.structs import PayloadRange, Record

pytestmark = pytest.mark.spark


def test_store_rows_batches_per_topic_in_order(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    a, b = new_topic(), new_topic()
    tx = begin_write(client, 60, None)
    rows = [(a if i % 2 else b, Record(str(i).encode())) for i in range(25)]
    ranges = store_rows(client, tx.write_pointer, rows, max_records=4, max_bytes=1 << 20)
    assert [len(ranges[a]), len(ranges[b])] == [3, 4]  # one range per store, in order
    assert SinkMessage(tx, ranges).counts == {a: 12, b: 13}
    publish_and_commit(client, tx, ranges)
    snap = client.snapshot()
    assert [m.payload for m in client.poll(a, transaction=snap)] == [
        str(i).encode() for i in range(1, 25, 2)
    ]
    assert [m.payload for m in client.poll(b, transaction=snap)] == [
        str(i).encode() for i in range(0, 25, 2)
    ]


def test_a_failed_commit_rolls_back_what_it_published(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out = new_topic()
    tx = begin_write(client, 60, None)
    client.store(out, [b"x"], write_pointer=tx.write_pointer)
    client.abort(tx.write_pointer)  # someone ended it under our feet
    with pytest.raises(TransactionAborted):
        publish_and_commit(client, tx, [out])
    # Aborted data is skipped only once rolled back (Tephra): the sink did that.
    assert client.poll(out, transaction=client.snapshot()) == []


def test_markers_record_the_newest_batch(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    out = new_topic()
    sink_id = "m-" + uuid.uuid4().hex[:8]
    assert last_committed_batch(client, sink_id) is None
    for batch in range(3):
        tx = begin_write(client, 60, sink_id)
        client.store(out, [str(batch).encode()], write_pointer=tx.write_pointer)
        record = marker(sink_id, batch, tx.write_pointer, {out: 1})
        publish_and_commit(client, tx, [out], (control_topic(sink_id), record))
    assert last_committed_batch(client, sink_id) == 2
    # a batch published but never committed is not recorded
    tx = begin_write(client, 60, sink_id)
    client.publish(
        control_topic(sink_id),
        marker(sink_id, 3, tx.write_pointer, {}),
        write_pointer=tx.write_pointer,
    )
    begin_write(client, 60, sink_id)  # the next run fences it
    assert last_committed_batch(client, sink_id) == 2


def test_only_the_ranges_reported_are_published(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    # Two attempts of one task stored the same rows; Spark hands commit() only the
    # message of the attempt that succeeded.
    out = new_topic()
    tx = begin_write(client, 60, None)
    rows = [(out, Record(b"%d" % i)) for i in range(5)]
    store_rows(client, tx.write_pointer, rows, max_records=2, max_bytes=1 << 20)  # failed
    kept = store_rows(client, tx.write_pointer, rows, max_records=2, max_bytes=1 << 20)
    other = store_rows(client, tx.write_pointer, [(out, Record(b"p2"))], max_records=9, max_bytes=9)
    messages = [SinkMessage(tx, other, 0), SinkMessage(tx, kept, 1), SinkMessage(tx, {}, 0)]
    publish_and_commit(client, tx, _ranges(messages))
    got = [m.payload for m in client.poll(out, transaction=client.snapshot())]
    assert got == [b"0", b"1", b"2", b"3", b"4", b"p2"]


def test_ranges_of_committed_attempts_are_merged_per_topic_in_order() -> None:
    from tidings.spark.sink import SinkTransaction

    tx = SinkTransaction(1)
    late, early, other = (
        PayloadRange(9, 0, 9, 3),
        PayloadRange(5, 0, 5, 0),
        PayloadRange(1, 0, 2, 1),
    )
    merged = _ranges(
        [SinkMessage(tx, {"t": [late], "u": []}), SinkMessage(tx, {"t": [early], "v": [other]})]
    )
    assert merged == {"t": [early, late], "v": [other]}
    assert SinkMessage(tx, {"v": [other]}).counts == {"v": 65536 + 2}
    # Ranges that touch (consecutive stores of one task) become one; a gap (another
    # attempt's rows) keeps them apart; the sequence rolls over into the next ms.
    touching = [PayloadRange(7, 0, 7, 9), PayloadRange(7, 10, 7, 0xFFFF), PayloadRange(8, 0, 8, 4)]
    gap = PayloadRange(8, 6, 8, 8)
    assert _ranges([SinkMessage(tx, {"t": [gap, *reversed(touching)]})]) == {
        "t": [PayloadRange(7, 0, 8, 4), gap]
    }

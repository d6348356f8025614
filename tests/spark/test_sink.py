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
from tidings.spark.writer import SinkMessage, _retried
from tidings.structs import Record

pytestmark = pytest.mark.spark


def test_store_rows_batches_per_topic_in_order(
    server: ServerProcess, client: Client, new_topic: Callable[[], str]
) -> None:
    a, b = new_topic(), new_topic()
    tx = begin_write(client, 60, None)
    rows = [(a if i % 2 else b, Record(str(i).encode())) for i in range(25)]
    counts = store_rows(client, tx.write_pointer, rows, max_records=4, max_bytes=1 << 20)
    assert counts == {a: 12, b: 13}
    publish_and_commit(client, tx, counts)
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


def test_a_rerun_task_blocks_the_commit() -> None:
    from tidings.spark.sink import SinkTransaction

    tx = SinkTransaction(1)
    assert _retried([SinkMessage(tx, {"t": 1}, 0), SinkMessage(tx, {}, 0)]) is None
    problem = _retried([SinkMessage(tx, {"t": 1}, 0), SinkMessage(tx, {}, 1)])
    assert problem is not None and "re-run" in problem

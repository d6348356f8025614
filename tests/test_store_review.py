"""Storage, retention and kept counts: cases found wanting, each pinned by a test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import lmdb
import pytest

from tidings.clock import FakeClock
from tidings.codec import keys
from tidings.errors import PayloadsAlreadyPublished, ServerError, StoreFull
from tidings.messaging import MessagingConfig, MessagingService
from tidings.store import LmdbStore, MemoryStore, Store
from tidings.store.backend import WriteView
from tidings.structs import MessageId, Record
from tidings.tx.durable import TAIL_MARKER, TxStorage
from tidings.tx.log import HEADER, frame, tail_key
from tidings.tx.records import Begin, encode_record
from tidings.tx.snapshot import encode_state, write_snapshot
from tidings.tx.state import TxStateMachine

NOW = 1_700_000_000_000
T = TypeVar("T")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def service(store: Store, clock: FakeClock) -> Iterator[MessagingService]:
    s = MessagingService(store, MessagingConfig(cleanup_batch=3), clock=clock)
    s.create_topic("ns", "t", {"ttl": 100})
    yield s
    s.close()


def all_ids(service: MessagingService) -> list[MessageId]:
    return [m.id for m in service.fetch("ns", "t", limit=10_000)]


def test_newest_id_skips_trailing_messages_past_their_own_expiry(
    service: MessagingService, clock: FakeClock
) -> None:
    # The last entries are past their own expiry but the cleaner has not run: the
    # newest message is the one before them, not "none" (which a consumer starting at
    # "latest" would take for an empty topic and read everything from the start).
    service.publish("ns", "t", [b"a", b"b"])
    service.publish("ns", "t", [b"kept"])
    for i in range(5):
        service.publish("ns", "t", [Record(b"brief%d" % i, ttl=1)])
    clock.advance(2_000)
    ids = all_ids(service)
    assert len(ids) == 3
    stats = service.stats("ns", "t")
    assert stats.oldest_id == ids[0]
    assert stats.newest_id == ids[-1]
    assert service.end("ns", "t", None).newest_id == ids[-1]
    service.clean_once()
    assert service.stats("ns", "t").newest_id == ids[-1]


def test_newest_id_is_none_when_every_message_is_past_its_expiry(
    service: MessagingService, clock: FakeClock
) -> None:
    service.publish("ns", "t", [Record(b"x", ttl=1)])
    service.publish("ns", "t", [b"old"])
    clock.advance(50_000)
    service.publish("ns", "t", [Record(b"y", ttl=1)])
    clock.advance(60_000)  # "old" is past the topic's TTL, the others their own
    assert all_ids(service) == []
    assert service.end("ns", "t", None).newest_id is None
    assert service.stats("ns", "t").newest_id is None


def fill(service: MessagingService, size: int) -> int:
    """Publish messages of ``size`` bytes until the store is full; how many went in."""
    published = 0
    with pytest.raises(StoreFull) as caught:
        for _ in range(1_000):
            service.publish("ns", "t", [b"x" * size])
            published += 1
    # Still the exception LMDB raises, for callers that catch that one.
    assert isinstance(caught.value, lmdb.MapFullError)
    assert caught.value.to_json()["type"] == "StoreFull"
    return published


def test_a_full_store_takes_writes_again_once_the_cleaner_has_made_room(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Filled to the last page: big messages first, then small ones into what is left.
    # The cleaner must still be able to delete (a whole batch at once finds no room to
    # commit), and the publish after it must use the room (LMDB reuses the pages a
    # commit frees only two commits later, and nothing else commits meanwhile).
    with LmdbStore(tmp_path / "store", map_size=1 << 21) as store:
        service = MessagingService(store, MessagingConfig(cleanup_batch=5000), clock=clock)
        try:
            service.create_topic("ns", "t", {"ttl": 10})
            published = fill(service, 20_000) + fill(service, 100)
            assert service.stats("ns", "t").message_count == published
            clock.advance(11_000)
            service.clean_once()
            assert service.stats("ns", "t").message_count == 0
            for _ in range(3):
                service.publish("ns", "t", [b"y" * 20_000])
            assert service.stats("ns", "t").message_count == 3
            assert len(all_ids(service)) == 3
        finally:
            service.close()


class _HookedStore(MemoryStore):
    """Runs ``hook`` once, right after the next write has been applied."""

    hook: Callable[[], None] | None = None

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        future = super().submit(fn)
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return future


def test_a_ttl_made_longer_during_a_cleaner_pass_stops_its_deletions(clock: FakeClock) -> None:
    # The pass began under a 10 s TTL; after its first write the TTL becomes an hour, so
    # every message is within it again and fetch shows them. The rest of the pass must
    # not delete them, nor the rows stored under a pointer not yet published.
    store = _HookedStore()
    service = MessagingService(store, MessagingConfig(cleanup_batch=3), clock=clock)
    try:
        service.create_topic("ns", "t", {"ttl": 10})
        for i in range(12):
            service.publish("ns", "t", [b"m%d" % i])
        service.store_payloads("ns", "t", 7, [b"p%d" % i for i in range(8)])
        clock.advance(20_000)
        assert all_ids(service) == []
        store.hook = lambda: service.update_topic("ns", "t", {"ttl": 3600})
        service.clean_once()
        assert len(all_ids(service)) == 12 - 3  # the first batch went before the change
        service.publish("ns", "t", [], write_pointer=7)
        left = all_ids(service)
        assert len(left) == 12 - 3 + 8
        assert service.stats("ns", "t").message_count == len(left)
        service.clean_once()
        assert all_ids(service) == left
        assert service.stats("ns", "t").message_count == len(left)
    finally:
        service.close()


def test_a_deleted_generations_open_transaction_markers_go_with_its_rows(
    store: Store, service: MessagingService
) -> None:
    service.publish("ns", "t", [b"a", b"b"], write_pointer=5)
    service.publish("ns", "t", [b"c"], write_pointer=6)
    assert store.scan_list("metadata", keys.OPEN_PREFIX, keys.OPEN_PREFIX + b"\xff")
    service.delete_topic("ns", "t")
    service.create_topic("ns", "t", {"ttl": 100})
    service.publish("ns", "t", [b"d"], write_pointer=7)
    service.clean_once()
    left = store.scan_list("metadata", keys.OPEN_PREFIX, keys.OPEN_PREFIX + b"\xff")
    assert [keys.open_write_pointer(k) for k, _ in left] == [7]
    service.delete_topic("ns", "t")
    service.clean_once()
    assert store.scan_list("metadata", keys.OPEN_PREFIX, keys.OPEN_PREFIX + b"\xff") == []


def test_a_ttl_made_longer_during_a_cleaner_pass_keeps_a_visible_pointer_sealed(
    clock: FakeClock,
) -> None:
    # A published pointer's entry is past the 10 s TTL when the pass begins; the TTL
    # becomes an hour after the pass's first write. The entry shows again, so its seal
    # marker must stay (a late store under the pointer would otherwise put messages
    # where readers have passed), and the counts must still match what fetch returns.
    store = _HookedStore()
    service = MessagingService(store, MessagingConfig(cleanup_batch=3), clock=clock)
    try:
        service.create_topic("ns", "t", {"ttl": 10})
        for i in range(6):
            service.publish("ns", "t", [b"m%d" % i])
        service.store_payloads("ns", "t", 7, [b"p%d" % i for i in range(4)])
        service.publish("ns", "t", [], write_pointer=7)
        clock.advance(20_000)
        store.hook = lambda: service.update_topic("ns", "t", {"ttl": 3600})
        service.clean_once()
        left = all_ids(service)
        assert len(left) == 6 - 3 + 4
        assert service.stats("ns", "t").message_count == len(left)
        with pytest.raises(PayloadsAlreadyPublished):
            service.store_payloads("ns", "t", 7, [b"late"])
        service.clean_once()
        assert all_ids(service) == left
        assert service.stats("ns", "t").message_count == len(left)
    finally:
        service.close()


def test_recovery_refuses_to_drop_carried_records_past_a_damaged_log_record(
    tmp_path: Path,
) -> None:
    # Store writes carried records 3 and 4 (acknowledged commits, say) when record 2
    # was already durable in the file: so the file's record 2 can only be damaged, not
    # torn by a crash. Replaying without 2 cannot go on to 3; recovering anyway would
    # lose 3 and 4 for good (a fresh snapshot, the old files and the carried records
    # deleted). The start must stop instead, and leave everything as it was.
    tx_dir = tmp_path / "tx"
    tx_dir.mkdir()
    write_snapshot(tx_dir / f"snapshot-{1:020d}.snap", encode_state(TxStateMachine(100).export()))
    wal = tx_dir / f"wal-{1:020d}.log"
    records = [Begin(10, NOW), Begin(11, NOW), Begin(12, NOW), Begin(13, NOW)]
    damaged = bytearray(
        HEADER + frame(encode_record(records[0])) + frame(encode_record(records[1]))
    )
    damaged[-1] ^= 0xFF
    wal.write_bytes(bytes(damaged))
    (tx_dir / TAIL_MARKER).touch()
    store = MemoryStore()
    carried = [(tail_key(1, i), encode_record(r)) for i, r in enumerate(records, 1)][2:]
    store.apply(lambda view: view.put_many("tx", carried))
    storage = TxStorage(tx_dir, store=store)
    with pytest.raises(ServerError, match="damaged or missing"):
        storage.open()
    assert wal.read_bytes() == bytes(damaged)
    assert store.scan_list("tx", b"", b"\xff") == carried
    assert sorted(p.name for p in tx_dir.iterdir() if p.name != "LOCK") == sorted(
        [wal.name, f"snapshot-{1:020d}.snap", TAIL_MARKER]
    )


def test_no_room_on_the_disk_is_store_full_too(tmp_path: Path) -> None:
    # LMDB reports a disk without room for the file to grow as DiskError (ENOSPC); a
    # write function stands in for the put that met it.
    def no_room(view: WriteView) -> None:
        raise lmdb.DiskError("mdb_txn_commit: No space left on device")

    with LmdbStore(tmp_path / "store") as store:
        with pytest.raises(StoreFull) as caught:
            store.apply(no_room)
        assert isinstance(caught.value, lmdb.DiskError)
        assert caught.value.to_json()["type"] == "StoreFull"
        assert store.apply(lambda view: view.put("tx", b"k", b"v")) is None

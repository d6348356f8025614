"""The group coordinator in process: assignment, filtering, positions, fencing."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.budget import examples
from tidings.codec import groups as gkeys
from tidings.codec import wire
from tidings.codec.columns import read_columns
from tidings.codec.groups import partition_of
from tidings.consumers import pages as pages_module
from tidings.consumers.assignment import assign
from tidings.consumers.groups import GroupCoordinator, _compact
from tidings.consumers.pages import Selection
from tidings.errors import (
    BadRequest,
    GroupNotFound,
    MemberNotFound,
    PartitionFenced,
    TransactionInvalid,
)
from tidings.messaging import MessagingConfig, MessagingService
from tidings.messaging.fetching import PageColumns
from tidings.store.backends.memory import MemoryStore
from tidings.structs import GroupAssignment, Message, MessageId, Record, Transaction
from tidings.tx import TransactionManager, TxConfig
from tidings.tx.visibility import is_visible


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Parts = tuple[GroupCoordinator, MessagingService, TransactionManager, Clock]


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    store = MemoryStore()
    messaging = MessagingService(store)
    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as tx:
        clock = Clock()
        messaging.create_topic("ns", "t")
        yield GroupCoordinator(store, messaging, tx, clock=clock), messaging, tx, clock


def publish(messaging: MessagingService, n: int, keys: int = 7) -> None:
    messaging.publish(
        "ns", "t", [Record(f"m{i}".encode(), f"k{i % keys}".encode()) for i in range(n)]
    )


def snapshot(tx: TransactionManager) -> Transaction:
    s = tx.snapshot()
    assert s is not None
    return s


@settings(max_examples=examples(200), deadline=None)
@given(
    st.integers(1, 64),
    st.lists(st.text("abcdef", min_size=1, max_size=3), max_size=8, unique=True),
    st.lists(st.text("abcdef", min_size=1, max_size=3), max_size=8, unique=True),
)
def test_assignment_covers_every_partition_once_and_balances(
    partitions: int, before: list[str], after: list[str]
) -> None:
    first = assign(partitions, {}, before)
    second = assign(partitions, first, after)
    for result, members in ((first, before), (second, after)):
        owned = [p for ps in result.values() for p in ps]
        if members:
            assert sorted(owned) == list(range(partitions))
            sizes = [len(ps) for ps in result.values()]
            assert max(sizes) - min(sizes) <= 1
        else:
            assert owned == []
    # Sticky: a member that stays keeps at least min(what it had, its new quota).
    for m in set(before) & set(after):
        kept = set(first[m]) & set(second[m])
        assert len(kept) >= min(len(first[m]), partitions // len(after))


def two_members(groups: GroupCoordinator) -> tuple[GroupAssignment, GroupAssignment]:
    """Two members of group ``g`` of 8 partitions, each with its final assignment."""
    a = groups.join("ns", "t", "g", partitions=8)
    b = groups.join("ns", "t", "g")
    return groups.heartbeat("ns", "t", "g", a.member_id), b


def test_two_members_split_keys_and_together_see_everything(parts: Parts) -> None:
    groups, messaging, tx, _ = parts
    publish(messaging, 200)
    a, b = two_members(groups)
    assert a.generation == b.generation == 2
    assert sorted(a.partitions + b.partitions) == list(range(8))
    got: dict[str, list[Message]] = {}
    for member in (a, b):
        out, _ = groups.poll("ns", "t", "g", member.member_id, limit=1000, snapshot=snapshot(tx))
        got[member.member_id] = out
        assert all(partition_of(m, 8) in member.partitions for m in out)
    everything = sorted(m.id for ms in got.values() for m in ms)
    assert everything == [m.id for m in messaging.fetch("ns", "t", limit=1000)]
    keys_a = {m.key for m in got[a.member_id]}
    keys_b = {m.key for m in got[b.member_id]}
    assert not keys_a & keys_b  # one key, one member


def test_the_first_member_on_a_page_lays_out_every_members_share(parts: Parts) -> None:
    groups, messaging, tx, _ = parts
    publish(messaging, 50)
    a, b = two_members(groups)
    groups.poll("ns", "t", "g", a.member_id, limit=10, snapshot=snapshot(tx))
    (pages,) = groups._pages.values()
    (page,) = pages._pages
    shares = {key: share.blocks is not None for key, share in page.shares.items()}
    assert shares == {(8, frozenset(a.partitions)): True, (8, frozenset(b.partitions)): True}


def test_commit_in_a_transaction_counts_only_if_it_commits(parts: Parts) -> None:
    groups, messaging, tx, _ = parts
    publish(messaging, 50, keys=1)
    m = groups.join("ns", "t", "g", partitions=1)
    out, _ = groups.poll("ns", "t", "g", m.member_id, limit=10, snapshot=snapshot(tx))
    gid = groups._gid("ns", "t", "g")
    t1 = tx.begin()
    changes = groups.commit(
        "ns", "t", "g", m.member_id, {0: out[-1].id}, write_pointer=t1.write_pointer
    )
    assert groups.positions(gid, snapshot(tx)) == {}
    groups.rollback("ns", "t", "g", t1.write_pointer)
    tx.abort(t1.write_pointer)
    assert groups.positions(gid, snapshot(tx)) == {}  # aborted: unchanged
    t2 = tx.begin()
    changes = groups.commit(
        "ns", "t", "g", m.member_id, {0: out[-1].id}, write_pointer=t2.write_pointer
    )
    tx.commit(t2.write_pointer, changes)
    assert groups.positions(gid, snapshot(tx)) == {0: out[-1].id}


def test_racing_transactional_commits_of_one_partition_conflict(parts: Parts) -> None:
    groups, messaging, tx, _ = parts
    publish(messaging, 10, keys=1)
    m = groups.join("ns", "t", "g", partitions=1)
    out, _ = groups.poll("ns", "t", "g", m.member_id, limit=10, snapshot=snapshot(tx))
    t1, t2 = tx.begin(), tx.begin()
    c1 = groups.commit("ns", "t", "g", m.member_id, {0: out[3].id}, write_pointer=t1.write_pointer)
    c2 = groups.commit("ns", "t", "g", m.member_id, {0: out[5].id}, write_pointer=t2.write_pointer)
    tx.commit(t1.write_pointer, c1)
    from tidings.errors import TransactionConflict

    with pytest.raises(TransactionConflict):
        tx.commit(t2.write_pointer, c2)


def test_a_member_that_lost_its_partition_is_fenced(parts: Parts) -> None:
    groups, messaging, tx, clock = parts
    publish(messaging, 40, keys=1)
    a = groups.join("ns", "t", "g", partitions=1, session_timeout_ms=1000)
    out, _ = groups.poll("ns", "t", "g", a.member_id, limit=10, snapshot=snapshot(tx))
    pending = tx.begin()
    groups.commit("ns", "t", "g", a.member_id, {0: out[-1].id}, write_pointer=pending.write_pointer)
    clock.now += 5  # a stalls past its session timeout
    b = groups.join("ns", "t", "g")
    assert b.partitions == (0,)
    # a's open transaction holding a position of the moved partition cannot commit.
    with pytest.raises(TransactionInvalid):
        tx.commit(pending.write_pointer, [])
    with pytest.raises(PartitionFenced):  # dropped: whatever it owned moved
        groups.commit("ns", "t", "g", a.member_id, {0: out[-1].id})
    with pytest.raises(MemberNotFound):
        groups.heartbeat("ns", "t", "g", a.member_id)
    # b starts where the group committed (nothing): every message again.
    again, _ = groups.poll("ns", "t", "g", b.member_id, limit=100, snapshot=snapshot(tx))
    assert [m.id for m in again] == [m.id for m in messaging.fetch("ns", "t", limit=100)]


def test_positions_prepared_before_a_rebalance_are_fenced_when_written_after_it(
    parts: Parts,
) -> None:
    """The one-request transaction checks its positions, then writes them with its
    messages: a rebalance between the two must fence it although no record of it was
    stored yet."""
    groups, messaging, tx, clock = parts
    publish(messaging, 40, keys=1)
    a = groups.join("ns", "t", "g", partitions=1, session_timeout_ms=1000)
    out, _ = groups.poll("ns", "t", "g", a.member_id, limit=10, snapshot=snapshot(tx))
    pending = tx.begin()
    wp = pending.write_pointer
    write = groups.prepare_commit("ns", "t", "g", a.member_id, {0: out[-1].id}, wp)
    clock.now += 5  # a stalls past its session timeout; b takes the partition
    b = groups.join("ns", "t", "g")
    assert b.partitions == (0,)
    with pytest.raises(TransactionInvalid):  # fenced before its write lands
        write.submit().result()
    gid = groups._gid("ns", "t", "g")
    assert groups.positions(gid, snapshot(tx)) == {}
    # Prepared and written without a rebalance: the positions count once it commits.
    c = groups.join("ns", "t", "g2", partitions=1)
    got, _ = groups.poll("ns", "t", "g2", c.member_id, limit=5, snapshot=snapshot(tx))
    t2 = tx.begin()
    groups.prepare_commit("ns", "t", "g2", c.member_id, {0: got[-1].id}, t2.write_pointer)
    clock.now += 0.1
    write2 = groups.prepare_commit("ns", "t", "g2", c.member_id, {0: got[-1].id}, t2.write_pointer)
    write2.submit().result()
    tx.commit(t2.write_pointer, [])
    assert groups.positions(groups._gid("ns", "t", "g2"), snapshot(tx)) == {0: got[-1].id}


@contextlib.contextmanager
def held_elsewhere(lock: Any) -> Iterator[None]:
    """Hold ``lock`` in another thread for the duration (as a worker thread would)."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join()


def test_a_heartbeat_on_the_loop_steps_aside_where_it_would_wait(parts: Parts) -> None:
    """The server answers a heartbeat on its event loop, and hands it to a worker
    thread only where it would wait: those cases answer None and change nothing."""
    groups, _, _, clock = parts
    a = groups.join("ns", "t", "g", partitions=4, session_timeout_ms=1000)
    # A worker thread holds the group past the loop's short wait.
    with held_elsewhere(groups._lock):
        assert groups.heartbeat_nowait("ns", "t", "g", a.member_id) is None
    assert groups.heartbeat_nowait("ns", "t", "g", a.member_id) == a
    # Another member ran out of its session: the rebalance is a store write, so the
    # loop steps aside and the group stays as it was until the worker's heartbeat.
    b = groups.join("ns", "t", "g", session_timeout_ms=100_000)
    generation = b.generation
    clock.now += 5
    assert groups.heartbeat_nowait("ns", "t", "g", b.member_id) is None
    record = groups._read(groups._gid("ns", "t", "g"))
    assert record is not None and record.generation == generation
    after = groups.heartbeat("ns", "t", "g", b.member_id)
    assert after.generation == generation + 1 and after.partitions == (0, 1, 2, 3)
    with pytest.raises(MemberNotFound):  # errors are raised on the loop as on a worker
        groups.heartbeat_nowait("ns", "t", "g", a.member_id)


def test_a_commit_prepared_on_the_loop_steps_aside_where_it_would_wait(parts: Parts) -> None:
    groups, messaging, tx, clock = parts
    publish(messaging, 20, keys=1)
    a = groups.join("ns", "t", "g", partitions=1, session_timeout_ms=1000)
    out, _ = groups.poll("ns", "t", "g", a.member_id, limit=10, snapshot=snapshot(tx))
    wp = tx.begin().write_pointer
    gid = groups._gid("ns", "t", "g")
    with held_elsewhere(groups._lock):
        assert (
            groups.prepare_commit_nowait("ns", "t", "g", a.member_id, {0: out[-1].id}, wp) is None
        )
    assert gid not in groups._prepared  # nothing registered
    write = groups.prepare_commit_nowait("ns", "t", "g", a.member_id, {0: out[-1].id}, wp)
    assert write is not None
    write.submit().result()
    tx.commit(wp, [])
    assert groups.positions(gid, snapshot(tx)) == {0: out[-1].id}
    with pytest.raises(BadRequest):  # past what was delivered, as on a worker
        groups.prepare_commit_nowait(
            "ns", "t", "g", a.member_id, {0: MessageId(2**62, 0, 0, 0)}, tx.begin().write_pointer
        )
    # A member past its session: the rebalance is the worker's, which then fences it.
    b = groups.join("ns", "t", "g", session_timeout_ms=100_000)
    clock.now += 5
    wp = tx.begin().write_pointer
    assert groups.prepare_commit_nowait("ns", "t", "g", b.member_id, {0: out[-1].id}, wp) is None
    with pytest.raises(PartitionFenced):
        groups.prepare_commit("ns", "t", "g", a.member_id, {0: out[-1].id}, wp)


def test_commit_checks_ownership_and_delivery(parts: Parts) -> None:
    groups, messaging, tx, _ = parts
    publish(messaging, 20, keys=20)
    a = groups.join("ns", "t", "g", partitions=4)
    b = groups.join("ns", "t", "g")
    a = groups.heartbeat("ns", "t", "g", a.member_id)
    theirs = b.partitions[0]
    out, _ = groups.poll("ns", "t", "g", a.member_id, limit=100, snapshot=snapshot(tx))
    with pytest.raises(PartitionFenced):
        groups.commit("ns", "t", "g", a.member_id, {theirs: out[0].id})
    mine = a.partitions[0]
    beyond = MessageId(2**62, 0, 0, 0)
    with pytest.raises(BadRequest):
        groups.commit("ns", "t", "g", a.member_id, {mine: beyond})
    with pytest.raises(GroupNotFound):
        groups.describe("ns", "t", "nope")


def test_describe_shows_positions_and_lag(parts: Parts) -> None:
    groups, messaging, tx, _ = parts
    publish(messaging, 30, keys=1)
    m = groups.join("ns", "t", "g", partitions=1)
    out, _ = groups.poll("ns", "t", "g", m.member_id, limit=10, snapshot=snapshot(tx))
    groups.commit("ns", "t", "g", m.member_id, {0: out[-1].id})
    d = groups.describe("ns", "t", "g")
    assert d.partitions[0].position == out[-1].id
    assert d.partitions[0].lag == 20
    assert d.members == {m.member_id: (0,)}
    groups.leave("ns", "t", "g", m.member_id)
    groups.reset("ns", "t", "g", "earliest")
    assert groups.describe("ns", "t", "g").partitions[0].lag == 30


def test_kept_pages_are_bounded_by_count_and_bytes() -> None:
    from tidings.consumers import pages as pages_module
    from tidings.consumers.pages import Page, Pages
    from tidings.messaging.fetching import PageColumns
    from tidings.structs import MessageId as Id

    def page(n: int, payload: int) -> Page:
        first = Id(1000 * n, 0, 0, 0)
        columns = PageColumns()
        columns.ids = [Id(1000 * n + i + 1, 0, 0, 0).to_bytes() for i in range(10)]
        columns.payloads = [b"x" * payload] * 10
        return Page(first, columns, True)

    small = Pages()
    for n in range(100):
        small.add(page(n, 10))
    assert len(small._pages) == pages_module._PAGES_KEPT
    assert small.find(Id(99_000, 0, 0, 0)) is not None  # the newest stay
    assert small.find(Id(0, 0, 0, 0)) is None

    big = Pages()
    per_page = page(0, 1 << 20).size
    for n in range(20):
        big.add(page(n, 1 << 20))
    assert sum(p.size for p in big._pages) <= pages_module._BYTES_KEPT
    assert len(big._pages) == pages_module._BYTES_KEPT // per_page
    assert big.find(Id(19_000, 0, 0, 0)) is not None


def test_members_at_the_end_keep_the_pages_a_member_behind_them_reads(parts: Parts) -> None:
    """A member that has read everything fetches an empty page at each poll; those are
    not kept, so they do not evict the pages a slower member still needs."""
    groups, messaging, tx, _ = parts
    publish(messaging, 30, keys=30)
    fast = groups.join("ns", "t", "g", partitions=2)
    slow = groups.join("ns", "t", "g")
    fast = groups.heartbeat("ns", "t", "g", fast.member_id)
    slows = [
        m.id for m in messaging.fetch("ns", "t", limit=100) if partition_of(m, 2) in slow.partitions
    ]
    fetched: list[object] = []
    fetch_page = groups._fetch_page

    def counting(*args: Any) -> Any:
        fetched.append(args)
        return fetch_page(*args)

    groups._fetch_page = counting  # type: ignore[method-assign]
    got, _ = groups.poll("ns", "t", "g", slow.member_id, limit=5, snapshot=snapshot(tx))
    assert len(fetched) == 1  # the page of all 30
    for _ in range(2 * pages_module._PAGES_KEPT):
        groups.poll("ns", "t", "g", fast.member_id, limit=100, snapshot=snapshot(tx))
    assert len(fetched) > pages_module._PAGES_KEPT  # an empty page at each poll
    kept = groups._pages[groups._gid("ns", "t", "g")[:2]]._pages
    assert [len(page) for page in kept] == [30]
    before = len(fetched)
    rest, _ = groups.poll("ns", "t", "g", slow.member_id, limit=100, snapshot=snapshot(tx))
    assert [m.id for m in got + rest] == slows
    # Read from the kept page; it ended where the topic did when it was fetched, so
    # what came since is fetched after it (nothing here, and that page is not kept).
    assert len(fetched) == before + 1
    assert [len(page) for page in kept] == [30]


def test_a_page_counts_about_the_memory_it_holds() -> None:
    # The bound is on memory: a page that counts far more than it holds evicts pages
    # members still need (4 members then fetched each page about 3 times).
    import sys

    from tidings.consumers.pages import Page
    from tidings.messaging.fetching import PageColumns
    from tidings.structs import MessageId as Id

    columns = PageColumns()
    columns.ids = [Id(i + 1, 0, 0, 0).to_bytes() for i in range(1000)]
    columns.payloads = [b"x" * 100 + bytes([i % 7]) for i in range(1000)]
    columns.keys = [b"k%d" % (i % 50) for i in range(1000)]
    held = sum(
        sys.getsizeof(i) + sys.getsizeof(p) + 3 * 8 + len(k)
        for i, p, k in zip(columns.ids, columns.payloads, columns.keys, strict=True)
    )
    assert 0.9 * held <= Page(None, columns, True).size <= 1.1 * held


@settings(max_examples=examples(60), deadline=None)
@given(
    st.integers(1, 60),  # messages
    st.integers(1, 6),  # partitions
    st.integers(1, 9),  # page size (several pages per scan)
    st.integers(1, 25),  # poll limit
    st.data(),
)
def test_a_scan_returns_the_owned_messages_after_each_cursor_in_order(
    n: int, partitions: int, page: int, limit: int, data: st.DataObject
) -> None:
    store = MemoryStore()
    messaging = MessagingService(
        store, MessagingConfig(fetch_default_limit=page, fetch_max_limit=page)
    )
    messaging.create_topic("ns", "t")
    keys = data.draw(st.integers(1, 12))
    # Keyed rows, some rows without a key, none with one, headers on some (a page with
    # headers is answered the general way, the others from the shares laid out).
    shape = data.draw(st.sampled_from(["keyed", "some keyless", "keyless", "headers"]))
    messaging.publish(
        "ns",
        "t",
        [
            Record(
                f"m{i}".encode(),
                None
                if shape == "keyless" or (shape == "some keyless" and i % 3 == 0)
                else f"k{i % keys}".encode(),
                {"h": b"v"} if shape == "headers" and i % 4 == 0 else {},
            )
            for i in range(n)
        ],
    )
    everything = messaging.fetch("ns", "t", limit=page)
    while len(everything) < n:
        everything += messaging.fetch("ns", "t", start=everything[-1].id, inclusive=False)
    owned = data.draw(
        st.lists(st.integers(0, partitions - 1), min_size=1, max_size=partitions, unique=True)
    )
    # Each owned partition's cursor: none yet, or the id of some message (a member
    # alone moves all cursors together; members after a rebalance do not).
    together = data.draw(st.booleans())
    shared = data.draw(st.none() | st.sampled_from(everything))
    picks = {
        p: (shared if together else data.draw(st.none() | st.sampled_from(everything)))
        for p in owned
    }
    cursors = {p: (None if m is None else m.id) for p, m in picks.items()}
    # The other members' partitions: the first scan of a page lays out their shares.
    others = data.draw(st.lists(st.frozensets(st.integers(0, partitions - 1)), max_size=3))
    budget = data.draw(st.sampled_from([1 << 40, *range(1, 40)]))
    with (
        tempfile.TemporaryDirectory() as tmp,
        TransactionManager(Path(tmp), TxConfig(sweep_interval=3600)) as tx,
    ):
        groups = GroupCoordinator(store, messaging, tx, clock=Clock())
        scans = [(cursors, budget)]
        # Then another member's first scan, from the shares the first one laid out.
        scans += [(dict.fromkeys(other), 1 << 40) for other in others[:1] if other]
        for member_cursors, member_budget in scans:
            rows, returned, _ = groups._scan(
                "ns", "t", (1, 1), partitions, member_cursors, limit, member_budget,
                snapshot(tx), [frozenset(cursors), *others],
            )  # fmt: skip
            expected = [
                m
                for m in everything
                if (p := partition_of(m, partitions)) in member_cursors
                and (member_cursors[p] is None or m.id > member_cursors[p])
            ][:limit]
            # Up to the message that brings the payloads and keys to the byte budget.
            spent = 0
            for i, m in enumerate(expected):
                spent += len(m.payload) + len(m.key or b"")
                if spent >= member_budget:
                    del expected[i + 1 :]
                    break
            # The pages hold columns: the answer is the member's rows of them, in
            # columns.
            out = wire.decode_messages(rows.encode(), wire.COLUMNS) if rows else []
            assert out == expected
            assert rows.messages() == expected
            assert returned == (expected[-1].id if expected else None)


_records = st.builds(
    Record,
    st.binary(max_size=300),
    st.none() | st.binary(max_size=200),
    st.dictionaries(st.text(max_size=5), st.binary(max_size=10), max_size=2),
    st.none(),
)


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(_records, min_size=1, max_size=20), st.lists(_records, max_size=5))
def test_a_page_has_the_ids_and_hashes_of_the_messages(
    published: list[Record], stored: list[Record]
) -> None:
    # Plain and keyed rows go into the columns straight from the stored row, others
    # (headers, long keys, a sink's Payload Table rows) through the general path: each
    # must give the id and the partition hash its message gives.
    from tidings.codec.groups import key_hash

    store = MemoryStore()
    messaging = MessagingService(store)
    messaging.create_topic("ns", "t")
    messaging.publish("ns", "t", published)
    if stored:
        with (
            tempfile.TemporaryDirectory() as tmp,
            TransactionManager(Path(tmp), TxConfig(sweep_interval=3600)) as tx,
        ):
            begun = tx.begin()
            messaging.store_payloads("ns", "t", begun.write_pointer, stored)
            messaging.publish("ns", "t", [], write_pointer=begun.write_pointer)
            tx.commit(begun.write_pointer, [])
    messages = messaging.fetch("ns", "t", limit=100)
    groups = GroupCoordinator.__new__(GroupCoordinator)
    groups._messaging = messaging
    page = groups._fetch_page("ns", "t", None, Transaction(2**62, 2**62, (), ()))
    assert [page.id_at(i) for i in range(len(page))] == [m.id for m in messages]
    assert page.hashes == [key_hash(m) for m in messages]
    assert page.last == messages[-1].id
    # What the fetch counted stands for the payloads and keys (the byte bound's check
    # of whether it may fall in a page): never less.
    assert page.data >= sum(len(m.payload) + len(m.key or b"") for m in messages)
    for m in messages:  # where a member resumes: just after each message
        assert page.after(m.id) == messages.index(m) + 1
    # The answer carries what a poll answer carries (no write pointers), in columns
    # and as messages; a member's share of the rows likewise.
    expected = [(m.id, m.payload, m.key, dict(m.headers)) for m in messages]
    for answer in (page.columns.messages(), read_columns(page.columns.encode()).messages()):
        assert [(m.id, m.payload, m.key, dict(m.headers)) for m in answer] == expected
    share = PageColumns()
    rows = list(range(0, len(page), 2))
    share.extend_rows(page.columns, rows)
    share.extend_rows(page.columns, [])
    assert [(m.id, m.payload, m.key, dict(m.headers)) for m in share.messages()] == [
        expected[i] for i in rows
    ]
    assert read_columns(share.encode()).messages() == share.messages()
    # A run of rows (a member that owns every partition) the same, alone and after
    # rows taken one by one.
    half = len(page) // 2
    tail = PageColumns()
    tail.extend_rows(page.columns, range(half, len(page)))
    whole = PageColumns()
    whole.extend_rows(page.columns, [0])
    whole.extend_rows(page.columns, range(1, len(page)))
    for run, want in ((tail, expected[half:]), (whole, expected)):
        assert [(m.id, m.payload, m.key, dict(m.headers)) for m in run.messages()] == want
        assert read_columns(run.encode()).messages() == run.messages()
    # Each member's share: its partitions' rows, laid out once for all the members the
    # first one names, and answered alike laid out or not (not on a page with headers).
    for partitions in (1, 3):
        sets = [
            frozenset({0}),
            frozenset({1, 2} & set(range(partitions))),
            frozenset(range(partitions)),
        ]
        for owned in filter(None, sets):
            share = page.share(partitions, owned, sets)
            assert all((partitions, s) in page.shares for s in sets if s)
            rows = [i for i, m in enumerate(messages) if key_hash(m) % partitions in owned]
            assert list(share.rows) == rows
            assert (share.blocks is None) == (
                bool(page.columns.headers) or len(owned) == partitions
            )
            taken = Selection()
            taken.add(share, 1, len(share))
            taken.add(share, 0, 0)
            answer = read_columns(taken.encode()).messages()
            assert [(m.id, m.payload, m.key, dict(m.headers)) for m in answer] == [
                expected[i] for i in rows[1:]
            ]
            assert taken.messages() == answer


_pointers = st.integers(min_value=0, max_value=12)


@settings(max_examples=examples(200), deadline=None)
@given(
    records=st.sets(st.tuples(st.integers(0, 3) | st.integers(0, 40), _pointers), max_size=24),
    read_pointer=st.integers(0, 12),
    invalid=st.sets(st.integers(1, 12), max_size=4),
    in_progress=st.sets(st.integers(1, 12), max_size=4),
    wanted=st.sets(st.integers(0, 4) | st.integers(0, 41), max_size=5),
)
def test_compacting_positions_keeps_the_newest_visible_and_the_open(
    records: set[tuple[int, int]],
    read_pointer: int,
    invalid: set[int],
    in_progress: set[int],
    wanted: set[int],
) -> None:
    # Each position record is (partition, write pointer). Compacting some partitions
    # (close together, walked as one span, or far apart, each on its own) drops their
    # records of invalid transactions and every visible one but the newest, answers
    # the pointers of the ones not visible, and leaves the others.
    in_progress -= invalid
    snapshot = Transaction(read_pointer, 100, tuple(sorted(invalid)), tuple(sorted(in_progress)))
    gid = (1, 1, "g")
    other = (1, 1, "h")  # another group's records stay as they are
    store = MemoryStore()

    def put(view: Any) -> None:
        for p, wp in records:
            for g in (gid, other):
                view.put("metadata", gkeys.position_key(*g, p, wp), b"x")

    store.apply(put)
    hidden = store.apply(lambda view: _compact(view, gid, wanted, snapshot))
    start, stop = gkeys.positions_range(*gid)
    left = {gkeys.write_pointer_of(k) for k, _ in store.scan_list("metadata", start, stop)}
    expected: set[tuple[int, int]] = set()
    expected_hidden: dict[int, set[int]] = {}
    for p in range(42):
        mine = sorted(wp for q, wp in records if q == p)
        if p not in wanted:
            expected |= {(p, wp) for wp in mine}
            continue
        visible = [wp for wp in mine if wp not in invalid and (wp == 0 or is_visible(snapshot, wp))]
        if visible:
            expected.add((p, visible[-1]))
        for wp in mine:
            if wp not in invalid and wp not in visible:
                expected.add((p, wp))
                expected_hidden.setdefault(p, set()).add(wp)
    assert left == expected
    assert hidden == expected_hidden
    start, stop = gkeys.positions_range(*other)
    assert len(store.scan_list("metadata", start, stop)) == len(records)

"""Consumer groups: members split a topic by key hash; positions commit in transactions.

CDAP's consumer groups over one topic's single total order, with Kafka's group
semantics. A group has a fixed number of virtual partitions ``P`` (chosen
at its first join); a message belongs to partition ``crc32(key) mod P``, or, without a
key, ``crc32(id) mod P``, so all messages of one key go to one member, in the topic's
order, and keyless ones spread evenly. A sticky assignment
(:mod:`tidings.consumers.assignment`) gives every partition to one member; each join,
leave or drop is a rebalance and a new generation.

**Polls** are filtered on the server: a member reads the topic from the lowest cursor
of its partitions and gets only the messages of its partitions that lie past that
partition's cursor. Polls are read-committed (the server's own snapshot), so they stop
at the first entry of a transaction still open. The cursors are the server's memory
of what it delivered to the member; a partition newly assigned starts at its
committed position (or the group's start policy).

**Positions** are durable records in the Metadata table, each written under the write
pointer of the transaction that commits it and visible only once that transaction is
(the rule messages follow): ``commit(transaction=tx)`` moves a position if and only if
``tx`` commits, and a commit without a transaction runs in one of its own. Every
position write names a change key per partition, so two transactions committing one
partition conflict and one fails.

**Fencing** (KIP-447): a member may only commit partitions it owns
(:class:`~tidings.errors.PartitionFenced` otherwise), and a rebalance that moves a
partition invalidates every open transaction holding a position of it, so a zombie's
transaction cannot commit after the new owner started from the committed position.

**Liveness**: a member stays by polling or heartbeating; one silent for its session
timeout is dropped at the next call anyone makes on the group (no timer thread). Group
records (partition count, generation, members and their partitions) are durable; the
in-memory parts (last contact, cursors) start afresh after a restart, which gives every
member a new session and restarts its partitions from their committed positions.

Groups need the transaction service in the same process (role ``all``).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from tidings.codec import groups as gkeys
from tidings.codec.groups import GroupRecord, Member, partition_of
from tidings.consumers.assignment import assign
from tidings.consumers.pages import Page, Pages, Selection, Share
from tidings.consumers.waiting import WouldWait, holding
from tidings.errors import (
    BadRequest,
    Conflict,
    GroupNotFound,
    MemberNotFound,
    PartitionFenced,
    TidingsError,
    TopicNotFound,
    TransactionConflict,
)
from tidings.messaging import MessagingService
from tidings.names import check_name
from tidings.store.backend import ReadView, Store, WriteView
from tidings.structs import (
    GroupAssignment,
    GroupInfo,
    GroupPartition,
    Message,
    MessageId,
    Transaction,
)
from tidings.tx import TransactionManager
from tidings.tx.visibility import is_visible

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_SESSION_TIMEOUT_MS",
    "GroupCoordinator",
    "PositionsWrite",
    "change_key",
    "partition_of",
]

_META = "metadata"
DEFAULT_PARTITIONS = 32
MAX_PARTITIONS = 1024
DEFAULT_SESSION_TIMEOUT_MS = 10_000
MIN_SESSION_TIMEOUT_MS = 100
MAX_SESSION_TIMEOUT_MS = 300_000
STARTS = ("earliest", "latest")
#: Most entries one group poll examines before it answers (with what it found).
_SCAN_BUDGET = 100_000
#: Most entries a lag count examines per group (describe; /metrics and stats).
_LAG_BUDGET = 1_000_000
_METRICS_LAG_BUDGET = 100_000
#: What a transactional commit tried, as its error says where the transaction ended.
_COMMIT_UNDER = "commit group positions under"


def change_key(topic_id: int, generation: int, group: str, partition: int) -> bytes:
    """The transaction change key of one partition's position (conflict detection)."""
    return b"grp/" + gkeys.position_key(topic_id, generation, group, partition, 0)[:-8]


@dataclass(slots=True)
class _Session:
    """What the coordinator remembers of a member between its calls (not durable)."""

    seen: float
    cursors: dict[int, MessageId | None] = field(default_factory=dict)
    #: Where the member started each partition that had no committed position (its
    #: rewind goes back there: for a group starting at "latest", the end as it was
    #: then, not as it is at the rewind, which would skip what it was delivered).
    origins: dict[int, MessageId | None] = field(default_factory=dict)
    #: Long polls of the member waiting between their scans (:meth:`waiting`).
    waiting: int = 0
    #: The newest generation an answer told the member (None: none since the server
    #: started, or since the session was made for it by a rebalance).
    told: int | None = None


_GroupId = tuple[int, int, str]  # topic id, topic generation, group


class GroupCoordinator:
    """Every consumer group of every topic, over the store and the transaction manager."""

    def __init__(
        self,
        store: Store,
        messaging: MessagingService,
        tx: TransactionManager,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._messaging = messaging
        self._tx = tx
        self._clock = clock
        self._started = clock()
        self._lock = threading.RLock()
        self._sessions: dict[tuple[_GroupId, str], _Session] = {}
        #: Positions checked by prepare_commit whose write may not have landed yet: per
        #: group and partition, the write pointers. A rebalance fences these as it
        #: fences the records it finds (the write may come after it).
        self._prepared: dict[_GroupId, dict[int, set[int]]] = {}
        self._pages: dict[tuple[int, int], Pages] = {}

    # --- membership ------------------------------------------------------------------

    def join(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str | None = None,
        *,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        partitions: int | None = None,
        start: str = "earliest",
    ) -> GroupAssignment:
        """Join (or rejoin) ``group``; a new member gets an id. ``partitions`` and
        ``start`` only count when the group is created by this join."""
        check_name(group, "group")
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise BadRequest(
                f"sessionTimeoutMs must be in [{MIN_SESSION_TIMEOUT_MS}, "
                f"{MAX_SESSION_TIMEOUT_MS}], got {session_timeout_ms}"
            )
        if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
            raise BadRequest(f"partitions must be in [1, {MAX_PARTITIONS}], got {partitions}")
        if start not in STARTS:
            raise BadRequest(f"start must be one of {', '.join(STARTS)}, got {start!r}")
        if member_id is not None:
            _check_member_id(member_id)
        gid = self._gid(namespace, topic, group)
        with self._lock:
            record = self._read(gid) or GroupRecord(partitions or DEFAULT_PARTITIONS, 0, {}, start)
            members = dict(self._alive(gid, record))
            if member_id is None or member_id not in members:
                member_id = member_id or uuid.uuid4().hex
                members[member_id] = Member(session_timeout_ms)
                if member_id in record.members:
                    # Past its session but not dropped yet: dropped here, so that its
                    # partitions count as moved (its open transactions are fenced, its
                    # cursors restart) and coming back is a rebalance like any join.
                    # Otherwise the member set looks unchanged and it would come back
                    # owning nothing, its partitions owned by no one.
                    gone = {m: v for m, v in record.members.items() if m != member_id}
                    record = replace(record, members=gone)
            else:
                members[member_id] = replace(members[member_id], timeout_ms=session_timeout_ms)
            self._touch(gid, member_id)
            record = self._rebalance(namespace, topic, gid, record, members)
            return self._assignment(record, member_id, gid)

    def heartbeat(self, namespace: str, topic: str, group: str, member_id: str) -> GroupAssignment:
        """Stay in the group; answers the current assignment (a new generation means a
        rebalance happened). :class:`MemberNotFound` if the member was dropped."""
        return self._heartbeat(namespace, topic, group, member_id, True)

    def heartbeat_nowait(
        self, namespace: str, topic: str, group: str, member_id: str
    ) -> GroupAssignment | None:
        """:meth:`heartbeat` for the event loop: None, having changed nothing, where it
        would wait (a worker thread holds the group past a short wait, or a member's
        session ran out and the group must be rebalanced); call :meth:`heartbeat` on a
        worker then. Raises as it does."""
        try:
            return self._heartbeat(namespace, topic, group, member_id, False)
        except WouldWait:
            return None

    def _heartbeat(
        self, namespace: str, topic: str, group: str, member_id: str, may_wait: bool
    ) -> GroupAssignment:
        gid = self._gid(namespace, topic, group)
        with holding(self._lock, may_wait):
            record = self._require_member(namespace, topic, gid, member_id, may_wait)
            self._touch(gid, member_id)
            return self._assignment(record, member_id, gid)

    def leave(self, namespace: str, topic: str, group: str, member_id: str) -> None:
        """Leave the group at once (a rebalance), rather than after the session timeout."""
        gid = self._gid(namespace, topic, group)
        with self._lock:
            record = self._require_member(namespace, topic, gid, member_id)
            members = {m: v for m, v in record.members.items() if m != member_id}
            self._sessions.pop((gid, member_id), None)
            self._rebalance(namespace, topic, gid, record, members)

    # --- consuming -------------------------------------------------------------------

    def waiting(
        self, namespace: str, topic: str, group: str, member_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """Around the wait of a member's long poll between two of its scans: polling is
        how a member stays, so it is not dropped while it waits, however much shorter
        than the wait its session is (on the event loop: no lock, no store write, one
        read of the topic's identity). Where reads wait on the network, take
        :meth:`session` on a worker thread and wait in :meth:`waiting_in` instead."""
        return self.waiting_in(self.session(namespace, topic, group, member_id))

    def session(self, namespace: str, topic: str, group: str, member_id: str) -> _Session | None:
        """The member's session (None: it has none), as :meth:`waiting_in` takes it;
        reads the topic's identity from the store."""
        return self._sessions.get((self._gid(namespace, topic, group), member_id))

    @contextlib.contextmanager
    def waiting_in(self, session: _Session | None) -> Iterator[None]:
        """:meth:`waiting` with the member's :meth:`session` at hand: memory only."""
        if session is None:
            yield
            return
        session.waiting += 1
        try:
            yield
        finally:
            session.waiting -= 1
            session.seen = self._clock()

    def poll(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str,
        *,
        limit: int,
        snapshot: Transaction,
        max_bytes: int | None = None,
    ) -> tuple[list[Message], GroupAssignment]:
        """The member's next messages (at most ``limit``, and none past the message
        that brings their payloads and keys to ``max_bytes``: default and most, the
        server's ``fetch_max_bytes``), read-committed in ``snapshot``, and its current
        assignment, as a poll answer gives them (without write pointers). Polling
        counts as a heartbeat."""
        rows, _, assignment = self.poll_columns(
            namespace, topic, group, member_id, limit=limit, snapshot=snapshot,
            max_bytes=max_bytes,
        )  # fmt: skip
        return rows.messages(), assignment

    def poll_columns(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str,
        *,
        limit: int,
        snapshot: Transaction,
        max_bytes: int | None = None,
    ) -> tuple[Selection, MessageId | None, GroupAssignment]:
        """:meth:`poll` as the columns of a columnar poll response (the selected rows
        of the pages the member scanned), and the last message's id."""
        budget = self._messaging.max_bytes(max_bytes)
        gid = self._gid(namespace, topic, group)
        with self._lock:
            record = self._require_member(namespace, topic, gid, member_id)
            session = self._touch(gid, member_id)
            owned = record.members[member_id].partitions
            if any(p not in session.cursors for p in owned):
                # A session the server does not remember (it restarted): the member's
                # partitions start at their committed positions.
                committed = self.positions(gid, snapshot)
                begin = self._start_position(namespace, topic, record)
                for p in owned:
                    if p not in session.cursors:
                        session.cursors[p] = committed.get(p, begin)
                        session.origins[p] = begin
            cursors = {p: session.cursors.get(p) for p in owned}
            assignment = self._assignment(record, member_id, gid)
        if not owned:
            return Selection(), None, assignment
        # The group's members' partitions: the first member to reach a page lays out
        # every member's share of it.
        others = {frozenset(m.partitions) for m in record.members.values()}
        out, last, scanned = self._scan(
            namespace, topic, gid[:2], record.partitions, cursors, limit, budget, snapshot,
            others,
        )  # fmt: skip
        with self._lock:
            # Only where nothing moved meanwhile (a rebalance resets cursors).
            now_session = self._sessions.get((gid, member_id))
            current = self._read(gid)
            if now_session is not None and current is not None and member_id in current.members:
                still = set(current.members[member_id].partitions)
                for p, cursor in cursors.items():
                    if p in still and now_session.cursors.get(p) == cursor:
                        now_session.cursors[p] = _later(cursor, scanned.get(p))
        return out, last, assignment

    def _scan(
        self,
        namespace: str,
        topic: str,
        topic_key: tuple[int, int],
        partitions: int,
        cursors: Mapping[int, MessageId | None],
        limit: int,
        budget: int,
        snapshot: Transaction,
        others: Iterable[frozenset[int]] = (),
    ) -> tuple[Selection, MessageId | None, dict[int, MessageId | None]]:
        starts = list(cursors.values())
        start: MessageId | None = None if None in starts else min(s for s in starts if s)
        owned = frozenset(cursors)
        out = Selection()
        examined = 0
        last: MessageId | None = None
        returned: MessageId | None = None  # the last message in ``out``
        passed = 0  # at least the payload and key bytes of the pages passed, so ``out``'s
        pages = self._pages.setdefault(topic_key, Pages())
        while len(out) < limit and examined < _SCAN_BUDGET:
            page = pages.find(start)
            kept = page is not None
            if page is None:
                # One fetch per page however many members miss it at once: they move
                # in step, and the worker threads share one interpreter anyway.
                with pages.fetching:
                    page = pages.find(start)
                    if page is None:
                        page = self._fetch_page(namespace, topic, start, snapshot)
                        pages.add(page)
            first = page.after(start)
            ids, id_at, size = page.columns.ids, page.id_at, len(page)
            room = limit - len(out)
            share: Share
            if first < size and all(c is None or c < id_at(first) for c in cursors.values()):
                # No cursor ahead of this place (a member moves its cursors together,
                # unless a rebalance gave it partitions from elsewhere): the page's
                # share for these partitions, from here on.
                share = page.share(partitions, owned, others)
                rows = share.rows
                lo = first if isinstance(rows, range) else bisect.bisect_left(rows, first)
            else:
                index = page.by_partition(partitions)
                picked: list[int] = []
                for p, cursor in cursors.items():
                    indices = index.get(p)
                    if not indices:
                        continue
                    lo = bisect.bisect_left(indices, first)
                    if cursor is not None:
                        # The 20-byte form sorts as the ids do.
                        at = bisect.bisect_right(indices, cursor.to_bytes(), key=ids.__getitem__)
                        lo = max(lo, at)
                    # The first ``room`` of each partition hold the first ``room`` of
                    # them all; fewer than ``room`` in all means none was cut short.
                    picked.extend(indices[lo : lo + room])
                picked.sort()
                share, lo = Share(page.columns, picked), 0
            hi = min(len(share), lo + room)
            examined += size - first
            cut = False
            if hi > lo and passed + page.data >= budget:
                # The bound may fall in this page (the rows are counted only then):
                # what is left of it after the rows taken so far.
                left = budget - out.data()
                if share.data(lo, hi) >= left:
                    # The message that reaches the budget is the member's last.
                    hi = share.cut(lo, hi, left)
                    cut = True
            out.add(share, lo, hi)
            if hi > lo:
                returned = id_at(share.rows[hi - 1])
            if cut or hi - lo >= room:
                last = returned
                break
            if size:
                last = id_at(-1)
            if len(out) >= limit or not size or not (page.full or kept):
                break
            # A kept page that ended early ended where the topic did when it was
            # fetched: what was published since comes after it, fetched fresh.
            passed += page.data
            start = page.last
        # Everything up to ``last`` of every owned partition was examined.
        scanned = {
            p: (last if last is not None and (c is None or last > c) else c)
            for p, c in cursors.items()
        }
        return out, returned, scanned

    def _fetch_page(
        self, namespace: str, topic: str, start: MessageId | None, snapshot: Transaction
    ) -> Page:
        size = self._messaging.config.fetch_max_limit
        # Not counted here: a page serves several members and waits, each poll is
        # counted once when it answers (its rows).
        columns = self._messaging.fetch_page_columns(
            namespace, topic, start=start, inclusive=start is None, limit=size,
            transaction=snapshot, count=False,
        )  # fmt: skip
        page = Page(start, columns, len(columns.ids) == size or columns.cut)
        if columns.ids:
            # Kept for other members and later polls: only while its oldest message is
            # within the topic's TTL, or a member behind the retention cutoff would be
            # handed what a fresh read (and the group's lag) no longer counts. Messages
            # with a TTL of their own, or stored apart from their entry, are not
            # tracked: the page's lifetime bounds how late they may still come.
            ttl_ms = self._messaging.get_topic(namespace, topic).ttl * 1000
            page.stale_at = MessageId.from_bytes(columns.ids[0]).publish_ts + ttl_ms
        return page

    # --- positions -------------------------------------------------------------------

    def commit(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str,
        positions: Mapping[int, MessageId],
        *,
        write_pointer: int | None = None,
        generation: int | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> list[bytes]:
        """Commit the member's positions (each: the id of the last message it consumed
        in that partition). With ``write_pointer`` they are part of that transaction and
        the change keys to commit it with are returned; without, they commit now. (The
        one-request transaction uses :meth:`prepare_commit` instead.) ``generation``:
        the newest the member heard of, where it says (see :meth:`_check_commit`);
        ``generations``: per partition, the one its position is of, where named (it
        stands for ``generation`` there).

        :class:`PartitionFenced` for a partition the member does not own, or has owned
        only since a generation newer than it heard of; :class:`BadRequest` for a
        position past what was delivered to the member."""
        gid = self._gid(namespace, topic, group)
        with self._lock:
            self._check_commit(
                namespace, topic, gid, member_id, positions,
                generation=generation, generations=generations,
            )  # fmt: skip
            changes = [change_key(*gid[:2], group, p) for p in sorted(positions)]
            if write_pointer is not None:
                self._store.apply(self._positions_fn(gid, positions, write_pointer))
                return changes
            own = self._tx.begin()
            try:
                self._store.apply(self._positions_fn(gid, positions, own.write_pointer))
                self._tx.commit(own.write_pointer, changes)
            except BaseException:
                _quietly(self._tx.invalidate, own.write_pointer)
                raise
            return []

    def prepare_commit(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str,
        positions: Mapping[int, MessageId],
        write_pointer: int,
        *,
        generation: int | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> PositionsWrite:
        """Check a commit of the member's positions under ``write_pointer`` as
        :meth:`commit` does (same errors), and return its write, to carry in the store
        write of the transaction's messages (the one-request transaction: positions,
        messages and commit made durable by one fsync) or to apply alone. That
        transaction commits without change keys, so it cannot lose a conflict at its
        commit: the write fails with :class:`TransactionConflict` instead if another
        open transaction holds a position of one of the partitions."""
        return self._prepare_commit(
            namespace, topic, group, member_id, positions, write_pointer, True,
            generation, generations,
        )  # fmt: skip

    def prepare_commit_nowait(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str,
        positions: Mapping[int, MessageId],
        write_pointer: int,
        *,
        generation: int | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> PositionsWrite | None:
        """:meth:`prepare_commit` for the event loop: None, having changed nothing,
        where it would wait (as :meth:`heartbeat_nowait`); call :meth:`prepare_commit`
        on a worker then. Raises as it does."""
        try:
            return self._prepare_commit(
                namespace, topic, group, member_id, positions, write_pointer, False,
                generation, generations,
            )  # fmt: skip
        except WouldWait:
            return None

    def _prepare_commit(
        self,
        namespace: str,
        topic: str,
        group: str,
        member_id: str,
        positions: Mapping[int, MessageId],
        write_pointer: int,
        may_wait: bool,
        generation: int | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> PositionsWrite:
        gid = self._gid(namespace, topic, group)
        with holding(self._lock, may_wait):
            self._check_commit(
                namespace, topic, gid, member_id, positions, may_wait,
                generation=generation, generations=generations,
            )  # fmt: skip
            # Until the write lands, a rebalance would not find its record: it finds
            # the pointer here instead (and invalidates it, fencing the commit).
            snapshot = self._tx.snapshot()
            assert snapshot is not None
            still_open = set(snapshot.in_progress)
            prepared = self._prepared.setdefault(gid, {})
            for p in list(prepared):
                prepared[p] &= still_open
                if not prepared[p]:
                    del prepared[p]
            for p in positions:
                prepared.setdefault(p, set()).add(write_pointer)
        fn = self._positions_fn(gid, positions, write_pointer, one_request=True)
        return PositionsWrite(self._store, self._tx, write_pointer, fn)

    def _check_commit(
        self,
        namespace: str,
        topic: str,
        gid: _GroupId,
        member_id: str,
        positions: Mapping[int, MessageId],
        may_wait: bool = True,
        *,
        generation: int | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> None:
        """Under the lock: the member owns each partition, has heard that it does since
        it got it last, and was delivered each position.

        The second is Kafka's generation check (ILLEGAL_GENERATION): a partition that
        moved away and came back while the member heard nothing has positions of the
        member's from its earlier ownership, behind what the owner in between
        committed. Heard means the newest generation an answer told the member (join,
        heartbeat, poll), or the one its commit names, whichever is older: a poll
        answered ahead may tell it before the application has seen it. A session the
        server does not remember (it restarted) heard nothing it knows of: fenced
        unless the commit names a generation (the owners' tenure is durable). A
        position may name its own (``generations``), for the commit's: positions a
        transaction took across a rebalance are of different generations, and the
        older ones must not pass as of the newest."""
        if not positions:
            raise BadRequest("a commit names at least one partition")
        group = gid[2]
        try:
            record = self._require_member(namespace, topic, gid, member_id, may_wait)
        except MemberNotFound as exc:
            # Dropped (its session timed out) or gone: whatever it owned moved.
            raise PartitionFenced(f"{exc.message}; its partitions moved") from None
        session = self._touch(gid, member_id)
        owned = set(record.members[member_id].partitions)
        named = generations or {}
        for p in positions:
            known = [g for g in (session.told, named.get(p, generation)) if g is not None]
            heard = min(known) if known else None
            if not 0 <= p < record.partitions:
                raise BadRequest(f"partition {p} is not in [0, {record.partitions})")
            if p not in owned:
                raise PartitionFenced(
                    f"member {member_id} does not own partition {p} of group {group} "
                    f"(generation {record.generation}): it cannot commit it"
                )
            since = record.since.get(p)
            if since is not None and (heard is None or heard < since):
                raise PartitionFenced(
                    f"member {member_id} has held partition {p} of group {group} since "
                    f"generation {since}, newer than it heard of "
                    f"({'none' if heard is None else heard}): its positions are of an "
                    "earlier ownership (heartbeat or poll, then commit what comes since)"
                )
        # Fenced first: a position of an earlier ownership may also lie past what was
        # delivered since, and the member must learn it was fenced, not that it erred.
        for p, position in positions.items():
            delivered = session.cursors.get(p)
            if delivered is None or position > delivered:
                raise BadRequest(
                    f"position {position.hex} of partition {p} is past what was "
                    "delivered to this member"
                )

    def rollback(
        self,
        namespace: str,
        topic: str,
        group: str,
        write_pointer: int | None,
        *,
        member_id: str | None = None,
    ) -> int:
        """Remove the positions written under ``write_pointer`` (its transaction is being
        aborted); how many were removed. With ``member_id``, that member is rewound to
        its partitions' committed positions, so it gets the aborted batch again (without
        ``write_pointer`` that is all: the transaction wrote no position)."""
        gid = self._gid(namespace, topic, group)
        if member_id is not None:
            _check_member_id(member_id)
        start, stop = gkeys.positions_range(*gid)
        if write_pointer is None:
            if member_id is not None:
                self._rewind(namespace, topic, gid, member_id)
            return 0

        snapshot = self._tx.snapshot()
        assert snapshot is not None
        if is_visible(snapshot, write_pointer):
            # Committed already (a rollback sent after the commit): its positions are
            # the group's, and removing them would deliver what it committed again.
            if member_id is not None:
                self._rewind(namespace, topic, gid, member_id)
            return 0

        def remove(view: WriteView) -> int:
            doomed = [
                k
                for k, _ in view.scan(_META, start, stop)
                if gkeys.write_pointer_of(k)[1] == write_pointer
            ]
            for key in doomed:
                view.delete(_META, key)
            return len(doomed)

        removed = self._store.apply(remove)
        if member_id is not None:
            self._rewind(namespace, topic, gid, member_id)
        return removed

    def _rewind(self, namespace: str, topic: str, gid: _GroupId, member_id: str) -> None:
        with self._lock:
            record = self._read(gid)
            session = self._sessions.get((gid, member_id))
            if record is None or session is None or member_id not in record.members:
                return
            snapshot = self._tx.snapshot()
            assert snapshot is not None
            committed = self.positions(gid, snapshot)
            begin = self._start_position(namespace, topic, record)
            for p in record.members[member_id].partitions:
                session.cursors[p] = committed.get(p, session.origins.get(p, begin))

    def _positions_fn(
        self,
        gid: _GroupId,
        positions: Mapping[int, MessageId],
        write_pointer: int,
        *,
        one_request: bool = False,
    ) -> Callable[[WriteView], None]:
        """The write of positions under ``write_pointer``. For a one-request
        transaction (:meth:`prepare_commit`) it loses the partition conflict here, and
        leaves the pointer's guard to whoever runs it (:class:`PositionsWrite`)."""
        snapshot = self._tx.snapshot()
        assert snapshot is not None
        # Open as of the snapshot, this transaction aside (it is among them).
        others = frozenset(snapshot.in_progress) - {write_pointer} if one_request else frozenset()
        tx = self._tx

        def write(view: WriteView) -> None:
            if not one_request:
                # Checked in the write itself, as publishes are: nothing lands under a
                # pointer that ended, so pruning the invalid list stays safe.
                tx.check_writable(write_pointer, action=_COMMIT_UNDER)
            if view.get(_META, gkeys.group_key(*gid)) is None:
                raise GroupNotFound(f"group {gid[2]} does not exist")
            hidden = _compact(view, gid, positions, snapshot)
            for p, position in positions.items():
                if p in hidden and hidden[p] & others:
                    # Raised inside the write: none of its writes are applied.
                    raise TransactionConflict(
                        f"another open transaction commits partition {p} of group "
                        f"{gid[2]}: this one fails"
                    )
                key = gkeys.position_key(*gid, p, write_pointer)
                view.put(_META, key, position.to_bytes())

        return write

    def positions(self, gid: _GroupId, snapshot: Transaction) -> dict[int, MessageId]:
        """The committed position of each partition that has one."""
        start, stop = gkeys.positions_range(*gid)
        found: dict[int, tuple[int, MessageId]] = {}
        with self._store.read() as view:
            for key, raw in view.scan(_META, start, stop):
                p, wp = gkeys.write_pointer_of(key)
                if wp != 0 and not is_visible(snapshot, wp):
                    continue
                best = found.get(p)
                if best is None or wp >= best[0]:
                    found[p] = (wp, MessageId.from_bytes(raw))
        return {p: position for p, (_, position) in found.items()}

    # --- administration --------------------------------------------------------------

    def describe(self, namespace: str, topic: str, group: str) -> GroupInfo:
        """A group's members, partitions, positions and lag (messages after the
        position, read-committed)."""
        gid = self._gid(namespace, topic, group)
        with self._lock:
            record = self._read(gid)
            if record is None:
                raise GroupNotFound(f"topic {namespace}:{topic} has no group {group}")
            members = self._alive(gid, record)
            if set(members) != set(record.members):
                record = self._rebalance(namespace, topic, gid, record, dict(members))
        snapshot = self._tx.snapshot()
        assert snapshot is not None
        positions = self.positions(gid, snapshot)
        lags, exact = self._lags(namespace, topic, record, positions, snapshot)
        return GroupInfo(
            group=group,
            partition_count=record.partitions,
            generation=record.generation,
            start=record.start,
            members={m: v.partitions for m, v in record.members.items()},
            partitions=tuple(
                GroupPartition(p, record.owner(p), positions.get(p), lags.get(p), exact)
                for p in range(record.partitions)
            ),
            end=self._messaging.end(namespace, topic, snapshot).newest_id,
        )

    def _lags(
        self,
        namespace: str,
        topic: str,
        record: GroupRecord,
        positions: Mapping[int, MessageId],
        snapshot: Transaction,
        budget: int = _LAG_BUDGET,
    ) -> tuple[dict[int, int], bool]:
        """Each partition's lag: the messages after its committed position or, with
        none, after where a member would start it now. For a group starting at "latest"
        that is wherever the topic ends when a member gets the partition: no place to
        count from, so such partitions have no lag (Kafka's "-"), rather than a 0 that
        stays 0 however far the group falls behind."""
        floors: dict[int, MessageId | None] = {
            p: positions.get(p) for p in range(record.partitions)
        }
        if record.start == "latest":
            floors = {p: f for p, f in floors.items() if f is not None}
        lags = dict.fromkeys(floors, 0)
        if not floors:
            return lags, True
        firsts = list(floors.values())
        start = None if None in firsts else min(f for f in firsts if f)
        examined = 0
        page_size = self._messaging.config.fetch_max_limit
        # Floors in the 20-byte form, which sorts as the ids do.
        raw_floors = {p: None if f is None else f.to_bytes() for p, f in floors.items()}
        while examined < budget:
            columns = self._messaging.fetch_page_columns(
                namespace,
                topic,
                start=start,
                inclusive=start is None,
                limit=page_size,
                transaction=snapshot,
                count=False,  # counting the lag is no poll
            )
            page = Page(start, columns, False)
            for h, message_id in zip(page.hashes, columns.ids, strict=True):
                p = h % record.partitions
                if p not in raw_floors:
                    continue
                floor = raw_floors[p]
                if floor is None or message_id > floor:
                    lags[p] += 1
            examined += len(page)
            # A page ends short at the topic's end or an open transaction, or at its
            # byte bound (then there is more).
            if len(page) < page_size and not columns.cut:
                return lags, True
            start = page.last
        return lags, False

    def lags(
        self, budget: int = _METRICS_LAG_BUDGET, only: tuple[str, str] | None = None
    ) -> list[tuple[str, str, str, int | None, bool]]:
        """``(namespace, topic, group, lag, exact)`` of every group of every live topic
        (or of the ``only`` one), for ``/metrics`` and stats: each lag counted by a scan of
        at most ``budget`` entries (a lower bound past it), the sum over the partitions
        that have one (None: none has, see :meth:`_lags`)."""
        if only is None:
            names = self._messaging.topic_names()
            start, stop = gkeys.GROUP_PREFIX, gkeys.GROUP_PREFIX[:-1] + b"0"
        else:
            topic_id, generation = self._messaging.identity(*only)
            names = {topic_id: only}
            start, stop = gkeys.groups_range(topic_id, generation)
        with self._store.read() as view:
            found = [(k, gkeys.decode_group(v)) for k, v in view.scan(_META, start, stop)]
        snapshot = self._tx.snapshot()
        assert snapshot is not None
        out = []
        for key, record in found:
            topic_id, generation = gkeys.topic_of(key)
            if topic_id not in names:
                continue
            namespace, topic = names[topic_id]
            try:
                if self._messaging.identity(namespace, topic) != (topic_id, generation):
                    continue  # a group of an older generation: dropped with the topic
            except TidingsError:
                continue
            gid = (topic_id, generation, gkeys.group_name_of(key))
            positions = self.positions(gid, snapshot)
            try:
                lags, exact = self._lags(namespace, topic, record, positions, snapshot, budget)
            except TopicNotFound:
                continue  # deleted since it was listed: its groups went with it
            total = sum(lags.values()) if lags else None
            out.append((namespace, topic, gid[2], total, exact))
        return out

    def topic_lags(self, namespace: str, topic: str) -> dict[str, int | None]:
        """Each group of the topic with its total lag (for topic stats)."""
        only = (namespace, topic)
        return {group: lag for _, _, group, lag, _ in self.lags(_METRICS_LAG_BUDGET, only)}

    def list(self, namespace: str, topic: str) -> list[str]:
        """The names of the topic's groups, sorted."""
        topic_id, generation = self._messaging.identity(namespace, topic)
        start, stop = gkeys.groups_range(topic_id, generation)
        with self._store.read() as view:
            return [gkeys.group_name_of(k) for k, _ in view.scan(_META, start, stop)]

    def reset(self, namespace: str, topic: str, group: str, to: str | MessageId | int) -> None:
        """Set every partition's position: ``earliest``, ``latest``, after a message id,
        or before the first message at or after a time (ms). Only while the group has no
        members (Kafka's rule: a live member would not see it)."""
        gid = self._gid(namespace, topic, group)
        with self._lock:
            record = self._read(gid)
            if record is None:
                raise GroupNotFound(f"topic {namespace}:{topic} has no group {group}")
            if self._alive(gid, record):
                raise Conflict(f"group {group} has members: reset it when they are gone")
            # On an empty topic "latest" is before every message: written as such, since
            # no position would hand the group back to its own start and show no lag.
            position = self._reset_position(namespace, topic, to) or MessageId(0, 0, 0, 0)
            start, stop = gkeys.positions_range(*gid)

            def write(view: WriteView) -> None:
                view.delete_range(_META, start, stop)
                for p in range(record.partitions):
                    view.put(_META, gkeys.position_key(*gid, p, 0), position.to_bytes())

            self._store.apply(write)

    def _reset_position(
        self, namespace: str, topic: str, to: str | MessageId | int
    ) -> MessageId | None:
        if to == "earliest":
            # Explicitly before every message (no id is ever all zeros): removing the
            # positions instead would hand the group back to its own start, which may
            # be "latest".
            return MessageId(0, 0, 0, 0)
        if to == "latest":
            return self._latest(namespace, topic)
        if isinstance(to, MessageId):
            # Past the newest message (an id of another topic, a typo) it would park the
            # group in the future, skipping whatever comes until then: to the end
            # instead, as Kafka moves an offset past the log end to the log end.
            newest = self._messaging.end(namespace, topic, None).newest_id
            if newest is None or to > newest:
                return self._latest(namespace, topic)
            return to
        if isinstance(to, int) and not isinstance(to, bool) and to >= 0:
            first = self._messaging.fetch(namespace, topic, start=to, limit=1, count=False)
            if not first:
                return self._latest(namespace, topic)
            # Just before the first message at or after the time: everything earlier is
            # consumed, that message is next.
            return first[0].id.previous()
        raise BadRequest(f"reset to earliest, latest, a message id or a time, got {to!r}")

    def delete(self, namespace: str, topic: str, group: str) -> None:
        """Delete a group and its positions (it may have members: they are dropped)."""
        gid = self._gid(namespace, topic, group)
        with self._lock:
            if self._read(gid) is None:
                raise GroupNotFound(f"topic {namespace}:{topic} has no group {group}")
            start, stop = gkeys.positions_range(*gid)

            def drop(view: WriteView) -> None:
                view.delete(_META, gkeys.group_key(*gid))
                view.delete_range(_META, start, stop)

            self._store.apply(drop)
            for key in [k for k in self._sessions if k[0] == gid]:
                del self._sessions[key]

    def referenced_pointers(self, candidates: set[int]) -> set[int]:
        """The pointers among ``candidates`` that some position record is written
        under (the invalid-list pruner keeps those)."""
        found: set[int] = set()
        prefix = gkeys.POSITION_PREFIX
        with self._store.read() as view:
            for key, _ in view.scan(_META, prefix, prefix + b"\xff"):
                wp = gkeys.write_pointer_of(key)[1]
                if wp in candidates:
                    found.add(wp)
        return found

    def forget_topic(self, topic_id: int) -> None:
        """Drop every group row of a deleted topic (all its generations)."""

        def drop(view: WriteView) -> None:
            for start, stop in gkeys.topic_range(topic_id):
                view.delete_range(_META, start, stop)

        self._store.apply(drop)
        with self._lock:
            for key in [k for k in self._sessions if k[0][0] == topic_id]:
                del self._sessions[key]

    # --- internals -------------------------------------------------------------------

    def _gid(self, namespace: str, topic: str, group: str) -> _GroupId:
        check_name(group, "group")
        topic_id, generation = self._messaging.identity(namespace, topic)
        return topic_id, generation, group

    def _read(self, gid: _GroupId, view: ReadView | None = None) -> GroupRecord | None:
        if view is None:
            with self._store.read() as fresh:
                raw = fresh.get(_META, gkeys.group_key(*gid))
        else:
            raw = view.get(_META, gkeys.group_key(*gid))
        return None if raw is None else gkeys.decode_group(raw)

    def _alive(
        self, gid: _GroupId, record: GroupRecord, *, forget: bool = True
    ) -> dict[str, Member]:
        """The members not past their session timeout; with ``forget``, the sessions of
        the others are dropped."""
        now = self._clock()
        alive = {}
        for member_id, member in record.members.items():
            session = self._sessions.get((gid, member_id))
            seen = session.seen if session is not None else self._started
            if now - seen <= member.timeout_ms / 1000 or (
                session is not None and session.waiting > 0
            ):
                alive[member_id] = member
            elif forget:
                self._sessions.pop((gid, member_id), None)
        return alive

    def _touch(self, gid: _GroupId, member_id: str) -> _Session:
        session = self._sessions.get((gid, member_id))
        if session is None:
            session = self._sessions[(gid, member_id)] = _Session(self._clock())
        session.seen = self._clock()
        return session

    def _require_member(
        self, namespace: str, topic: str, gid: _GroupId, member_id: str, may_wait: bool = True
    ) -> GroupRecord:
        _check_member_id(member_id)
        record = self._read(gid)
        if record is None:
            raise GroupNotFound(f"topic {namespace}:{topic} has no group {gid[2]}")
        alive = self._alive(gid, record, forget=may_wait)
        if set(alive) != set(record.members):
            if not may_wait:
                raise WouldWait  # the rebalance is a store write
            record = self._rebalance(namespace, topic, gid, record, alive)
        if member_id not in record.members:
            raise MemberNotFound(
                f"{member_id} is not a member of group {gid[2]} (dropped after its "
                "session timeout, or it left): join again"
            )
        return record

    def _rebalance(
        self,
        namespace: str,
        topic: str,
        gid: _GroupId,
        record: GroupRecord,
        members: Mapping[str, Member],
    ) -> GroupRecord:
        """Write the group with ``members``, reassigning if the member set changed."""
        old = {m: v.partitions for m, v in record.members.items()}
        changed = set(members) != set(record.members) or record.generation == 0
        if changed:
            new = assign(record.partitions, old, list(members))
            members = {m: replace(v, partitions=new.get(m, ())) for m, v in members.items()}
            generation = record.generation + 1
            # A partition kept by its owner keeps its tenure; one that moved starts anew.
            since = {
                p: record.since.get(p, 0) if p in old.get(m, ()) else generation
                for m, v in members.items()
                for p in v.partitions
            }
            record = GroupRecord(record.partitions, generation, members, record.start, since)
            self._moved(namespace, topic, gid, record, old)
        else:
            record = replace(record, members=dict(members))
        raw = gkeys.encode_group(record)
        self._store.apply(lambda view: view.put(_META, gkeys.group_key(*gid), raw))
        return record

    def _moved(
        self,
        namespace: str,
        topic: str,
        gid: _GroupId,
        record: GroupRecord,
        old: Mapping[str, Iterable[int]],
    ) -> None:
        """After a rebalance: fence the open transactions of partitions that moved, and
        start newly assigned partitions at their committed position."""
        before = {p: m for m, ps in old.items() for p in ps}
        moved = [p for p in range(record.partitions) if before.get(p) != record.owner(p)]
        if not moved:
            return
        pending = self._pending(gid, moved)
        for write_pointer in pending:
            _quietly(self._tx.invalidate, write_pointer)
        snapshot = self._tx.snapshot()
        assert snapshot is not None
        positions = self.positions(gid, snapshot)
        start = self._start_position(namespace, topic, record)
        for member_id, member in record.members.items():
            session = self._sessions.get((gid, member_id))
            if session is None:
                session = self._sessions[(gid, member_id)] = _Session(self._clock())
            for p in list(session.cursors):
                if p not in member.partitions:
                    del session.cursors[p]
                    session.origins.pop(p, None)
            for p in member.partitions:
                if before.get(p) != member_id:
                    session.cursors[p] = positions.get(p, start)
                    session.origins[p] = start

    def _pending(self, gid: _GroupId, partitions: Iterable[int]) -> set[int]:
        state = self._tx.state()
        open_ = set(state.in_progress)
        found: set[int] = set()
        prepared = self._prepared.get(gid, {})
        with self._store.read() as view:
            for p in partitions:
                found |= prepared.get(p, set()) & open_
                start, stop = gkeys.partition_range(*gid, p)
                for key, _ in view.scan(_META, start, stop):
                    wp = gkeys.write_pointer_of(key)[1]
                    if wp in open_:
                        found.add(wp)
        return found

    def _start_position(self, namespace: str, topic: str, record: GroupRecord) -> MessageId | None:
        if record.start == "latest":
            return self._latest(namespace, topic)
        return None

    def _latest(self, namespace: str, topic: str) -> MessageId | None:
        """The position of "latest": before the first message of the oldest transaction
        still open (the last stable position), else after the newest message."""
        snapshot = self._tx.snapshot()
        assert snapshot is not None
        end = self._messaging.end(namespace, topic, snapshot)
        if end.last_stable_id is not None:
            return end.last_stable_id.previous()
        return end.newest_id

    def _assignment(self, record: GroupRecord, member_id: str, gid: _GroupId) -> GroupAssignment:
        """The member's assignment, as an answer to it tells it (remembered: see
        :meth:`_check_commit`)."""
        member = record.members[member_id]
        session = self._sessions.get((gid, member_id))
        if session is not None and (session.told is None or session.told < record.generation):
            session.told = record.generation
        since = tuple(record.since.get(p, 0) for p in member.partitions)
        return GroupAssignment(
            member_id, record.generation, member.partitions, record.partitions, since
        )


@dataclass(frozen=True, slots=True)
class PositionsWrite:
    """A member's positions under a write pointer, checked and ready to write
    (:meth:`GroupCoordinator.prepare_commit`): ``carry(view)`` inside the store write
    that holds the transaction's messages and decides its commit (the commit step
    stands in for the write pointer's guard there), or alone (:meth:`submit`)."""

    store: Store
    tx: TransactionManager
    write_pointer: int
    carry: Callable[[WriteView], None]

    def submit(self) -> Future[None]:
        """Write the positions in a store write of their own, guarded as publishes are
        (nothing lands under a write pointer that ended); resolves once durable."""
        carry, tx, wp = self.carry, self.tx, self.write_pointer

        def write(view: WriteView) -> None:
            tx.check_writable(wp, action=_COMMIT_UNDER)
            carry(view)

        return self.store.submit(write)


def _compact(
    view: WriteView, gid: _GroupId, partitions: Iterable[int], snapshot: Transaction
) -> dict[int, set[int]]:
    """Drop the records of ``partitions`` that can never count again: those of invalid
    transactions, and visible ones older than the newest visible one. Answers, per
    partition, the write pointers of the records left that are not visible (open
    transactions). Partitions close together are walked as one span: a copier commits
    every partition in each transaction, and a range each cost 32 cursors; a commit
    of a few partitions far apart (of up to 1,024) walks their ranges alone."""
    wanted = set(partitions)
    if not wanted:
        return {}
    named = sorted(wanted)
    lo, hi = named[0], named[-1]
    spans = [(lo, hi)] if 4 * len(named) >= hi - lo + 1 else [(p, p) for p in named]
    doomed: list[bytes] = []
    newest: dict[int, bytes] = {}  # each partition's newest visible record so far
    hidden: dict[int, set[int]] = {}
    invalid = snapshot.invalid
    for first, last in spans:
        start = gkeys.partition_range(*gid, first)[0]
        stop = gkeys.partition_range(*gid, last)[1]
        for key, _ in view.scan(_META, start, stop):
            p, wp = gkeys.write_pointer_of(key)
            if p not in wanted:
                continue
            if wp in invalid:
                doomed.append(key)
            elif wp == 0 or is_visible(snapshot, wp):
                # Keys sort by write pointer within a partition: a later one is newer.
                older = newest.get(p)
                if older is not None:
                    doomed.append(older)
                newest[p] = key
            else:
                hidden.setdefault(p, set()).add(wp)
    for key in doomed:
        view.delete(_META, key)
    return hidden


def _later(a: MessageId | None, b: MessageId | None) -> MessageId | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _check_member_id(member_id: object) -> None:
    if not isinstance(member_id, str) or not 1 <= len(member_id) <= 64 or not member_id.isalnum():
        raise BadRequest("a member id is 1-64 letters and digits (as join answered it)")


def _quietly(fn: Callable[[int], None], write_pointer: int) -> None:
    # It ended meanwhile (TransactionNotInProgress and kin): nothing of it can commit.
    with contextlib.suppress(TidingsError):
        fn(write_pointer)

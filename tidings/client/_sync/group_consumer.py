# Generated from tidings/client/_async/group_consumer.py by scripts/unasync.py; do not edit.

"""A member of a consumer group (docs/client.md, "Consumer groups").

The server splits the topic among the group's members by key hash and remembers what
it delivered to each; this side joins, polls, heartbeats and commits. A position
commits only when the application says so: ``commit()`` now, or
``commit(transaction=tx)`` as part of a transaction, which moves the positions if and
only if ``tx`` commits (the consume-transform-produce loop of Kafka's
``sendOffsetsToTransaction``). With ``auto_commit`` each poll first commits what the
previous ones returned, and ``close()`` commits the rest (at least once).

There is no background thread: a member stays in its group by polling, or by
``heartbeat()`` while it works on a long batch; one silent for ``session_timeout`` is
dropped and its partitions go to the others. A dropped member that polls again
rejoins as a new member.

Reading ahead: when a poll answers a full page, the member sends its next poll at once
(waiting for nothing on the server; a task, or a worker thread in the sync client), so
the server reads the next page while the application works on this one. At most one
such poll is in flight, and its answer is what the next ``poll()`` returns (an empty
one is dropped for a poll of its own: it tells nothing of what came since; so are the
messages of partitions a rebalance heard of since took away). Commits are unaffected:
positions are those of messages *returned* to the application, never of a page read
ahead. Before a rollback rewinds the member, the poll in flight is waited for and its
answer dropped, so the rewind comes after it on the server and delivery restarts from
the committed positions.

A page read ahead may come from a server that restarted since (which delivers again from
the committed positions). Within one assignment generation, the server's pages of a
member come in id order, every cursor past the previous page; so a page that starts at
or before the last message delivered means the server started over, and what it sends
again up to that message is dropped here (it was delivered, and positions past it
commit it).
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping
from zlib import crc32

from tidings.client._sync.concurrency import Pending, Worker, sleep, yield_turns
from tidings.client._sync.session import Session
from tidings.client._sync.transactions import TransactionContext
from tidings.client.api import Call, GroupPage, PollPage, check_max_bytes
from tidings.client.outage import Outage
from tidings.client.outage import log as outage_log
from tidings.codec.admin import START_ALIASES, TransactionGroupCommit
from tidings.codec.groups import partition_of
from tidings.errors import (
    GroupNotFound,
    MemberNotFound,
    PartitionFenced,
    TidingsError,
    TopicNotFound,
)
from tidings.structs import GroupAssignment, Message, MessageId, Transaction

__all__ = ["GroupConsumer"]


class _GroupCommit:
    """A group's positions as a participant of a transaction: their change keys go into
    the commit; a rollback removes them and rewinds the member to its committed
    positions. With ``held`` (positions a deferred transaction held for its one
    request, which did not come) they are sent under the write pointer at the start."""

    name = "consumer group"

    def __init__(
        self,
        consumer: GroupConsumer,
        changes: list[bytes],
        held: TransactionGroupCommit | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> None:
        self._consumer = consumer
        self._changes = changes
        self._held = held
        self._generations = generations or {}
        self._write_pointer: int | None = None

    def start(self, transaction: Transaction) -> None:
        self._write_pointer = transaction.write_pointer
        held = self._held
        if held is not None:
            self._consumer._check_held(held, self._generations)
            # Each position names the generation it is of, so the server fences each by
            # its own (the oldest for the whole, for a server that reads only that).
            generations = {p: g for p, g in self._generations.items() if p in held.positions}
            client = self._consumer._client
            self._changes = client._send(
                client._api.group_commit(
                    held.topic,
                    held.group,
                    held.member_id,
                    held.positions,
                    self._write_pointer,
                    min(generations.values(), default=held.generation),
                    generations,
                )
            )

    def changes(self) -> Iterable[bytes]:
        return self._changes

    def commit(self) -> None:
        pass  # written when the application committed the positions

    def post_commit(self) -> None:
        pass

    def rollback(self) -> None:
        if self._write_pointer is not None:
            self._consumer._rolled_back(self._write_pointer)


class GroupConsumer(Iterator[Message]):
    """Iterates over this member's share of a topic (see :meth:`Client.consume`
    with ``group``)."""

    def __init__(
        self,
        client: Session,
        topic: str,
        group: str,
        start: str = "earliest",
        *,
        batch_size: int = 500,
        wait: float = 10.0,
        session_timeout: float = 10.0,
        auto_commit: bool = False,
        partitions: int | None = None,
        follow: bool = True,
        max_bytes: int | None = None,
    ) -> None:
        start = START_ALIASES.get(start, start)
        if start not in ("earliest", "latest"):
            raise ValueError(
                "a group starts at 'earliest' (or 'beginning') or 'latest' (or 'end') "
                "where it has no position"
            )
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if isinstance(session_timeout, bool) or not (
            isinstance(session_timeout, int | float)
            and session_timeout > 0
            and math.isfinite(session_timeout)
        ):
            # Infinity failed the first poll with OverflowError as it became milliseconds.
            raise ValueError(
                f"session_timeout must be a positive number of seconds, got {session_timeout!r}"
            )
        self._client = client
        self.topic = topic
        self.group = group
        self._start = start
        self._batch_size = batch_size
        self._max_bytes = check_max_bytes(max_bytes)
        self._wait = wait
        self._session_ms = round(session_timeout * 1000)
        self._auto_commit = auto_commit
        self._partition_count = partitions
        self._follow = follow
        self._assignment: GroupAssignment | None = None
        #: The current page's messages not returned yet, made as they are taken.
        self._rest: Iterator[Message] = iter(())
        #: The last message returned to the application, per partition, not committed.
        self._returned: dict[int, MessageId] = {}
        self._closed = False
        self._worker = Worker("tidings-group-read-ahead")
        #: The poll sent ahead: the epoch and member it was sent for, and the call.
        self._ahead: tuple[int, str, Pending[GroupPage] | _Settled] | None = None
        #: Bumped whenever what the server delivered so far stops counting (dropped from
        #: the group, rewound): a poll sent ahead before then is not used.
        self._epoch = 0
        #: The last message delivered in this generation and epoch (see the module doc).
        self._delivered: MessageId | None = None
        #: A poll sent ahead failed on the way: the server may have moved this member
        #: past messages that never arrived, so it is rewound before the next poll.
        self._rewind_first = False
        #: The current page is of an older assignment than the member knows: only
        #: these partitions' messages of it are returned.
        self._keep: frozenset[int] | None = None
        #: The generation since which the member has owned each of its partitions, as
        #: far as it heard.
        self._since: dict[int, int] = {}

    @property
    def member_id(self) -> str | None:
        """This member's id in the group (None before the first poll)."""
        return None if self._assignment is None else self._assignment.member_id

    @property
    def assignment(self) -> GroupAssignment | None:
        """The partitions this member owns as of its last call (None before joining)."""
        return self._assignment

    def _join(self) -> GroupAssignment:
        api = self._client._api
        member_id = self.member_id
        self._assignment = self._client._send(
            api.group_join(
                self.topic,
                self.group,
                member_id,
                self._session_ms,
                self._partition_count,
                self._start,
            )
        )
        assignment = self._assignment
        self._since = dict.fromkeys(assignment.partitions, assignment.generation)
        self._since.update(_owned_since(assignment))
        return assignment

    def _adopt(self, assignment: GroupAssignment) -> None:
        """A new assignment: forget what is not ours any more, and what we had of a
        partition before it moved away and came back (the server says since when we
        hold each: its positions are of an earlier ownership, and the server fences
        them)."""
        if self._assignment is not None and assignment.generation != self._assignment.generation:
            told = _owned_since(assignment)
            since = self._since
            before = set(self._assignment.partitions)
            known = self._assignment.generation
            # Held since a generation newer than we heard of it: it moved away and back.
            owned = {
                p
                for p in assignment.partitions
                if p in before and told.get(p, 0) <= since.get(p, known)
            }
            for p in list(since):
                if p not in owned:
                    del since[p]
            for p in assignment.partitions:
                if p not in owned:
                    since[p] = told.get(p, assignment.generation)
            self._returned = {p: i for p, i in self._returned.items() if p in owned}
            count = assignment.partition_count
            self._rest = iter([m for m in self._rest if partition_of(m, count) in owned])
            # Newly assigned partitions start at their committed positions, which may
            # lie before it: no longer a sign of a server that started over.
            self._delivered = None
        self._assignment = assignment

    def heartbeat(self) -> GroupAssignment:
        """Stay in the group while working on a long batch; answers the assignment."""
        if self._closed:
            # Joining again would put a member no one polls for back in the group,
            # holding partitions until its session runs out.
            raise RuntimeError("the consumer is closed")
        if self._assignment is None:
            return self._join()
        assignment = self._refresh()
        return assignment if assignment is not None else self._join()

    def _refresh(self) -> GroupAssignment | None:
        """Heartbeat and adopt the answer; None (having forgotten everything) where the
        member was dropped, or its group deleted."""
        assert self._assignment is not None
        member_id = self._assignment.member_id
        try:
            assignment = self._client._send(
                self._client._api.group_heartbeat(self.topic, self.group, member_id)
            )
        except (MemberNotFound, GroupNotFound):
            self._lost()
            return None
        self._adopt(assignment)
        return assignment

    def _lost(self) -> None:
        """Dropped from the group: nothing it holds counts any more."""
        self._assignment = None
        self._returned.clear()
        self._rest = iter(())
        self._epoch += 1
        self._delivered = None
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[2].cancel()  # the member it polled for is gone

    def poll(self) -> list[Message]:
        """The next messages of this member's partitions (waiting as configured)."""
        page = list(self._rest)
        if not page:
            page = self._fetch()
        self._note_returned(page)
        return page

    def _before_fetch(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._assignment is None:
            self._join()
        if self._auto_commit and self._returned:
            self._commit_returned()
            if self._assignment is None:  # it was dropped meanwhile
                self._join()

    def _commit_returned(self) -> None:
        """``auto_commit``'s commit of what was returned. Refused because a rebalance
        this member has not heard of yet moved one of those partitions (or dropped it),
        it learns its assignment, which keeps the positions of the partitions it still
        owns, and commits those: the others' messages go to their new owner again (at
        least once). Raising instead would refuse every later poll the same way. A group
        deleted meanwhile took its positions with it: nothing to commit to, and the
        member joins again as after a poll that found it gone (rather than ending a
        following loop that would go on without ``auto_commit``)."""
        try:
            self.commit()
        except PartitionFenced:
            # The refused commit had the member learn its assignment (or find itself
            # dropped): what is left is what it still owns.
            if self._assignment is None or not self._returned:
                return
            self.commit()
        except GroupNotFound:
            self._lost()

    def _fetch(self) -> list[Message]:
        """The next messages not delivered before, decoded whole (for poll())."""
        self._before_fetch()
        while True:
            page = self._fetch_page()
            messages = self._fresh(page.messages())
            if messages is not None:
                return messages

    def _fetch_rows(self) -> tuple[int, Iterator[Message]]:
        """The same for iterating: how many, and the messages, made as they are taken
        where the page's medium allows (as a plain consumer's, docs/client.md)."""
        self._before_fetch()
        while True:
            page = self._fetch_page()
            rows = page.iterate()
            delivered = self._delivered
            if self._keep is not None or (
                rows.first is not None and delivered is not None and rows.first <= delivered
            ):
                # The server started over, or the page is of an older assignment
                # (rare): as _fetch does it, on a list.
                fresh = self._fresh(list(rows.messages))
                if fresh is None:
                    continue
                return len(fresh), iter(fresh)
            if rows.count:
                self._delivered = rows.last
            return rows.count, rows.messages

    def _fresh(self, messages: list[Message]) -> list[Message] | None:
        """A page's messages this member is to return: of the partitions it owns (see
        ``_keep``), not delivered before. None where a page with messages has none of
        them (the next page has what is new)."""
        keep = self._keep
        if keep is not None:
            # Of an older generation: what was delivered in this one (nothing yet) does
            # not cover it, nor does it cover what this one delivers, which starts the
            # partitions the member gained at their committed positions, maybe earlier.
            assert self._assignment is not None
            count = self._assignment.partition_count
            kept = [m for m in messages if partition_of(m, count) in keep]
            return kept if kept or not messages else None
        delivered = self._delivered
        if messages and delivered is not None and messages[0].id <= delivered:
            # The server started over: drop what it already delivered (ids sorted).
            messages = messages[bisect.bisect_right(messages, delivered, key=_id) :]
            if not messages:
                return None  # all of it again
        if messages:
            self._delivered = messages[-1].id
        return messages

    def _fetch_page(self) -> PollPage:
        assert self._assignment is not None
        wait = self._wait if self._follow else 0.0
        answer = self._taken_ahead()
        if self._rewind_first:
            self._rewind()
        for attempt in (1, 2):
            if answer is not None:
                break
            try:
                answer = self._send_poll(self._assignment.member_id, wait)
            except (MemberNotFound, GroupNotFound):
                if attempt == 2:
                    raise
                self._lost()
                self._join()
        assert answer is not None and self._assignment is not None
        member_id = self._assignment.member_id
        self._keep = None
        if answer.generation is not None and answer.partitions is not None:
            if answer.generation < self._assignment.generation:
                # Read ahead before a rebalance this member heard of since (a
                # heartbeat): the assignment it knows stands, and the page's messages
                # of partitions it lost are their new owner's, from its positions; so
                # are those of partitions it lost and got back since, which start
                # again at their committed positions.
                generation, since = answer.generation, self._since
                self._keep = frozenset(
                    p for p in self._assignment.partitions if since.get(p, 0) <= generation
                )
            else:
                count = answer.partition_count or self._assignment.partition_count
                assignment = GroupAssignment(
                    member_id, answer.generation, answer.partitions, count, answer.owned_since
                )
                self._adopt(assignment)
        got = answer.page.count
        if got is not None and (got >= self._batch_size or answer.page.more):
            # A full page (or one at its byte bound): more is likely there. Ask now,
            # before decoding this one.
            self._ahead = (
                self._epoch,
                member_id,
                self._client._begin(self._worker, self._poll_call(member_id, 0)),
            )
            yield_turns()
        return answer.page

    def _send_poll(self, member_id: str, wait: float) -> GroupPage:
        return self._client._send(self._poll_call(member_id, wait))

    def _poll_call(self, member_id: str, wait: float) -> Call[GroupPage]:
        return self._client._api.group_poll(
            self.topic, self.group, member_id, self._batch_size, wait, self._max_bytes
        )

    def _taken_ahead(self) -> GroupPage | None:
        """The answer of the poll sent ahead, if it is still this member's next page.
        Its failure is the poll's: raised, except that a member the server forgot
        rejoins and polls again (as after a poll of its own)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        epoch, member_id, pending = ahead
        try:
            answer = pending.result()
        except (MemberNotFound, GroupNotFound):
            self._lost()
            self._join()
            return None
        except TidingsError as exc:
            if not exc.retriable:
                raise
            # Lost on the way (the connection dropped, the server restarted): what the
            # server delivered with it never arrived. The member is rewound to its
            # committed positions and polls again; what the application already got
            # is dropped as delivered (``_delivered``).
            self._rewind_first = True
            return None
        assignment = self._assignment
        if epoch != self._epoch or assignment is None or assignment.member_id != member_id:
            return None  # rewound or dropped since: what it delivered does not count
        if not answer.page.count:
            # Nothing then, which says nothing of now: a poll of its own instead (a long
            # one while following; the empty answer moved nothing on the server).
            return None
        return answer

    def _rewind(self) -> None:
        """Have the server deliver again from this member's committed positions (after
        a poll sent ahead was lost); a member it forgot rejoins instead."""
        assert self._assignment is not None
        self._epoch += 1
        try:
            self._client._send(
                self._client._api.group_rollback(
                    self.topic, self.group, None, self._assignment.member_id
                )
            )
        except (MemberNotFound, GroupNotFound):
            self._lost()
            self._join()
        self._rewind_first = False

    def _learn_ahead(self) -> None:
        """Wait for the poll in flight, if any, keeping its answer for the next poll,
        and adopt the assignment it tells of where it is newer than ours."""
        ahead = self._ahead
        if ahead is None:
            return
        epoch, member_id, pending = ahead
        try:
            answer = pending.result()
        except Exception as exc:
            self._ahead = (epoch, member_id, _Settled(None, exc))
            return
        self._ahead = (epoch, member_id, _Settled(answer, None))
        assignment = self._assignment
        if (
            epoch == self._epoch
            and assignment is not None
            and assignment.member_id == member_id
            and answer.generation is not None
            and answer.partitions is not None
            and answer.generation > assignment.generation
        ):
            count = answer.partition_count or assignment.partition_count
            self._adopt(
                GroupAssignment(
                    member_id, answer.generation, answer.partitions, count, answer.owned_since
                )
            )

    def _settle_ahead(self) -> None:
        """Wait for the poll in flight, if any, and drop its answer: a rewind after it
        on the server then covers what it delivered."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            with contextlib.suppress(Exception):
                ahead[2].result()

    def _note_returned(self, messages: list[Message]) -> None:
        assert self._assignment is not None or not messages
        if not messages or self._assignment is None:
            return
        count = self._assignment.partition_count
        # The last message of each partition is all a commit needs: from the end, until
        # every owned partition has one (a page of many keys meets them all early).
        remaining = set(self._assignment.partitions)
        latest: dict[int, MessageId] = {}
        for message in reversed(messages):
            p = partition_of(message, count)
            if p not in latest:
                latest[p] = message.id
                remaining.discard(p)
                if not remaining:
                    break
        self._returned.update(latest)

    def commit(self, *, transaction: TransactionContext | None = None) -> None:
        """Commit the position after the last message returned, per partition. With
        ``transaction`` the positions move if and only if it commits (and a rebalance
        that moves a partition first makes it fail); without, they move now.

        :class:`~tidings.errors.PartitionFenced` if this member no longer owns one of
        the partitions; it then learns its assignment (nothing is committed, and what it
        returned of the partitions it lost is dropped), so a later commit covers the
        partitions it still owns."""
        if self._closed and self._assignment is None:
            # It left the group: its partitions may be another's by now, and a commit
            # that did nothing without a word would lose what it was asked to keep.
            raise RuntimeError("the consumer is closed")
        if self._assignment is None or not self._returned:
            return
        api = self._client._api
        member_id = self._assignment.member_id
        # The generation the positions are of: the server fences those of a partition
        # that moved away and came back since (its owner in between committed past them).
        generation = self._assignment.generation
        if transaction is None:
            positions = dict(self._returned)
            try:
                self._client._send(
                    api.group_commit(self.topic, self.group, member_id, positions, None, generation)
                )
            except PartitionFenced:
                # A rebalance it had not heard of moved one of these partitions: it
                # learns its assignment, which drops what it returned of the others
                # (their new owner gets them). Kept, they would fail every later commit,
                # or be committed after the partition came back, behind its new owner.
                with contextlib.suppress(TidingsError):
                    self._refresh()
                raise
            for p, position in positions.items():
                if self._returned.get(p) == position:
                    del self._returned[p]
            return
        # A poll answered ahead may have told this member of a move before the
        # application saw it. That answer is learned first: if it shows a partition of
        # these positions moved (away, or away and back), the transaction must not
        # commit (its output would repeat the new owner's), and the server would refuse
        # it (by the generation each position names; a server from before positions
        # named one goes by the newest it told the member): refused here, the member
        # is rewound before the application goes on.
        positions = dict(self._returned)
        self._learn_ahead()
        if self._returned != positions:
            moved = sorted(set(positions) - set(self._returned))
            # The batch comes again from the committed positions (after the abort this
            # raise causes), as after any fenced transaction.
            self._rolled_back(None)
            raise PartitionFenced(
                f"partitions {moved} of group {self.group} moved since their messages "
                "were delivered to this member: their positions cannot commit"
            )
        held = TransactionGroupCommit(self.topic, self.group, member_id, positions, generation)
        if transaction.defer_group_commit(held, self, generation):
            # They go with the transaction's one request; an abort rewinds this member.
            self._returned.clear()
            return
        participant = _GroupCommit(self, [])
        tx = transaction.enlist(participant)
        participant._changes = self._client._send(
            api.group_commit(
                self.topic, self.group, member_id, positions, tx.write_pointer, generation
            )
        )
        self._returned.clear()

    def _participant(
        self, held: TransactionGroupCommit, generations: Mapping[int, int]
    ) -> _GroupCommit:
        """The participant that sends ``held`` under the write pointer of a transaction
        that began after all (see :meth:`TransactionContext.defer_group_commit`)."""
        return _GroupCommit(self, [], held, generations)

    def _check_held(self, held: TransactionGroupCommit, generations: Mapping[int, int]) -> None:
        """Positions handed to a deferred transaction, just before it sends them: the
        application may have polled or heartbeated since, and learned that a partition
        of them moved away and came back meanwhile (they are of the earlier ownership:
        the transaction's output would repeat the new owner's). The server fences them
        by the generation each names, but a server from before positions named one
        goes by the newest it told this member and would take them. PartitionFenced
        for those, and for partitions no longer ours; the transaction then aborts,
        which rewinds this member."""
        self._learn_ahead()
        assignment = self._assignment
        if assignment is None or assignment.member_id != held.member_id:
            moved = sorted(held.positions)
        else:
            owned = set(assignment.partitions)
            moved = [
                p
                for p in sorted(held.positions)
                if p not in owned
                or self._since.get(p, assignment.generation)
                > generations.get(p, assignment.generation)
            ]
        if moved:
            raise PartitionFenced(
                f"partitions {moved} of group {self.group} moved since their positions "
                "went into the transaction: they cannot commit"
            )

    def _rolled_back(self, write_pointer: int | None) -> None:
        """The transaction holding our positions is being aborted: drop them, and have
        the server deliver again from the committed positions (``write_pointer`` None:
        they were never sent, a rewind is all)."""
        self._settle_ahead()
        self._epoch += 1
        self._delivered = None  # delivered again from the committed positions: wanted
        member_id = self.member_id
        if write_pointer is not None or member_id is not None:
            self._client._send(
                self._client._api.group_rollback(self.topic, self.group, write_pointer, member_id)
            )
        self._rest = iter(())
        self._returned.clear()

    def close(self) -> None:
        """Leave the group (committing first with ``auto_commit``). A leave the server
        does not answer (it is down) is logged, not raised: the server drops the member
        after its session timeout."""
        if self._closed:
            return
        self._closed = True
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[2].cancel()  # the member leaves: what it read ahead goes to the next
        self._worker.close()
        if self._assignment is None:
            return
        member_id = self._assignment.member_id
        try:
            if self._auto_commit and self._returned:
                # A topic deleted meanwhile took the group and its positions with it:
                # nothing left to commit to, as there is nothing left to leave.
                with contextlib.suppress(TopicNotFound):
                    self._commit_returned()
        finally:
            self._assignment = None
            # Dropped already, or dropped with its group (deleted, or with its topic):
            # there is nothing left to leave.
            try:
                self._client._send(self._client._api.group_leave(self.topic, self.group, member_id))
            except (MemberNotFound, GroupNotFound, TopicNotFound):
                pass
            except TidingsError as error:
                # Leaving is a courtesy, as Kafka's close makes it: unanswered, the
                # server drops the member after its session timeout all the same, and a
                # raise here would hide whatever ended the caller's ``with`` block.
                if not error.retriable:
                    raise
                outage_log.warning(
                    "group %r of %r: could not leave (%s: %s); the server drops the "
                    "member after its session timeout",
                    self.group,
                    self.topic,
                    type(error).__name__,
                    error,
                )

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wait_out(self, error: TidingsError, outage: Outage) -> None:
        """A follower outlives a server restart: on a retriable error it waits (0.1 s,
        doubling to 5 s; logged, see :mod:`tidings.client.outage`) and polls again,
        rejoining if the group forgot it; the server delivers from the committed
        positions. Anything else is raised."""
        if not (self._follow and error.retriable):
            raise error
        # A restarted server delivers again from the committed positions and refuses
        # commits past them, so what was returned but not committed is given up here
        # (it comes again). If the server did not restart, a later commit covers it.
        self._returned.clear()
        self._delivered = None  # ...and comes again, not dropped as delivered
        sleep(outage.failed(error))

    def __iter__(self) -> GroupConsumer:
        return self

    def __next__(self) -> Message:
        message = next(self._rest, None)
        outage: Outage | None = None
        while message is None:
            try:
                count, rest = self._fetch_rows()
            except TidingsError as exc:
                if outage is None:
                    outage = Outage(f"member of group {self.group!r} of topic {self.topic!r}")
                self._wait_out(exc, outage)
                continue
            if outage is not None:
                outage.ended()
                outage = None
            if not count and not self._follow:
                raise StopIteration
            self._rest = rest
            message = next(rest, None)
        assignment = self._assignment
        if assignment is not None:
            # _note_returned of one message, without its list and set of partitions, and
            # partition_of inline (the same rule, key_hash's; two calls less per message).
            key, message_id = message.key, message.id
            hashed = crc32(key if key is not None else message_id.to_bytes())
            self._returned[hashed % assignment.partition_count] = message_id
        return message


class _Settled:
    """The outcome of a poll sent ahead, waited for before it was taken (see
    ``_learn_ahead``), as the call in flight gives it."""

    def __init__(self, answer: GroupPage | None, error: Exception | None) -> None:
        self._answer = answer
        self._error = error

    def result(self) -> GroupPage:
        if self._error is not None:
            raise self._error
        assert self._answer is not None
        return self._answer

    def cancel(self) -> None:
        pass  # answered already


def _id(message: Message) -> MessageId:
    return message.id


def _owned_since(assignment: GroupAssignment) -> dict[int, int]:
    """Since which generation the member holds each partition, where the server says."""
    if len(assignment.owned_since) != len(assignment.partitions):
        return {}
    return dict(zip(assignment.partitions, assignment.owned_since, strict=True))

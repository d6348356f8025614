# Generated from tidings/client/_async/transactions.py by scripts/unasync.py; do not edit.

"""Client transactions: the participant protocol, and the context that runs the messaging
publisher with the caller's own participants in one transaction (as CDAP TMS allows).

:class:`TransactionContext` follows Apache Tephra's ``TransactionContext``:

1. **start**: begin a transaction, then ``start(tx)`` every participant;
2. **finish**: collect every participant's ``changes()``; **persist**: ``commit()``
   each participant in order, the messaging publisher **last** (as CDAP TMS advises: the publish
   that makes entries appear should be the last write, so transactional consumers are
   blocked for the shortest time); then **commit** the transaction with the change
   keys; then ``post_commit()`` each participant.
3. **on failure** at any step before the commit succeeded: ``rollback()`` every
   participant; if all rolled back, **abort** the transaction, else **invalidate** it
   (its writes then stay invisible for good).

Tephra asks the service "can commit?" before persisting; Tidings' commit call checks
for conflicts and commits in one step, so the check comes after persisting. That is
still safe: persisted writes are invisible until the commit, and a conflict rolls them
back. If the commit call's outcome is unknown (no answer, 5xx), the context invalidates
the transaction: the service answers 410 ``TransactionCommitted`` if it did commit, and
otherwise the transaction can never commit, so rolling back is safe.

The messaging publisher is :class:`~tidings.client.txpublisher.TransactionalPublisher`.

**One request** (``defer_begin``, the default): when the messaging publisher is the only
participant, nothing needs the transaction before the commit, so entering the context
sends nothing; the messages are buffered, and the end of the block sends the whole
transaction as one request (``POST /v1/namespaces/{ns}/transactions/publish``: begin,
publish every topic, commit, on the server). It falls back to the steps above when a
publish would pass the payload threshold, when the transaction is asked for before the
commit (``transaction`` in sync code, ``start()`` in async code), when the client's
transactions live on another server, or when the server answers 503 (it
does not run both services) or 413 (body too large). A block that raises sends nothing.

Errors: an exception in the ``with`` block is re-raised after the rollback; an error of
the service (:class:`~tidings.errors.TidingsError`, e.g. ``TransactionConflict``) is
re-raised as itself; any other exception of a participant becomes
:class:`~tidings.errors.TransactionFailure` (its ``__cause__`` is the original). What
went wrong while cleaning up is attached to the exception as notes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from tidings.client._sync.session import Session
from tidings.client._sync.txpublisher import TransactionalPublisher
from tidings.client.base import MessageLike, to_records
from tidings.client.txbuffer import DEFAULT_PAYLOAD_THRESHOLD, ambiguous
from tidings.client.txcontext import ContextState, State, attach, failure_of, name_of
from tidings.codec.admin import TransactionGroupCommit
from tidings.codec.queue_bodies import TransactionAck
from tidings.errors import (
    PayloadTooLarge,
    ProducerFenced,
    RoleUnavailable,
    ServiceUnavailable,
    TidingsError,
    TransactionCommitted,
    TransactionFailure,
    TransactionNotInProgress,
)
from tidings.structs import MessageId, ProducerInfo, Transaction

__all__ = ["GroupMember", "TransactionAware", "TransactionContext"]


@runtime_checkable
class TransactionAware(Protocol):
    """A participant in a client transaction (Tephra's ``TransactionAware``).

    Each method signals failure by raising (or, for ``commit`` and ``rollback``, by
    returning False).
    """

    def start(self, transaction: Transaction) -> None:
        """A transaction began: remember it; writes from now on belong to it."""
        ...

    def changes(self) -> Iterable[bytes]:
        """Change keys written, for conflict detection at commit (may be empty)."""
        ...

    def commit(self) -> bool | None:
        """Persist the writes (still invisible to others until the transaction commits)."""
        ...

    def post_commit(self) -> None:
        """The transaction committed: clean up."""
        ...

    def rollback(self) -> bool | None:
        """Undo what was persisted; failing here makes the context invalidate."""
        ...


class GroupMember(Protocol):
    """A consumer group member whose positions a transaction holds (what
    :meth:`TransactionContext.defer_group_commit` needs of it)."""

    def _participant(
        self, held: TransactionGroupCommit, generations: Mapping[int, int]
    ) -> TransactionAware:
        """The participant that sends ``held`` under the write pointer, should the
        transaction begin after all (its rollback rewinds the member); ``generations``
        as for :meth:`_check_held`."""
        ...

    def _check_held(self, held: TransactionGroupCommit, generations: Mapping[int, int]) -> None:
        """Just before ``held`` is sent: PartitionFenced if the member has learned since
        it handed them over that a partition of these positions moved (away, or away
        and back: held since a newer generation than ``generations`` names for it, the
        one its position is of)."""
        ...

    def _rolled_back(self, write_pointer: int | None) -> None:
        """The transaction holding its positions aborted (``write_pointer``: the one
        they were written under; None: they were never sent): drop what it holds and
        have the server deliver again from the committed positions."""
        ...


class _QueueAcks:
    """Queue acks sent under the write pointer (a transaction that did not go in one
    request): a rollback gives them back to their queues before the abort."""

    name = "queue acks"

    def __init__(
        self, client: Session, acks: list[TransactionAck], context: TransactionContext
    ) -> None:
        self._client = client
        self._acks = acks
        self._context = context
        self._write_pointer: int | None = None

    def start(self, transaction: Transaction) -> None:
        self._write_pointer = transaction.write_pointer
        for a in self._acks:
            self._client._send(
                self._client._api.queue_ack(
                    a.topic, a.queue, a.consumer, a.ids, transaction.write_pointer
                )
            )

    def changes(self) -> Iterable[bytes]:
        return ()

    def commit(self) -> None:
        pass

    def post_commit(self) -> None:
        pass

    def rollback(self) -> None:
        if self._write_pointer is None:
            return
        keep = self._context.keeps_leases
        for topic, queue in dict.fromkeys((a.topic, a.queue) for a in self._acks):
            self._client._send(
                self._client._api.queue_rollback(topic, queue, self._write_pointer, keep)
            )


class TransactionContext(ContextState):
    """Runs the messaging publisher and the given participants in one transaction.

    ::

        with client.transaction(my_table) as tx:
            my_table.put(b"k", b"v")       # a TransactionAware of yours
            tx.publish("events", b"k changed")
    """

    publisher: TransactionalPublisher

    def __init__(
        self,
        client: Session,
        *participants: TransactionAware,
        timeout: float | None = None,
        producer: ProducerInfo | None = None,
        payload_threshold: int = DEFAULT_PAYLOAD_THRESHOLD,
        publisher: TransactionalPublisher | None = None,
        defer_begin: bool = True,
    ) -> None:
        self.publisher = publisher or TransactionalPublisher(
            client, payload_threshold=payload_threshold
        )
        # The messaging publisher persists last: consumers wait behind it the least time.
        super().__init__((*participants, self.publisher), timeout, producer, defer_begin)
        self._all: tuple[TransactionAware, ...] = (*participants, self.publisher)
        self._client = client
        #: Queue acks of a deferred transaction, sent with its one request.
        self._acks: list[TransactionAck] = []
        #: The rollback under way follows a refusal by the server (a TidingsError),
        #: not the application's own failure: acked messages go back to the leases of
        #: their workers, as where the server refuses a transaction in one request,
        #: rather than to their queues.
        self.keeps_leases = False
        #: Group positions of a deferred transaction, likewise, with their members and,
        #: per partition, the generation each position is of.
        self._group_commits: list[tuple[TransactionGroupCommit, GroupMember, dict[int, int]]] = []
        #: What the abort answered where a newer epoch of the producer had fenced it.
        self._fenced: ProducerFenced | None = None
        #: Held while the transaction begins: publishes that run concurrently and find
        #: a deferred transaction that must begin wait for the one begin.
        self._begin_lock = threading.Lock()

    @property
    def transaction(self) -> Transaction:
        """The transaction's snapshot; a deferred transaction begins now."""
        if self._state is State.PENDING:
            self._begin_deferred()
        return self._snapshot()

    def enlist(self, participant: TransactionAware) -> Transaction:
        """Add ``participant`` to the transaction under way (a consumer group's commit
        joins this way): a deferred transaction begins now, the participant is started
        with it and persists before the messaging publisher. Returns the transaction."""
        self._require_open()
        if self._state is State.PENDING or self._begin_lock.locked():
            self._begin_deferred()
        tx = self._require(State.ACTIVE)
        participant.start(tx)
        self._all = (*self._all[:-1], participant, self._all[-1])
        return tx

    def defer_acks(self, topic: str, queue: str, consumer: str, ids: list[MessageId]) -> bool:
        """Hold a queue's acks for the one request of a deferred transaction (they go
        in it with the publishes: pop, then one request that publishes, acks and
        commits). False if the transaction has begun: ack under its write pointer."""
        self._require_open()
        if self._state is not State.PENDING:
            return False
        self._acks.append(TransactionAck(topic, queue, consumer, list(ids)))
        return True

    def defer_group_commit(
        self,
        commit: TransactionGroupCommit,
        member: GroupMember,
        generation: int | None = None,
    ) -> bool:
        """Hold a group member's positions for the one request of a deferred transaction
        (they go in it with the publishes: poll, then one request that commits the
        positions and publishes). False if the transaction has begun: commit them
        under its write pointer. ``member`` is told if the transaction aborts, and
        asked just before they are sent whether they still hold (``generation``: the
        one they are of)."""
        self._require_open()
        if self._state is not State.PENDING:
            return False
        generations = {} if generation is None else dict.fromkeys(commit.positions, generation)
        for i, (held, owner, known) in enumerate(self._group_commits):
            if held[:3] == commit[:3]:
                # The same member again: its later positions replace the earlier ones.
                # A rebalance may have come between the two: each position keeps the
                # generation it is of, and the server fences each by its own (taking
                # the newest for all would let the older positions of a partition that
                # moved away and back since pass).
                positions = {**held.positions, **commit.positions}
                known = dict(known)
                for p, g in generations.items():
                    # A partition handed over again keeps the older generation: the
                    # transaction's output holds what came of its earlier positions
                    # too, a zombie's if it moved away and back in between (as a
                    # transaction already begun holding them is invalidated by the move).
                    known[p] = min(g, known.get(p, g))
                merged = held._replace(
                    positions=positions,
                    # For a server that reads only this: the oldest fences them all.
                    generation=min(known.values(), default=None),
                    generations=dict(known) if len(set(known.values())) > 1 else None,
                )
                self._group_commits[i] = (merged, owner, known)
                return True
        self._group_commits.append((commit, member, generations))
        return True

    def publish(self, topic: str, messages: MessageLike | Iterable[MessageLike]) -> None:
        """Publish in this transaction: visible to read-committed consumers on commit."""
        self._require_open()
        records = to_records(messages)
        if self._state is State.PENDING and self.publisher.buffer(topic, records):
            return
        if self._state is State.PENDING or self._begin_lock.locked():
            # Past the payload threshold: stream, under the write pointer, once the
            # transaction began (and its participants started, if another call is
            # beginning it right now).
            self._begin_deferred()
        self.publisher.publish(topic, records)

    def start(self) -> Transaction:
        """Begin the transaction and start every participant (also: begin a deferred
        transaction now)."""
        with self._begin_lock:
            return self._start()

    def _begin_deferred(self) -> None:
        """Begin a deferred transaction now, once: callers that come while it begins
        wait for that begin rather than begin another transaction (whose messages the
        commit would leave out). RuntimeError if it did not become active."""
        with self._begin_lock:
            if self._state is State.PENDING:
                self._start()
        self._require(State.ACTIVE)

    def _start(self) -> Transaction:
        if self._state is not State.NEW and self._state is not State.PENDING:
            raise RuntimeError(f"the transaction is {self.state}; use a new context")
        self._tx = self._client.begin(
            self._timeout, transactional_id=self._producer_id, epoch=self._epoch
        )
        self._state = State.ACTIVE
        if self._acks:
            # Held for a one request that is not coming: sent now, under the pointer.
            acks, self._acks = self._acks, []
            self._all = (*self._all[:-1], _QueueAcks(self._client, acks, self), self._all[-1])
        if self._group_commits:
            commits, self._group_commits = self._group_commits, []
            held = tuple(member._participant(commit, gens) for commit, member, gens in commits)
            self._all = (*self._all[:-1], *held, self._all[-1])
        for participant in self._all:
            try:
                participant.start(self._tx)
            except BaseException as exc:
                failure = failure_of(participant, "start", exc)
                self._abort_after(failure)
                if failure is exc:
                    raise
                raise failure from exc
        return self._tx

    def finish(self) -> None:
        """Check, persist, commit, post-commit; on failure roll back and abort."""
        if self._state is State.PENDING:
            if self._commit_in_one_request():
                return
            try:
                self.start()  # this server cannot: the steps one by one
            except BaseException:
                if self._state is State.PENDING:
                    self._drop()  # not even begun
                raise
        tx = self._require(State.ACTIVE)
        changes: list[bytes] = []
        for step in ("changes", "commit"):
            for participant in self._all:
                try:
                    if step == "changes":
                        changes.extend(bytes(c) for c in participant.changes())
                    elif participant.commit() is False:
                        raise TransactionFailure(f"{name_of(participant)} refused to commit")
                except BaseException as exc:
                    failure = failure_of(participant, step, exc)
                    self._abort_after(failure)
                    self._raise_if_fenced(failure)
                    if failure is exc:
                        raise
                    raise failure from exc
        try:
            try:
                self._client.commit(
                    tx, changes, transactional_id=self._producer_id, epoch=self._epoch
                )
            except TransactionCommitted:
                pass  # an earlier attempt got through
            except TidingsError as exc:
                if not ambiguous(exc):
                    self._abort_after(exc)
                    raise
                if not self._committed_after_all(exc):
                    raise
        except BaseException as exc:
            if self._state is State.ACTIVE and not isinstance(exc, Exception):
                # Cancelled (or interrupted) once the commit was sent: it may have
                # committed, so nothing may roll it back now (abort() does nothing);
                # if it did not, it becomes invalid when it times out.
                self._state = State.UNKNOWN
            raise
        self._state = State.COMMITTED
        self._post_commit()

    def abort(self) -> None:
        """Roll every participant back and abort (invalidate if a rollback failed)."""
        if self._state is State.PENDING:
            self._drop()
            self._give_back_acks()
            self._rewind_members()
        elif self._state is State.ACTIVE:
            self._rollback_and_end(None)

    def __enter__(self) -> TransactionContext:
        # One context, one transaction: entering it again (nested, or after it ended)
        # would start over, dropping what it holds or beginning a second transaction.
        self._require_new()
        if self._defer and self._client._one_request_transactions():
            self._state = State.PENDING
            self.publisher.defer()
        else:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if self._state is not State.ACTIVE and self._state is not State.PENDING:
            return
        if exc is not None:
            self._abort_after(exc)
            self._raise_if_fenced(exc)
        else:
            self.finish()

    # --- failure handling ---

    def _raise_if_fenced(self, failure: BaseException) -> None:
        """A zombie learns it is one: the transaction was refused for having ended,
        and its abort for a newer epoch of the producer, whose registration invalidated
        it. ProducerFenced, as its commit and abort get, rather than the refusal."""
        if self._fenced is not None and isinstance(failure, TransactionNotInProgress):
            raise self._fenced from failure

    def _abort_after(self, cause: BaseException) -> None:
        if self._state is State.PENDING:
            self._drop()  # nothing was sent
            try:
                self._give_back_acks()
            except BaseException as exc:
                attach(cause, [f"could not give back the messages it acked: {exc}"])
            try:
                self._rewind_members()
            except BaseException as exc:
                attach(cause, [f"could not rewind the group members it committed: {exc}"])
        elif self._state is State.ACTIVE:
            self._rollback_and_end(cause)

    def _give_back_acks(self) -> None:
        """An aborted deferred transaction never sent its acks: the messages go back
        to their queues at once (a nack), as an abort gives them back (a worker that
        wants to keep them acks in a new transaction)."""
        acks, self._acks = self._acks, []
        api = self._client._api
        for a in acks:
            self._client._send(api.queue_nack(a.topic, a.queue, a.consumer, a.ids))

    def _rewind_members(self) -> None:
        """A deferred transaction that aborted (or was never sent) held group
        positions: each member gets its batch again from its committed positions, as
        after the rollback of a transaction under way."""
        commits, self._group_commits = self._group_commits, []
        for _, member, _ in commits:
            member._rolled_back(None)

    def _commit_in_one_request(self) -> bool:
        """Begin, publish and commit as one request; False if the server cannot (503,
        or 413: nothing done)."""
        try:
            # A member may have heard since it handed its positions over that a
            # partition of them moved away and back: those positions are of its earlier
            # ownership, and their output would repeat what the owner in between
            # produced. Refused before the request (a server from before positions named
            # their generation would go by the newest it told the member).
            for commit, member, generations in self._group_commits:
                member._check_held(commit, generations)
        except BaseException as exc:
            self._abort_after(exc)
            raise
        try:
            self._tx = self._client.publish_transaction(
                dict(self.publisher.batches()),
                timeout=self._timeout,
                transactional_id=self._producer_id,
                epoch=self._epoch,
                acks=self._acks,
                group_commits=[c for c, _, _ in self._group_commits],
            )
        except ServiceUnavailable as exc:
            # This one goes the step-by-step way. Only a process without the service
            # (RoleUnavailable) will say the same for a while; after any other 503 (a
            # full server, a store out of reach, no leader yet) the next ones ask again.
            if isinstance(exc, RoleUnavailable):
                self._client._no_one_request_transactions()
            return False
        except PayloadTooLarge:
            return False  # refused unread (its JSON is bigger than the Avro publishes)
        except TidingsError as exc:
            self._one_request_failed(exc)
            self.publisher.end_deferred()
            if self._state is State.ABORTED:
                # The server rolled back; the members learn of it here. (Unknown: it
                # may have committed, so nothing is rewound.)
                try:
                    self._rewind_members()
                except BaseException as other:
                    attach(exc, [f"could not rewind the group members it committed: {other}"])
            self._group_commits = []
            raise
        except BaseException:
            self._state = State.UNKNOWN
            self.publisher.end_deferred()
            raise
        self._state = State.COMMITTED
        self._post_commit()
        return True

    def _rollback_and_end(self, cause: BaseException | None) -> None:
        tx = self._snapshot()
        self.keeps_leases = isinstance(cause, TidingsError)
        failed = []
        for participant in self._all:
            try:
                if participant.rollback() is False:
                    raise TransactionFailure("rollback() returned False")
            except Exception as exc:
                failed.append(f"rollback of {name_of(participant)} failed: {exc!r}")
        self._state = State.ABORTED
        try:
            if failed:
                failed.append(f"transaction {tx.write_pointer} invalidated")
                self._client.invalidate(tx)
            else:
                self._client.abort(tx, transactional_id=self._producer_id, epoch=self._epoch)
        except TransactionNotInProgress:
            pass  # it timed out or was invalidated meanwhile: its writes stay invisible
        except ProducerFenced as exc:
            # A newer epoch registered the id, which invalidated the transaction.
            self._fenced = exc
            failed.append(
                f"transaction {tx.write_pointer} was invalidated when its transactional "
                f"id was registered again ({exc}); its writes never show"
            )
        except TidingsError as exc:
            failed.append(
                f"could not end transaction {tx.write_pointer} ({exc!r}); "
                "it becomes invalid when it times out"
            )
        attach(cause, failed)

    def _committed_after_all(self, error: TidingsError) -> bool:
        """After a commit without an answer: True if it committed; else roll back."""
        tx = self._snapshot()
        try:
            self._client.invalidate(tx)
        except TransactionCommitted:
            return True
        except TransactionNotInProgress:
            pass
        except TidingsError as exc:
            self._state = State.UNKNOWN
            error.add_note(
                f"the outcome of committing transaction {tx.write_pointer} is unknown "
                f"({exc!r}); if it did not commit, it becomes invalid when it times out"
            )
            return False
        self._rollback_and_end(error)
        return False

    def _post_commit(self) -> None:
        errors = []
        for participant in self._all:
            try:
                participant.post_commit()
            except Exception as exc:
                failure = failure_of(participant, "post_commit", exc)
                if failure is not exc:
                    failure.__cause__ = exc
                errors.append(failure)
        if errors:
            errors[0].add_note(f"transaction {self.write_pointer} did commit")
            raise errors[0]

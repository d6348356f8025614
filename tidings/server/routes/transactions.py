"""The transaction service's API under ``/v1/transactions`` (docs/api.md), JSON only
(but for the one-request transaction, which also takes an Avro body).

Begin, commit, abort and invalidate await the manager's ``*_future`` calls on the event
loop (through the server's :class:`~tidings.server.inbox.LoopInbox`): they decide at
once (under the manager's lock, which is held only for in-memory work) and resolve once
the transaction log is durable, so no thread is held per request and many concurrent
requests share one fsync. The rarer calls (state, producers, prune) still run on the
worker threads.

``POST /v1/namespaces/{ns}/transactions/publish`` (where one process runs both
services) is a whole transaction of the direct path in one request: begin, publish
every topic's messages with the write pointer in one store write (all of them or
none), commit. If the publish fails, nothing was written and the transaction is
aborted (invalidated if that fails); so it commits all of its messages or none. Its
Avro body (``avro/binary; schema=tidings``) carries each topic's messages as a publish
body, read straight into stored values as a publish's are; the write pointer goes into
them once the transaction began.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidings.codec import admin, json_bodies, payload_frames, queue_bodies, tx_publish, wire
from tidings.codec.media import AVRO_EXT, JSON
from tidings.codec.payload_frames import PayloadFrames, names_frames
from tidings.codec.stored_publish import StoredBatch
from tidings.codec.transaction import encode_transaction
from tidings.consumers.groups import PositionsWrite
from tidings.errors import (
    BadRequest,
    EmptyPublish,
    Forbidden,
    TidingsError,
    TooManyTransactions,
    TransactionConflict,
    UnsupportedMediaType,
)
from tidings.messaging import MessagingService
from tidings.names import INT64_MAX, check_name
from tidings.server.bodies import json_object, read_body, request_media, require_json
from tidings.server.handlers import Api, json_response, principal_of
from tidings.server.inbox import LoopInbox
from tidings.server.routes.consumers import read_snapshot
from tidings.server.routes.messaging import PRODUCER_HEADER, SEQUENCE_HEADER
from tidings.store.backend import WriteView
from tidings.structs import Record, Transaction, TransactionEnd
from tidings.tx import TransactionManager
from tidings.tx.manager import Ending, OneWriteCommit
from tidings.tx.records import Outcome

__all__ = ["PREFIX", "PUBLISH", "routes"]

PREFIX = "/v1/transactions"
PUBLISH = "/v1/namespaces/{ns}/transactions/publish"

_T = TypeVar("_T")
_Batch = tuple[str, list[Record | bytes] | StoredBatch | PayloadFrames]


def _may_use(request: Request, transactional_id: str | None) -> None:
    """Forbidden unless the request's principal may use ``transactional_id``."""
    principal = principal_of(request)
    if principal is not None:
        principal.require_transactional_id(transactional_id)


def _may_end(
    request: Request, tx: TransactionManager, write_pointer: int, transactional_id: str | None
) -> None:
    """Forbidden unless the request's principal may end (commit, abort or invalidate) transaction
    ``write_pointer``: with the transactional id it names, if any; without one (the
    anonymous path), a transaction begun under a transactional id takes that id too, or
    admin. Else leaving out the id would let anyone end a producer's transactions, which
    is more than the fencing that registering its id takes (docs/security.md)."""
    principal = principal_of(request)
    if principal is None:
        return
    if transactional_id is not None:
        principal.require_transactional_id(transactional_id)
        return
    if principal.admin:
        return
    owner = tx.began_under(write_pointer)
    if owner is not None and not principal.may_use(owner):
        # The id is not named: a principal that may not use it need not learn it.
        raise Forbidden(
            f"principal {principal.name} may not end transaction {write_pointer}: it was "
            "begun under a transactional id the principal may not use"
        )


#: How an ended transaction's outcome is named in the answers (docs/api.md).
_OUTCOME_NAMES = {
    Outcome.ABORTED: "aborted",
    Outcome.INVALIDATED: "invalidated",
    Outcome.TIMED_OUT: "timedOut",
    Outcome.FENCED: "fenced",
    Outcome.UNLOGGED: "unlogged",
}


def _ended(ending: Ending) -> dict[str, object]:
    """The answer of an abort or invalidate."""
    return admin.ended_json(TransactionEnd(_OUTCOME_NAMES[ending.outcome], ending.already))


def _write_pointer(request: Request) -> int:
    raw = request.path_params["wp"]
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= INT64_MAX:
        raise BadRequest(f"a write pointer is a positive 64-bit integer, got {raw!r}")
    return int(raw)


#: An item of a one-request transaction's JSON ``topics``: a PublishRequest and its topic.
_TOPIC_FIELDS = json_bodies.PUBLISH_FIELDS | {"topic"}


def _batches(
    obj: dict[str, Any], *, empty_ok: bool = False, binary: bool = False, frames: bool = False
) -> list[_Batch]:
    """The ``topics`` of a transactional publish: names checked, messages decoded
    (``empty_ok``: the field may be left out, as in a transaction that only acks; an
    empty list is a transaction that publishes nothing; ``binary``: of the Avro body,
    each topic's messages a publish body of their own, in the payloads medium with
    ``frames``)."""
    items = obj.get("topics", [] if empty_ok else None)
    if not isinstance(items, list):
        raise BadRequest("topics must be a list of {topic, messages[, extras]} objects")
    batches: list[_Batch] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"topics[{i}] must be an object")
        topic = item.get("topic")
        if not isinstance(topic, str):
            raise BadRequest(f"topics[{i}].topic must be a topic name")
        check_name(topic, "topic")
        if topic in seen:
            raise BadRequest(f"topic {topic!r} appears more than once")
        seen.add(topic)
        if frames:
            request = wire.decode_payloads_request(item["body"])
        elif binary:
            request = wire.decode_publish_request(item["body"], AVRO_EXT, stored_for="publish")
        else:
            if "transactionWritePointer" in item:
                raise BadRequest("the server assigns the write pointer; do not send one")
            # Each item is a JSON PublishRequest plus its topic: decode it as one.
            request = wire.publish_request_from_json(item, _TOPIC_FIELDS, f"topics[{i}]")
        if request.write_pointer is not None:
            raise BadRequest("the server assigns the write pointer; do not send one")
        records = request.records
        if not len(records):
            raise EmptyPublish(f"topics[{i}] ({topic}) has no messages")
        if isinstance(records, StoredBatch | PayloadFrames):
            batches.append((topic, records))
        else:
            batches.append((topic, list(records)))
    return batches


def _under(batches: list[_Batch], write_pointer: int) -> list[_Batch]:
    """The batches with ``write_pointer`` in the values read straight from the body."""
    return [
        (topic, messages.under(write_pointer) if isinstance(messages, StoredBatch) else messages)
        for topic, messages in batches
    ]


def routes(api: Api) -> list[Route]:
    """Every transaction route."""
    # Transaction bodies are a few hundred bytes; a change set may be large, but not
    # larger than what the messaging side accepts.
    max_body = api.config.max_body_bytes
    counts = api.metrics.tx
    # The acks' and positions' checks and the topics' lookups read the store: on the
    # loop over LMDB, on a worker thread where reads wait on the network.
    reads_block = api.reads_block

    async def body(request: Request, what: str) -> dict[str, object]:
        require_json(request)
        return json_object(await read_body(request, max_body), what)

    @api.endpoint(PREFIX)
    async def transactions(request: Request) -> Response:
        tx = api.tx
        if request.method in ("GET", "HEAD"):
            return json_response(admin.state_json(await api.blocking(tx.state)))
        obj = await body(request, "begin request")
        json_bodies.only(obj, admin.BEGIN_FIELDS, "begin request")
        timeout, (transactional_id, epoch) = admin.read_begin_request(obj)
        begin_id = admin.read_begin_id(obj)
        _may_use(request, transactional_id)
        try:
            begun = await _result(
                api.inbox,
                tx.begin_once_future(
                    timeout, transactional_id=transactional_id, epoch=epoch, begin_id=begin_id
                ),
            )
        except TooManyTransactions:
            counts.refused += 1
            raise
        snapshot = begun.transaction
        if not begun.again:  # a resent begin id began nothing
            counts.begun += 1
        return json_response(admin.snapshot_json(snapshot, encode_transaction(snapshot)))

    @api.endpoint(PREFIX + "/{wp}/commit")
    async def commit(request: Request) -> Response:
        tx = api.tx
        wp = _write_pointer(request)
        changes, (transactional_id, epoch) = admin.read_commit_request(
            await body(request, "commit request")
        )
        _may_end(request, tx, wp, transactional_id)
        try:
            await api.inbox.wait(
                tx.commit_future(wp, changes, transactional_id=transactional_id, epoch=epoch)
            )
        except TransactionConflict:
            counts.conflicts += 1
            raise
        counts.committed += 1
        return json_response({})

    @api.endpoint(PREFIX + "/{wp}/abort")
    async def abort(request: Request) -> Response:
        tx = api.tx
        wp = _write_pointer(request)
        transactional_id, epoch = admin.read_abort_request(await body(request, "abort request"))
        _may_end(request, tx, wp, transactional_id)
        # A repeated abort succeeds again, but counts only once; the answer says
        # whether this call aborted it, and how one that had ended already ended (an
        # abort of a timed-out transaction succeeds, but it is invalid, not aborted).
        ending = await api.inbox.wait(
            tx.abort_ending_future(wp, transactional_id=transactional_id, epoch=epoch)
        )
        if not ending.already:
            counts.aborted += 1
        return json_response(_ended(ending))

    @api.endpoint(PREFIX + "/{wp}/invalidate")
    async def invalidate(request: Request) -> Response:
        tx = api.tx
        wp = _write_pointer(request)
        # Whoever may end the transaction may invalidate it: a client invalidates its
        # own transaction where a rollback failed or a commit's answer was lost, and
        # keeping its entries invisible for good takes no more than aborting it.
        _may_end(request, tx, wp, None)
        ending = await api.inbox.wait(tx.invalidate_ending_future(wp))
        if not ending.already:
            counts.invalidated += 1
        return json_response(_ended(ending))

    @api.endpoint(PUBLISH)
    async def publish(request: Request) -> Response:
        messaging, tx = api.messaging, api.tx  # 503 unless this process runs both
        ns = check_name(request.path_params["ns"], "namespace")
        if PRODUCER_HEADER in request.headers or SEQUENCE_HEADER in request.headers:
            # Not deduplicated by producer sequence (sent twice, it commits twice): the
            # headers would promise what the server does not do, as on a store.
            raise BadRequest(
                f"{PRODUCER_HEADER} and {SEQUENCE_HEADER} belong to a non-transactional "
                "publish, not to a transaction in one request"
            )
        # The payloads medium: the Avro body with each topic's messages in that medium.
        frames = names_frames(request.headers.get("content-type"))
        media = AVRO_EXT if frames else request_media(request)
        if media is JSON:
            obj = json_object(await read_body(request, max_body), "transactional publish")
            json_bodies.only(obj, admin.TRANSACTION_PUBLISH_FIELDS, "transactional publish")
        elif media is AVRO_EXT:
            obj = tx_publish.read_transaction_publish(await read_body(request, max_body))
        else:
            raise UnsupportedMediaType(
                "a transaction in one request is application/json, avro/binary; "
                f"schema=tidings or {payload_frames.CONTENT_TYPE}"
            )
        binary = media is AVRO_EXT
        acks = queue_bodies.read_transaction_acks(obj, binary=binary)
        group_commits = admin.read_transaction_group_commits(obj, binary=binary)
        batches = _batches(obj, empty_ok=bool(acks or group_commits), binary=binary, frames=frames)
        timeout, (transactional_id, epoch) = admin.read_begin_request(obj)
        principal = principal_of(request)
        if principal is not None:
            principal.require_transactional_id(transactional_id)
            for topic, _ in batches:
                principal.require_publish(topic)
            for a in acks:
                principal.require_queue(a.topic, a.queue)
            for g in group_commits:
                principal.require_group(g.topic, g.group)
        queues = api.queues if acks else None  # 503 where queues do not run
        groups = api.groups if group_commits else None  # likewise groups

        async def settle(wp: int) -> tuple[list[PositionsWrite], list[Future[None]]]:
            # The acks and the positions' checks first: a conflict or a fenced member
            # then costs no publish, and the transaction fails before anything of it is
            # written to a topic. The positions are written under the write pointer, so
            # they count if and only if the transaction commits; where the commit rides
            # in the publish's store write, they ride there too (one fsync for all).
            # The acks' store writes are queued, not awaited: the store applies writes
            # in order, so they land before the commit that follows them (usually in
            # the same group commit).
            queued: list[Future[None]] = []
            if acks:
                assert queues is not None
                snapshot = await read_snapshot(api)
                for a in acks:
                    if reads_block:
                        done = await api.blocking(
                            queues.ack_nowait, ns, a.topic, a.queue, a.consumer, a.ids,
                            snapshot=snapshot, write_pointer=wp,
                        )  # fmt: skip
                    else:
                        done = queues.ack_nowait(
                            ns, a.topic, a.queue, a.consumer, a.ids, snapshot=snapshot,
                            write_pointer=wp,
                        )  # fmt: skip
                    if done is None:  # the queue is not in memory: load it on a worker
                        await api.blocking(
                            queues.ack, ns, a.topic, a.queue, a.consumer, a.ids,
                            write_pointer=wp,
                        )  # fmt: skip
                    else:
                        queued.append(done)
            carried: list[PositionsWrite] = []
            if group_commits:
                assert groups is not None
                for g in group_commits:
                    # Without change keys at the commit: the write fails the transaction
                    # if another open transaction holds one of the partitions. On the
                    # loop unless that would wait for a worker thread's lock or a
                    # rebalance's store write.
                    prepared = None
                    if not reads_block:
                        prepared = groups.prepare_commit_nowait(
                            ns, g.topic, g.group, g.member_id, g.positions, wp,
                            generation=g.generation, generations=g.generations,
                        )  # fmt: skip
                    if prepared is None:
                        prepared = await api.blocking(
                            groups.prepare_commit,
                            ns,
                            g.topic,
                            g.group,
                            g.member_id,
                            g.positions,
                            wp,
                            generation=g.generation,
                            generations=g.generations,
                        )
                    carried.append(prepared)
            return carried, queued

        async def unsettle(wp: int, refused: bool = False) -> bool:
            # True if every ack went back and every position was removed. Else the
            # transaction must be invalidated, not aborted: an aborted transaction's
            # acks and positions that are still there count as committed (Tephra: an
            # abort says the writes were undone). The acks go back to the workers'
            # leases, not to the queues: the request was refused, and a worker that
            # sends its acks again must find its messages still its own (rather than
            # handed to another worker meanwhile). ``refused``: the transaction was
            # refused its commit (it is made invalid next, or was already), so only the
            # acks are given back: left to the invalidation, they would go back to the
            # queues at once. A commit that got through after all leaves them acked.
            undone = True
            for a in acks:
                assert queues is not None
                try:
                    await api.blocking(queues.rollback, ns, a.topic, a.queue, wp, keep_leases=True)
                except TidingsError:
                    undone = False
            if refused:
                return undone
            for g in group_commits:
                assert groups is not None
                # The positions only: a refused request changes nothing of the member.
                # Rewinding it (to get the batch again) is its own call, as the client
                # makes it when it learns of the failure (group rollback, memberId).
                try:
                    await api.blocking(groups.rollback, ns, g.topic, g.group, wp)
                except TidingsError:
                    undone = False
            return undone

        async def run() -> Transaction:
            ended: list[str] = []
            try:
                return await _transact(
                    api.inbox,
                    messaging,
                    tx,
                    ns,
                    batches,
                    timeout,
                    transactional_id,
                    epoch,
                    ended,
                    (settle, unsettle) if acks or group_commits else None,
                    api.known_topics if reads_block else None,
                )
            finally:
                for outcome in ended:
                    setattr(counts, outcome, getattr(counts, outcome) + 1)

        # Shielded: a request cancelled midway still ends its transaction (as a worker
        # thread running it to the end did), instead of leaving it to time out.
        snapshot = await asyncio.shield(run())
        return json_response(admin.snapshot_json(snapshot))

    @api.endpoint(PREFIX + "/producers")
    async def producers(request: Request) -> Response:
        tx = api.tx
        transactional_id = admin.read_producer_request(await body(request, "producer registration"))
        # Registering bumps the epoch, which fences the holder: only its holders may.
        _may_use(request, transactional_id)
        info = await api.blocking(tx.register_producer, transactional_id)
        return json_response(admin.producer_json(info))

    @api.endpoint(PREFIX + "/prune")
    async def prune(request: Request) -> Response:
        tx = api.tx
        below, ids = admin.read_prune_request(await body(request, "prune request"))
        pruned = await api.blocking(tx.prune, below=below, ids=ids)
        return json_response(admin.pruned_json(pruned))

    return [
        Route(PREFIX, transactions, methods=["GET", "POST"]),
        Route(PREFIX + "/{wp}/commit", commit, methods=["POST"]),
        Route(PREFIX + "/{wp}/abort", abort, methods=["POST"]),
        Route(PREFIX + "/{wp}/invalidate", invalidate, methods=["POST"]),
        Route(PREFIX + "/producers", producers, methods=["POST"]),
        Route(PUBLISH, publish, methods=["POST"]),
        Route(PREFIX + "/prune", prune, methods=["POST"]),
    ]


async def _transact(
    inbox: LoopInbox,
    messaging: MessagingService,
    tx: TransactionManager,
    ns: str,
    batches: list[_Batch],
    timeout: float | None,
    transactional_id: str | None,
    epoch: int | None,
    ended: list[str],
    consumed: tuple[
        Callable[[int], Awaitable[tuple[list[PositionsWrite], list[Future[None]]]]],
        _Unsettle,
    ]
    | None = None,
    known_topics: Callable[[str, Iterable[str]], Awaitable[None]] | None = None,
) -> Transaction:
    """Begin, (ack), publish every batch, commit; on the event loop, awaiting each
    step's group commit through a future (no worker thread is held).

    With ``consumed`` (``(settle, unsettle)``), ``settle(wp)`` acks queue messages under the
    write pointer first and answers the group positions to write under it and the
    futures of the acks' store writes (queued before the publish, awaited after it), and
    ``unsettle(wp)`` gives the acks back and removes the positions if anything
    after fails (False if it could not: the transaction is then invalidated, not
    aborted); ``unsettle(wp, True)`` gives the acks back where the commit was refused
    (before the transaction is invalidated). ``known_topics`` (where the store's
    reads block: :meth:`Api.known_topics`) looks up, before the publish, the topics that
    the publish would otherwise look up in the store on the event loop.
    The positions ride in the publish's store write where the commit does, else they
    are a write of their own before it.
    The batches are published in one store write: all of them, or none. Where the
    manager can (``commit_in_write``), the commit is decided last in that same write and
    made durable by it (one fsync instead of two); otherwise it follows the publish. If
    the publish fails, nothing of the transaction was written to a topic, so it is
    aborted (invalidated if the abort fails) and the error raised; if the commit fails
    (refused in the write, or after it), the transaction is invalidated. ``ended``
    collects the counters to bump.
    """
    try:
        snapshot = await _result(
            inbox, tx.begin_future(timeout, transactional_id=transactional_id, epoch=epoch)
        )
    except TooManyTransactions:
        ended.append("refused")
        raise
    ended.append("begun")
    wp = snapshot.write_pointer
    # The commit in the publish's own store write where the manager can: one fsync.
    step = None
    try:
        batches = _under(batches, wp)
        carried: list[PositionsWrite] = []
        queued: list[Future[None]] = []
        if consumed is not None:
            carried, queued = await consumed[0](wp)
        if known_topics is not None:
            await known_topics(ns, [topic for topic, _ in batches])
        if batches:
            step = tx.commit_in_write(wp, transactional_id=transactional_id, epoch=epoch)
            # Bad input is refused here, at once, before anything is written.
            if step is not None:
                try:
                    await inbox.wait(
                        step.watch(
                            messaging.publish_all_future(
                                ns, batches, wp, then=_carrying(carried, step)
                            )
                        )
                    )
                except Exception:
                    if not step.deferred:
                        raise
                    step = None  # the log was rotating; nothing was written
        # Landed before the publish (the store's order): done by now where it rode
        # with the commit; before the commit below otherwise.
        for done in queued:
            await _result(inbox, done)
        if step is None:
            for write in carried:
                await inbox.wait(write.submit())
            if batches:
                await inbox.wait(messaging.publish_all_future(ns, batches, wp))
    except Exception as exc:
        if step is not None and (step.refused or step.decided):
            # The commit failed, not the publish: as a failed commit below.
            if consumed is not None:
                await consumed[1](wp, True)
            await _invalidate(inbox, tx, wp, exc, ended)
            raise
        if consumed is not None and not await consumed[1](wp):
            await _invalidate(inbox, tx, wp, exc, ended)
            raise
        await _end_failed(inbox, tx, wp, exc, transactional_id, epoch, ended)
        raise
    if step is None:
        try:
            await inbox.wait(
                tx.commit_future(wp, (), transactional_id=transactional_id, epoch=epoch)
            )
        except TidingsError as exc:
            # Timed out or fenced: already invalid. Anything else: make sure it never
            # commits (its writes then never show). Its acks go back to their workers
            # first: once it is invalid, the queue's next call would give them back to
            # the queue, for any worker to take.
            if consumed is not None:
                await consumed[1](wp, True)
            await _invalidate(inbox, tx, wp, exc, ended)
            raise
    ended.append("committed")
    return snapshot


class _Unsettle(Protocol):
    """Gives a failed transaction's queue acks back (and, unless ``refused``, removes
    its group positions); False if it could not."""

    def __call__(self, wp: int, refused: bool = False) -> Awaitable[bool]: ...


def _carrying(carried: list[PositionsWrite], step: OneWriteCommit) -> Callable[[WriteView], None]:
    """The end of a one-write commit's store write: the positions, then the commit."""
    if not carried:
        return step

    def then(view: WriteView) -> None:
        for write in carried:
            write.carry(view)
        step(view)

    return then


async def _result(inbox: LoopInbox, future: Future[_T]) -> _T:
    # A begin is usually answered at once (from the pointer reservation): take its
    # result without the hand-over to the event loop.
    if future.done():
        return future.result()
    return await inbox.wait(future)


async def _end_failed(
    inbox: LoopInbox,
    tx: TransactionManager,
    wp: int,
    error: Exception,
    transactional_id: str | None,
    epoch: int | None,
    ended: list[str],
) -> None:
    # The publish wrote nothing (one store write, not committed), so the transaction
    # left no entry behind and may simply abort.
    try:
        aborted = await inbox.wait(
            tx.abort_future(wp, transactional_id=transactional_id, epoch=epoch)
        )
    except TidingsError:
        await _invalidate(inbox, tx, wp, error, ended)
    else:
        if aborted:
            ended.append("aborted")


async def _invalidate(
    inbox: LoopInbox, tx: TransactionManager, wp: int, error: Exception, ended: list[str]
) -> None:
    try:
        invalidated = await inbox.wait(tx.invalidate_future(wp))
    except TidingsError as exc:
        error.add_note(f"could not invalidate transaction {wp}: {exc}")
    else:
        if invalidated:  # not one that had timed out (or ended so) already
            ended.append("invalidated")

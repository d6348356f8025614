"""The messaging API of CDAP TMS under ``/v1/namespaces/{ns}``, plus stats and long-poll.

Publish, store and rollback await the store's group-commit future on the event loop
(through the server's :class:`~tidings.server.inbox.LoopInbox`: one loop wake-up per
commit for all its answers and long-poll wake-ups): no thread is held per request, and
every request that arrives during one fsync joins the next commit. Polls read LMDB on
the loop itself: a snapshot read of up to a batch of messages costs less than the hop
to a thread and back (measured, docs/operations.md). A PostgreSQL store's reads are
network round trips, so there every read of these routes runs on a worker thread.

A poll with ``?isolation=read_committed`` and no ``transaction`` in its body is
read-committed on the server's side: each fetch, including every re-fetch of a
long-poll, uses a fresh read-only snapshot from this process's transaction manager
(memory only), and a parked poll wakes for a publish on its topic and for every end of
a transaction, so a commit shows up at once instead of after the client's next snapshot.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidings.codec import admin, columns, wire
from tidings.codec.media import JSON, Media
from tidings.codec.payload_frames import names_frames
from tidings.codec.transaction import decode_transaction
from tidings.errors import BadRequest, RoleUnavailable
from tidings.messaging.service import FetchedFrom
from tidings.names import check_name
from tidings.server.bodies import json_object, read_body, request_media, require_json
from tidings.server.handlers import Api, json_response, principal_of
from tidings.server.routes.consumers import wants_columns
from tidings.structs import MessageId, TopicEnd, Transaction
from tidings.tx import TransactionManager

__all__ = ["PREFIX", "routes"]

PREFIX = "/v1/namespaces/{ns}"
TOPIC = PREFIX + "/topics/{topic}"
#: Poll response headers (docs/api.md): messages in the page, id of the last one.
COUNT_HEADER = "Tidings-Count"
LAST_ID_HEADER = "Tidings-Last-Id"
#: Poll response header: the page reached its byte bound, so more may follow however
#: few messages it holds (a reader may ask for the next page at once).
MORE_HEADER = "Tidings-More"
#: Idempotent publish request headers (docs/api.md): who publishes, and which batch.
PRODUCER_HEADER = "Tidings-Producer-Id"
SEQUENCE_HEADER = "Tidings-Sequence"
#: Read-committed poll response header: the first entry of the oldest open transaction.
LAST_STABLE_HEADER = "Tidings-Last-Stable-Id"
#: Poll response header: the generation of the topic the page was read from.
TOPIC_GENERATION_HEADER = "Tidings-Topic-Generation"
#: Store response header (docs/api.md): the Payload Table range the store wrote.
PAYLOAD_RANGE_HEADER = "Tidings-Payload-Range"
#: The Content-Type of the empty answer to a non-transactional publish.
EMPTY_TYPE = "application/octet-stream"


def _names(request: Request) -> tuple[str, str]:
    params = request.path_params
    return check_name(params["ns"], "namespace"), check_name(params["topic"], "topic")


def _durable_snapshot(tx: TransactionManager) -> Transaction:
    snapshot = tx.snapshot()
    assert snapshot is not None
    return snapshot


def _wait_ms(request: Request, cap: int) -> int:
    raw = request.query_params.get("waitMs")
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise BadRequest(f"waitMs must be a non-negative integer, got {raw!r}")
    return min(int(raw), cap)


READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)


FIELDS = ("all", "id")


def max_bytes_param(request: Request) -> int | None:
    """A poll's ``maxBytes`` query parameter (None if absent): a positive integer,
    capped later at the server's ``fetch_max_bytes``."""
    raw = request.query_params.get("maxBytes")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18 or int(raw) < 1:
        raise BadRequest(f"maxBytes must be a positive integer, got {raw[:64]!r}")
    return int(raw)


def _ids_only(request: Request) -> bool:
    raw = request.query_params.get("fields")
    if raw is None or raw == "all":
        return False
    if raw == "id":
        return True
    raise BadRequest(f"fields must be one of {', '.join(FIELDS)}, got {raw[:64]!r}")


def _producer(request: Request) -> tuple[bytes, int] | None:
    """An idempotent publish's ``(producer id, sequence)``, from its headers."""
    headers = request.headers
    raw_id = headers.get(PRODUCER_HEADER)
    raw_seq = headers.get(SEQUENCE_HEADER)
    if raw_id is None and raw_seq is None:
        return None
    if raw_id is None or raw_seq is None:
        raise BadRequest(f"{PRODUCER_HEADER} and {SEQUENCE_HEADER} go together")
    # The length first: bytes.fromhex() also takes whitespace between the digits.
    if len(raw_id) != 32:
        raise BadRequest(f"{PRODUCER_HEADER} must be 32 hex digits")
    try:
        producer_id = bytes.fromhex(raw_id)
    except ValueError:
        raise BadRequest(f"{PRODUCER_HEADER} must be 32 hex digits") from None
    if len(producer_id) != 16:
        raise BadRequest(f"{PRODUCER_HEADER} must be 32 hex digits")
    if not (raw_seq.isascii() and raw_seq.isdigit()) or len(raw_seq) > 18:
        raise BadRequest(f"{SEQUENCE_HEADER} must be a non-negative integer of at most 18 digits")
    return producer_id, int(raw_seq)


def _read_committed(request: Request) -> bool:
    raw = request.query_params.get("isolation")
    if raw is None or raw == READ_UNCOMMITTED:
        return False
    if raw == READ_COMMITTED:
        return True
    raise BadRequest(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {raw[:64]!r}")


async def _publish_request(
    request: Request, max_body: int, stored_for: Literal["publish", "store"]
) -> tuple[Media, wire.PublishRequest]:
    """A publish or store body in any medium they take, and the medium to answer in:
    the request's, or JSON for the payloads medium (which has no answers of its own)."""
    if names_frames(request.headers.get("content-type")):
        return JSON, wire.decode_payloads_request(await read_body(request, max_body))
    media = request_media(request)
    body = await read_body(request, max_body)
    return media, wire.decode_publish_request(body, media, stored_for=stored_for)


def routes(api: Api) -> list[Route]:
    """Every messaging route; the hot ones (publish, poll) first, as Starlette tries in order."""
    max_body = api.config.max_body_bytes
    max_wait_ms = api.config.max_wait_ms
    longpolls = api.longpolls
    inbox = api.inbox
    # Over LMDB the reads below run on the loop (cheaper than a thread hop); where they
    # wait on the network they run on the worker threads (Api.reads_block).
    reads_block = api.reads_block
    if api.services.tx is not None:
        # Wake read-committed long-polls whenever a transaction ends (commits through
        # the transaction routes, timeouts through the manager's sweeper).
        api.services.tx.add_listener(longpolls.on_transaction)

    def manager() -> TransactionManager:
        tx = api.services.tx
        if tx is None:
            raise RoleUnavailable(
                "isolation=read_committed needs the transaction service in this process "
                f"(role={api.config.role}); poll with a transaction snapshot instead"
            )
        return tx

    async def snapshot(tx: TransactionManager) -> Transaction:
        # From memory on the loop; only if a commit is not yet durable, wait on a worker.
        snapshot = tx.snapshot(wait=False)
        if snapshot is None:
            snapshot = await api.blocking(_durable_snapshot, tx)
        return snapshot

    @api.endpoint(TOPIC + "/publish")
    async def publish(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        media, req = await _publish_request(request, max_body, "publish")
        producer = _producer(request)
        api.require_writer(request, req.write_pointer)
        if reads_block:
            await api.known_topics(ns, (topic,))
        info = await inbox.wait(
            messaging.publish_future(
                ns, topic, req.records, req.write_pointer, req.payload_ranges, producer
            )
        )
        if info is None:
            # As in CDAP TMS, a non-transactional publish answers an empty body. Empty is no
            # JSON document, so it is not labelled as one (docs/api.md).
            return Response(b"", media_type=EMPTY_TYPE)
        return Response(wire.encode_rollback_info(info, media), media_type=media.value)

    @api.endpoint(TOPIC + "/poll")
    async def poll(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        wait_ms = _wait_ms(request, max_wait_ms)
        read_committed = _read_committed(request)
        ids_only = _ids_only(request)
        max_bytes = max_bytes_param(request)
        media = request_media(request)
        req = wire.decode_consume_request(await read_body(request, max_body), media)
        tx: Transaction | None = None
        manager_: TransactionManager | None = None
        if req.transaction is not None:
            tx = decode_transaction(req.transaction)  # the caller's snapshot wins
        elif read_committed:
            manager_ = manager()  # its snapshot is taken right before each fetch

        columnar = not ids_only and wants_columns(request)
        # Read in the fetch's own store view: a reader checking that the topic was not
        # deleted and created again under it needs no request of its own.
        source = FetchedFrom()

        def fetch(counted: bool = True) -> tuple[bytes, int, MessageId | None]:
            if columnar:
                return messaging.fetch_columns(
                    ns, topic, start=req.start, inclusive=req.inclusive, limit=req.limit,
                    transaction=tx, max_bytes=max_bytes, count=counted, source=source,
                )  # fmt: skip
            if ids_only:
                return messaging.fetch_ids_encoded(
                    ns, topic, media, start=req.start, inclusive=req.inclusive,
                    limit=req.limit, transaction=tx, count=counted, source=source,
                )  # fmt: skip
            return messaging.fetch_encoded(
                ns, topic, media, start=req.start, inclusive=req.inclusive, limit=req.limit,
                transaction=tx, max_bytes=max_bytes, count=counted, source=source,
            )  # fmt: skip

        if wait_ms <= 0:
            if manager_ is not None:
                tx = await snapshot(manager_)
            body, count, last = await api.blocking(fetch) if reads_block else fetch()
        else:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while True:
                # Parked before the fetch (and the snapshot): no commit slips in between,
                # and a poll that finds nothing fetches once, not twice.
                woken = longpolls.park(ns, topic, transactions=manager_ is not None)
                try:
                    if manager_ is not None:
                        tx = await snapshot(manager_)
                    # Woken polls fetch again: the poll is counted once, when it answers.
                    if reads_block:
                        body, count, last = await api.blocking(fetch, counted=False)
                    else:
                        body, count, last = fetch(counted=False)
                    remaining = deadline - loop.time()
                    if count or remaining <= 0 or longpolls.closed:
                        break
                    await longpolls.wait(woken, remaining)
                finally:
                    longpolls.unpark(woken, ns, topic)
            messaging.count_fetch(ns, topic, count)
        # The page's extent, so a client can ask for the next page before decoding it.
        headers = {COUNT_HEADER: str(count)}
        if source.generation is not None:
            headers[TOPIC_GENERATION_HEADER] = str(source.generation)
        if last is not None:
            headers[LAST_ID_HEADER] = last.hex
            if not ids_only and len(body) >= messaging.max_bytes(max_bytes):
                # Its messages' bytes are at most its body's: a page that stopped at
                # the bound has at least that body (JSON's base64 may say so early).
                headers[MORE_HEADER] = "true"
        if manager_ is not None and tx is not None:
            # Read-committed with the server's snapshot: where it would stop (the first
            # entry of the oldest open transaction), if anywhere.
            if reads_block:
                stable = await api.blocking(messaging.last_stable, ns, topic, tx)
            else:
                stable = messaging.last_stable(ns, topic, tx)
            if stable is not None:
                headers[LAST_STABLE_HEADER] = stable.hex
        answer = columns.CONTENT_TYPE if columnar else media.value
        return Response(body, media_type=answer, headers=headers)

    @api.endpoint(TOPIC + "/store")
    async def store(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        media, req = await _publish_request(request, max_body, "store")
        if _producer(request) is not None:
            # A store is transactional: its payloads count once the transaction
            # commits, and a producer's sequence would dedupe nothing there.
            raise BadRequest(
                f"{PRODUCER_HEADER} and {SEQUENCE_HEADER} belong to a non-transactional "
                "publish, not to a store"
            )
        if req.write_pointer is None:
            raise BadRequest("store requires a transactionWritePointer")
        if req.payload_ranges is not None:
            raise BadRequest("payloadRanges belong to a publish, not to a store")
        api.require_writer(request, req.write_pointer)
        if reads_block:
            await api.known_topics(ns, (topic,))
        rng = await inbox.wait(messaging.store_future(ns, topic, req.write_pointer, req.records))
        # A header, not a body: the store's body stays empty in every encoding.
        return Response(
            b"",
            media_type=media.value,
            headers={PAYLOAD_RANGE_HEADER: wire.format_payload_range(rng)},
        )

    @api.endpoint(TOPIC + "/rollback")
    async def rollback(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        media = request_media(request)
        info = wire.decode_rollback_info(await read_body(request, max_body), media)
        api.require_writer(request, info.write_pointer)
        if reads_block:
            await api.known_topics(ns, (topic,))
        count = await inbox.wait(messaging.rollback_future(ns, topic, info))
        if media is wire.JSON:
            return json_response(admin.rolled_back_json(count))
        return Response(b"", media_type=media.value)

    @api.endpoint(TOPIC)
    async def topic(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        if request.method in ("GET", "HEAD"):
            meta = await api.blocking(messaging.get_topic, ns, topic)
            return json_response(admin.topic_json(meta))
        if request.method == "DELETE":
            topic_id, _ = await api.blocking(messaging.identity, ns, topic)
            await api.blocking(messaging.delete_topic, ns, topic)
            if api.services.groups is not None:  # its consumer groups go with it
                await api.blocking(api.services.groups.forget_topic, topic_id)
            if api.services.queues is not None:  # and its queues
                await api.blocking(api.services.queues.forget_topic, topic_id)
            return json_response({})
        require_json(request)
        properties = json_object(await read_body(request, max_body), "topic properties")
        meta = await api.blocking(messaging.create_topic, ns, topic, properties)
        return json_response(admin.topic_json(meta))

    @api.endpoint(TOPIC + "/properties")
    async def properties(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        require_json(request)
        properties = json_object(await read_body(request, max_body), "topic properties")
        meta = await api.blocking(messaging.update_topic, ns, topic, properties)
        return json_response(admin.topic_json(meta))

    @api.endpoint(PREFIX + "/topics")
    async def topics(request: Request) -> Response:
        messaging = api.messaging
        ns = check_name(request.path_params["ns"], "namespace")
        found = await api.blocking(messaging.list_topics, ns)
        principal = principal_of(request)
        if principal is not None:
            # Any principal may ask, but it learns only the topics it may publish to or
            # consume, as Kafka lists only the topics a principal may describe: a
            # topic's name is its producers' and consumers' business (docs/security.md).
            found = [t for t in found if principal.may_publish(t) or principal.may_consume(t)]
        return json_response(sorted(found))

    async def end_of(ns: str, topic: str) -> TopicEnd:
        messaging = api.messaging  # 503 where the role lacks it
        tx = api.services.tx
        current = None if tx is None else await snapshot(tx)
        return await api.blocking(messaging.end, ns, topic, current)

    @api.endpoint(TOPIC + "/stats")
    async def stats(request: Request) -> Response:
        messaging = api.messaging
        ns, topic = _names(request)
        found = await api.blocking(messaging.stats, ns, topic)
        end = await end_of(ns, topic)
        groups = api.services.groups
        principal = principal_of(request)
        if groups is None or (principal is not None and not principal.may_consume(topic)):
            # Group names and positions are the consumers' business: a principal that
            # may only publish here sees the topic's numbers without them (the table
            # lets it in with publish alone, docs/security.md).
            lags = {}
        else:
            lags = await api.blocking(groups.topic_lags, ns, topic)
            if principal is not None:
                lags = {g: lag for g, lag in lags.items() if principal.may_use_group(g)}
        found = dataclasses.replace(found, last_stable_id=end.last_stable_id, group_lags=lags)
        return json_response(admin.stats_json(found))

    @api.endpoint(TOPIC + "/end")
    async def end(request: Request) -> Response:
        ns, topic = _names(request)
        return json_response(admin.end_json(await end_of(ns, topic)))

    return [
        Route(TOPIC + "/publish", publish, methods=["POST"]),
        Route(TOPIC + "/poll", poll, methods=["POST"]),
        Route(TOPIC + "/store", store, methods=["POST"]),
        Route(TOPIC + "/rollback", rollback, methods=["POST"]),
        Route(TOPIC, topic, methods=["GET", "PUT", "DELETE"]),
        Route(TOPIC + "/properties", properties, methods=["PUT"]),
        Route(TOPIC + "/end", end, methods=["GET"]),
        Route(TOPIC + "/stats", stats, methods=["GET"]),
        Route(PREFIX + "/topics", topics, methods=["GET"]),
    ]

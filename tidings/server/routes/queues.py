"""Queues under ``/v1/namespaces/{ns}/topics/{topic}/queues`` (docs/api.md, "Queues").

Bodies are JSON. A pop answers messages in the medium its ``Accept`` header names
(JSON without one), with each message's delivery count in a header, so the Avro fast
path serves pops too. Everything here needs both services in the process (503
otherwise); the coordinator's calls block on store writes, so they run on the worker
threads unless they can run without waiting (a pop that finds its queue in memory,
an ack outside a transaction, whose store write is awaited on the loop). On a
PostgreSQL store those take a worker thread too, as they read the store over the
network; an ack's store write is still awaited on the loop. A pop may
carry the worker's acks of its previous batch (``ackIds``): one request per round.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidings.codec import queue_bodies
from tidings.consumers.queues import DEFAULT_ACK_TIMEOUT_MS, Popped
from tidings.errors import BadRequest
from tidings.names import check_name
from tidings.server.handlers import Api, json_response, principal_of
from tidings.server.routes.consumers import answer_media, json_body, path_names, read_snapshot
from tidings.server.routes.messaging import (
    COUNT_HEADER,
    LAST_ID_HEADER,
    TOPIC,
    _wait_ms,
    max_bytes_param,
)

__all__ = ["QUEUE", "QUEUES", "routes"]

NAMESPACE_QUEUES = "/v1/namespaces/{ns}/queues"
QUEUES = TOPIC + "/queues"
QUEUE = QUEUES + "/{queue}"


def routes(api: Api) -> list[Route]:
    """Every queue route."""
    max_wait_ms = api.config.max_wait_ms
    longpolls = api.longpolls
    # The calls below that run on the loop over LMDB read the store (the topic's
    # identity, its messages): where reads wait on the network, on a worker thread.
    reads_block = api.reads_block

    @api.endpoint(NAMESPACE_QUEUES)
    async def all_queues(request: Request) -> Response:
        coordinator = api.queues
        ns = check_name(request.path_params["ns"], "namespace")
        found = await api.blocking(coordinator.all_names, ns)
        principal = principal_of(request)
        if principal is not None:
            # Any principal may ask, but a queue's name is its topic's consumers'
            # business, as the topic's own queue list is (docs/security.md).
            found = [
                (t, q) for t, q in found if principal.may_consume(t) and principal.may_use_queue(q)
            ]
        return json_response([{"topic": t, "queue": q} for t, q in found])

    @api.endpoint(QUEUES)
    async def queues(request: Request) -> Response:
        coordinator = api.queues
        ns = check_name(request.path_params["ns"], "namespace")
        topic = check_name(request.path_params["topic"], "topic")
        found = await api.blocking(coordinator.names, ns, topic)
        principal = principal_of(request)
        if principal is not None:
            found = [q for q in found if principal.may_use_queue(q)]
        return json_response(found)

    @api.endpoint(QUEUE)
    async def queue(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        if request.method == "DELETE":
            await api.blocking(coordinator.delete, ns, topic, name)
            return json_response({})
        stats = await api.blocking(coordinator.describe, ns, topic, name)
        return json_response(queue_bodies.queue_json(stats))

    @api.endpoint(QUEUE + "/pop")
    async def pop(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        wait_ms = _wait_ms(request, max_wait_ms)
        max_bytes = max_bytes_param(request)
        req = queue_bodies.read_pop_request(await json_body(api, request, "pop request"))
        principal = principal_of(request)
        if principal is not None and req.dead_letter_topic is not None:
            # Dead letters are published there (the topic created if need be): naming
            # it takes what publishing there takes, or consuming one topic would
            # publish into any other.
            principal.require_publish(req.dead_letter_topic)
        media = answer_media(request)
        ack_timeout_ms = req.ack_timeout_ms or DEFAULT_ACK_TIMEOUT_MS
        if req.ack_ids:
            # The pop and its settings are checked before the acks (NATS JetStream's
            # "ack next"): a pop that cannot be made must not leave its acks applied.
            # Without acks the coordinator's pop checks them itself, in memory or not.
            coordinator.check_pop(req.consumer, req.max_messages, ack_timeout_ms)
            coordinator.check_settings(topic, req.max_deliveries, req.dead_letter_topic, req.start)
            # The acks first, durable before the pop: acks that fail pop nothing. A pop
            # run while their write is in flight would lease messages that stay leased
            # to the worker until ``ackTimeoutMs`` if that write fails (the queue's
            # memory rebuilt from the records meanwhile), though the answer is the
            # failure. Waiting costs no store write and no thread hop, only the pop's
            # own time after the write instead of alongside it.
            acked: Future[None] | None
            if reads_block:
                acked = await api.blocking(
                    coordinator.ack_nowait, ns, topic, name, req.consumer, req.ack_ids,
                    snapshot=await read_snapshot(api),
                )  # fmt: skip
            else:
                acked = coordinator.ack_nowait(
                    ns, topic, name, req.consumer, req.ack_ids, snapshot=await read_snapshot(api)
                )
            if acked is None:  # the queue is not in memory: a worker loads it
                await api.blocking(coordinator.ack, ns, topic, name, req.consumer, req.ack_ids)
            else:
                await api.inbox.wait(acked)

        async def take() -> Popped:
            tx = await read_snapshot(api)
            # On the loop where nothing waits for the store (the common case: a pop
            # writes nothing); a worker thread otherwise.
            if not reads_block:
                found = coordinator.pop_nowait(
                    ns,
                    topic,
                    name,
                    req.consumer,
                    max_messages=req.max_messages,
                    ack_timeout_ms=ack_timeout_ms,
                    snapshot=tx,
                    max_deliveries=req.max_deliveries,
                    dead_letter=req.dead_letter_topic,
                    max_bytes=max_bytes,
                    start=req.start,
                )
                if found is not None:
                    return found
            return await api.blocking(
                coordinator.pop_items,
                ns,
                topic,
                name,
                req.consumer,
                max_messages=req.max_messages,
                ack_timeout_ms=ack_timeout_ms,
                snapshot=tx,
                max_deliveries=req.max_deliveries,
                dead_letter=req.dead_letter_topic,
                start=req.start,
                max_bytes=max_bytes,
            )

        if wait_ms <= 0:
            popped = await take()
        else:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while True:
                # Woken by a publish, a nack or close on the topic, or a transaction's
                # end (an abort gives acked messages back); a lease running out wakes
                # nobody, so the wait stops at the next deadline.
                woken = longpolls.park(ns, topic, transactions=True)
                try:
                    popped = await take()
                    remaining = deadline - loop.time()
                    if popped.ids or remaining <= 0 or longpolls.closed:
                        break
                    if reads_block:
                        lease_end = await api.blocking(coordinator.next_deadline, ns, topic, name)
                    else:
                        lease_end = coordinator.next_deadline(ns, topic, name)
                    pause = min(remaining, 1.0 if lease_end is None else lease_end + 0.001)
                    await longpolls.wait(woken, pause)
                finally:
                    longpolls.unpark(woken, ns, topic)
        api.messaging.count_fetch(ns, topic, len(popped.ids))
        headers = {
            COUNT_HEADER: str(len(popped.ids)),
            queue_bodies.DELIVERY_COUNTS_HEADER: queue_bodies.delivery_counts(popped.counts),
        }
        if popped.ids:
            headers[LAST_ID_HEADER] = popped.ids[-1].hex
        return Response(popped.body(media), media_type=media.value, headers=headers)

    @api.endpoint(QUEUE + "/ack")
    async def ack(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        consumer, ids, write_pointer = queue_bodies.read_ack_request(
            await json_body(api, request, "ack request")
        )
        api.require_writer(request, write_pointer)
        if write_pointer is None:
            # Outside a transaction an ack only queues a store write: await it here
            # rather than hold a worker thread for it.
            if reads_block:
                done = await api.blocking(
                    coordinator.ack_nowait, ns, topic, name, consumer, ids,
                    snapshot=await read_snapshot(api),
                )  # fmt: skip
            else:
                done = coordinator.ack_nowait(
                    ns, topic, name, consumer, ids, snapshot=await read_snapshot(api)
                )
            if done is not None:
                await api.inbox.wait(done)
                return json_response({})
        await api.blocking(
            coordinator.ack, ns, topic, name, consumer, ids, write_pointer=write_pointer
        )
        return json_response({})

    @api.endpoint(QUEUE + "/nack")
    async def nack(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        consumer, ids, write_pointer = queue_bodies.read_ack_request(
            await json_body(api, request, "nack request"), what="nack request"
        )
        if write_pointer is not None:
            raise BadRequest("a nack takes effect at once: it takes no transaction")
        skipped = await api.blocking(coordinator.nack, ns, topic, name, consumer, ids)
        return json_response(queue_bodies.nack_json(skipped))

    @api.endpoint(QUEUE + "/extend")
    async def extend(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        consumer, ids, ack_timeout_ms = queue_bodies.read_extend_request(
            await json_body(api, request, "extend request")
        )
        skipped = await api.blocking(
            coordinator.extend,
            ns,
            topic,
            name,
            consumer,
            ids,
            ack_timeout_ms or DEFAULT_ACK_TIMEOUT_MS,
        )
        return json_response(queue_bodies.nack_json(skipped))

    @api.endpoint(QUEUE + "/rollback")
    async def rollback(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        body = await json_body(api, request, "rollback request")
        write_pointer = queue_bodies.read_rollback_request(body)
        api.require_writer(request, write_pointer)
        keep = queue_bodies.read_rollback_keeps_leases(body)
        returned = await api.blocking(
            coordinator.rollback, ns, topic, name, write_pointer, keep_leases=keep
        )
        return json_response({"returned": returned})

    @api.endpoint(QUEUE + "/release")
    async def release(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        consumer = queue_bodies.read_consumer_request(
            await json_body(api, request, "release request")
        )
        released = await api.blocking(coordinator.release, ns, topic, name, consumer)
        return json_response({"released": released})

    @api.endpoint(QUEUE + "/purge")
    async def purge(request: Request) -> Response:
        coordinator = api.queues
        ns, topic, name = path_names(request, "queue")
        purged = await api.blocking(coordinator.purge, ns, topic, name)
        return json_response({"purged": purged})

    return [
        Route(QUEUE + "/pop", pop, methods=["POST"]),
        Route(QUEUE + "/ack", ack, methods=["POST"]),
        Route(QUEUE + "/nack", nack, methods=["POST"]),
        Route(QUEUE + "/extend", extend, methods=["POST"]),
        Route(QUEUE + "/rollback", rollback, methods=["POST"]),
        Route(QUEUE + "/release", release, methods=["POST"]),
        Route(QUEUE + "/purge", purge, methods=["POST"]),
        Route(QUEUE, queue, methods=["GET", "DELETE"]),
        Route(QUEUES, queues, methods=["GET"]),
        Route(NAMESPACE_QUEUES, all_queues, methods=["GET"]),
    ]

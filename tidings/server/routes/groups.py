"""Consumer groups under ``/v1/namespaces/{ns}/topics/{topic}/groups`` (docs/api.md).

Bodies are JSON. A group poll answers messages in the medium its ``Accept`` header
names (JSON without one), with the page's extent and the member's assignment in
headers, so a member learns of a rebalance from its next poll. Everything here needs
both services in the process (503 otherwise); the coordinator's calls block on store
writes, so they run on the worker threads.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidings.codec import admin, columns, json_bodies, wire
from tidings.consumers.groups import DEFAULT_SESSION_TIMEOUT_MS
from tidings.consumers.pages import Selection
from tidings.names import check_name
from tidings.server.handlers import Api, json_response, principal_of
from tidings.server.routes.consumers import (
    answer_media,
    json_body,
    path_names,
    read_snapshot,
    wants_columns,
)
from tidings.server.routes.messaging import (
    COUNT_HEADER,
    LAST_ID_HEADER,
    MORE_HEADER,
    TOPIC,
    _wait_ms,
    max_bytes_param,
)
from tidings.structs import GroupAssignment, MessageId

__all__ = ["GROUP", "GROUPS", "routes"]

GROUPS = TOPIC + "/groups"
GROUP = GROUPS + "/{group}"
#: Group poll answer headers: the member's assignment as of this poll.
GENERATION_HEADER = "Tidings-Generation"
PARTITIONS_HEADER = "Tidings-Partitions"
PARTITION_COUNT_HEADER = "Tidings-Partition-Count"
#: Per partition of ``Tidings-Partitions``, the generation since which the member holds it.
OWNED_SINCE_HEADER = "Tidings-Owned-Since"
_DEFAULT_LIMIT = 500


def routes(api: Api) -> list[Route]:
    """Every consumer-group route."""
    max_wait_ms = api.config.max_wait_ms
    longpolls = api.longpolls
    # A heartbeat and a long poll's wait read the store (the topic's identity, the
    # group's record): on the loop over LMDB, on a worker thread where reads wait on
    # the network.
    reads_block = api.reads_block

    @api.endpoint(GROUPS)
    async def groups(request: Request) -> Response:
        coordinator = api.groups
        ns = check_name(request.path_params["ns"], "namespace")
        topic = check_name(request.path_params["topic"], "topic")
        found = await api.blocking(coordinator.list, ns, topic)
        principal = principal_of(request)
        if principal is not None:
            # Only the groups the principal may use, as Kafka lists only the groups a
            # principal may describe (docs/security.md).
            found = [g for g in found if principal.may_use_group(g)]
        return json_response(found)

    @api.endpoint(GROUP)
    async def group(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        if request.method == "DELETE":
            await api.blocking(coordinator.delete, ns, topic, name)
            return json_response({})
        info = await api.blocking(coordinator.describe, ns, topic, name)
        return json_response(admin.group_json(info))

    @api.endpoint(GROUP + "/join")
    async def join(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        req = admin.read_join_request(await json_body(api, request, "join request"))
        assignment = await api.blocking(
            coordinator.join,
            ns,
            topic,
            name,
            req.member_id,
            # 0 is a value out of range (400), not "the default".
            session_timeout_ms=DEFAULT_SESSION_TIMEOUT_MS
            if req.session_timeout_ms is None
            else req.session_timeout_ms,
            partitions=req.partitions,
            start=req.start,
        )
        return json_response(admin.assignment_json(assignment))

    @api.endpoint(GROUP + "/heartbeat")
    async def heartbeat(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        member_id, _ = admin.read_member_request(
            await json_body(api, request, "heartbeat"), "heartbeat", poll=False
        )
        # On the loop unless it would wait (docs/design.md, "Where the work runs").
        assignment = None
        if not reads_block:
            assignment = coordinator.heartbeat_nowait(ns, topic, name, member_id)
        if assignment is None:
            assignment = await api.blocking(coordinator.heartbeat, ns, topic, name, member_id)
        return json_response(admin.assignment_json(assignment))

    @api.endpoint(GROUP + "/leave")
    async def leave(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        member_id, _ = admin.read_member_request(
            await json_body(api, request, "leave request"), "leave request", poll=False
        )
        await api.blocking(coordinator.leave, ns, topic, name, member_id)
        return json_response({})

    @api.endpoint(GROUP + "/poll")
    async def poll(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        wait_ms = _wait_ms(request, max_wait_ms)
        max_bytes = max_bytes_param(request)
        member_id, limit = admin.read_member_request(await json_body(api, request, "group poll"))
        limit = min(limit or _DEFAULT_LIMIT, api.config.fetch_max_limit)
        media = answer_media(request)
        columnar = wants_columns(request)

        async def fetch() -> tuple[Selection, MessageId | None, GroupAssignment]:
            tx = await read_snapshot(api)
            return await api.blocking(
                coordinator.poll_columns, ns, topic, name, member_id, limit=limit, snapshot=tx,
                max_bytes=max_bytes,
            )  # fmt: skip

        if wait_ms <= 0:
            rows, last, assignment = await fetch()
        else:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while True:
                woken = longpolls.park(ns, topic, transactions=True)
                try:
                    rows, last, assignment = await fetch()
                    remaining = deadline - loop.time()
                    if rows or remaining <= 0 or longpolls.closed:
                        break
                    # Wake at least once per second: a rebalance changes nothing on
                    # the topic, and the member must learn of it. Waiting keeps it in
                    # the group, whatever its session timeout.
                    if reads_block:
                        session = await api.blocking(
                            coordinator.session, ns, topic, name, member_id
                        )
                        with coordinator.waiting_in(session):
                            await longpolls.wait(woken, min(remaining, 1.0))
                    else:
                        with coordinator.waiting(ns, topic, name, member_id):
                            await longpolls.wait(woken, min(remaining, 1.0))
                finally:
                    longpolls.unpark(woken, ns, topic)
        api.messaging.count_fetch(ns, topic, len(rows))
        headers = {
            COUNT_HEADER: str(len(rows)),
            GENERATION_HEADER: str(assignment.generation),
            PARTITIONS_HEADER: ",".join(map(str, assignment.partitions)),
            PARTITION_COUNT_HEADER: str(assignment.partition_count),
            OWNED_SINCE_HEADER: ",".join(map(str, assignment.owned_since)),
        }
        if columnar:  # the pages' columns, the member's rows as they are
            body_, answer = rows.encode(), columns.CONTENT_TYPE
        else:
            # Another medium (a member that does not name the columnar one): the rows
            # as messages, then encoded.
            body_, answer = wire.encode_messages(rows.messages(), media), media.value
        if last is not None:
            headers[LAST_ID_HEADER] = last.hex
            if len(body_) >= api.messaging.max_bytes(max_bytes):
                headers[MORE_HEADER] = "true"  # as for a poll
        return Response(body_, media_type=answer, headers=headers)

    @api.endpoint(GROUP + "/commit")
    async def commit(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        body = await json_body(api, request, "group commit")
        json_bodies.only(body, admin.GROUP_COMMIT_FIELDS, "group commit")
        member_id, positions, write_pointer = admin.read_group_commit_request(body)
        generation = admin.read_commit_generation(body)
        generations = admin.read_position_generations(body)
        api.require_writer(request, write_pointer)
        changes = await api.blocking(
            coordinator.commit, ns, topic, name, member_id, positions,
            write_pointer=write_pointer, generation=generation, generations=generations,
        )  # fmt: skip
        return json_response(admin.changes_json(changes))

    @api.endpoint(GROUP + "/rollback")
    async def rollback(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        write_pointer, member_id = admin.read_group_rollback_request(
            await json_body(api, request, "group rollback")
        )
        api.require_writer(request, write_pointer)
        await api.blocking(
            coordinator.rollback, ns, topic, name, write_pointer, member_id=member_id
        )
        return json_response({})

    @api.endpoint(GROUP + "/reset")
    async def reset(request: Request) -> Response:
        coordinator = api.groups
        ns, topic, name = path_names(request, "group")
        to = admin.read_reset_request(await json_body(api, request, "reset request"))
        await api.blocking(coordinator.reset, ns, topic, name, to)
        return json_response({})

    return [
        Route(GROUP + "/poll", poll, methods=["POST"]),
        Route(GROUP + "/heartbeat", heartbeat, methods=["POST"]),
        Route(GROUP + "/commit", commit, methods=["POST"]),
        Route(GROUP + "/join", join, methods=["POST"]),
        Route(GROUP + "/leave", leave, methods=["POST"]),
        Route(GROUP + "/rollback", rollback, methods=["POST"]),
        Route(GROUP + "/reset", reset, methods=["POST"]),
        Route(GROUP, group, methods=["GET", "DELETE"]),
        Route(GROUPS, groups, methods=["GET"]),
    ]

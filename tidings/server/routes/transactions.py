"""The transaction service's API under ``/v1/transactions`` (docs/api.md), JSON only.

The manager's calls block until the transaction log is durable (group-committed
across callers), so they run on the worker threads; many concurrent begins and
commits share one fsync.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidings.codec.wire import INT64_MAX, b64encode
from tidings.errors import BadRequest, TransactionConflict
from tidings.server.bodies import (
    base64_list,
    int_list,
    json_object,
    opt_int,
    opt_number,
    opt_str,
    read_body,
    require_json,
)
from tidings.server.handlers import Api, json_response
from tidings.tx import encode_transaction

__all__ = ["PREFIX", "routes"]

PREFIX = "/v1/transactions"


def _write_pointer(request: Request) -> int:
    raw = request.path_params["wp"]
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= INT64_MAX:
        raise BadRequest(f"a write pointer is a positive 64-bit integer, got {raw!r}")
    return int(raw)


def routes(api: Api) -> list[Route]:
    """Every transaction route."""
    # Transaction bodies are a few hundred bytes; a change set may be large, but not
    # larger than what the messaging side accepts.
    max_body = api.config.max_body_bytes
    counts = api.metrics.tx

    async def body(request: Request, what: str) -> dict[str, object]:
        require_json(request)
        return json_object(await read_body(request, max_body), what)

    @api.endpoint(PREFIX)
    async def transactions(request: Request) -> Response:
        tx = api.tx
        if request.method in ("GET", "HEAD"):
            state = await api.blocking(tx.state)
            return json_response(
                {
                    "readPointer": state.read_pointer,
                    "lastWritePointer": state.last_write_pointer,
                    "inProgress": [
                        {"writePointer": wp, "expiresAt": expires}
                        for wp, expires in sorted(state.in_progress.items())
                    ],
                    "invalid": list(state.invalid),
                }
            )
        obj = await body(request, "begin request")
        timeout = opt_number(obj, "timeout")
        transactional_id = opt_str(obj, "transactionalId")
        epoch = opt_int(obj, "epoch", 0)
        snapshot = await api.blocking(
            tx.begin, timeout, transactional_id=transactional_id, epoch=epoch
        )
        counts.begun += 1
        return json_response(
            {
                "writePointer": snapshot.write_pointer,
                "readPointer": snapshot.read_pointer,
                "invalid": list(snapshot.invalid),
                "inProgress": list(snapshot.in_progress),
                "encoded": b64encode(encode_transaction(snapshot)),
            }
        )

    @api.endpoint(PREFIX + "/{wp}/commit")
    async def commit(request: Request) -> Response:
        tx = api.tx
        wp = _write_pointer(request)
        obj = await body(request, "commit request")
        changes = base64_list(obj, "changes")
        transactional_id = opt_str(obj, "transactionalId")
        epoch = opt_int(obj, "epoch", 0)
        try:
            await api.blocking(
                tx.commit, wp, changes, transactional_id=transactional_id, epoch=epoch
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
        obj = await body(request, "abort request")
        transactional_id = opt_str(obj, "transactionalId")
        epoch = opt_int(obj, "epoch", 0)
        await api.blocking(tx.abort, wp, transactional_id=transactional_id, epoch=epoch)
        counts.aborted += 1
        return json_response({})

    @api.endpoint(PREFIX + "/{wp}/invalidate")
    async def invalidate(request: Request) -> Response:
        tx = api.tx
        wp = _write_pointer(request)
        await api.blocking(tx.invalidate, wp)
        counts.invalidated += 1
        return json_response({})

    @api.endpoint(PREFIX + "/producers")
    async def producers(request: Request) -> Response:
        tx = api.tx
        obj = await body(request, "producer registration")
        transactional_id = opt_str(obj, "transactionalId")
        if transactional_id is None:
            raise BadRequest("transactionalId is required")
        info = await api.blocking(tx.register_producer, transactional_id)
        return json_response(
            {
                "transactionalId": info.transactional_id,
                "producerId": info.producer_id,
                "epoch": info.epoch,
            }
        )

    @api.endpoint(PREFIX + "/prune")
    async def prune(request: Request) -> Response:
        tx = api.tx
        obj = await body(request, "prune request")
        below = opt_int(obj, "below", 0)
        ids = int_list(obj, "ids")
        pruned = await api.blocking(tx.prune, below=below, ids=ids)
        return json_response({"pruned": sorted(pruned)})

    return [
        Route(PREFIX, transactions, methods=["GET", "POST"]),
        Route(PREFIX + "/{wp}/commit", commit, methods=["POST"]),
        Route(PREFIX + "/{wp}/abort", abort, methods=["POST"]),
        Route(PREFIX + "/{wp}/invalidate", invalidate, methods=["POST"]),
        Route(PREFIX + "/producers", producers, methods=["POST"]),
        Route(PREFIX + "/prune", prune, methods=["POST"]),
    ]

"""What the consumer-group and queue routes share: the medium of an answer, and the
transaction snapshot their reads are committed in."""

from __future__ import annotations

from starlette.requests import Request

from tidings.codec import columns, wire
from tidings.errors import TidingsError
from tidings.names import check_name
from tidings.server.bodies import json_object, read_body, require_json
from tidings.server.handlers import Api
from tidings.structs import Transaction
from tidings.tx import TransactionManager

__all__ = ["answer_media", "json_body", "path_names", "read_snapshot"]


def path_names(request: Request, last: str) -> tuple[str, str, str]:
    """The namespace, topic and ``last`` (``group`` or ``queue``) of the path, checked."""
    params = request.path_params
    return (
        check_name(params["ns"], "namespace"),
        check_name(params["topic"], "topic"),
        check_name(params[last], last),
    )


async def json_body(api: Api, request: Request, what: str) -> dict[str, object]:
    """The request's JSON object body (415, 413 and 400 as every JSON endpoint)."""
    require_json(request)
    return json_object(await read_body(request, api.config.max_body_bytes), what)


def answer_media(request: Request) -> wire.Media:
    """The medium the ``Accept`` header names; JSON without one, or for ``*/*``."""
    try:
        return wire.media_for(request.headers.get("accept"))
    except TidingsError:
        return wire.JSON


def wants_columns(request: Request) -> bool:
    """True if the ``Accept`` header names the columnar poll response: only such a
    request gets it (every other poll answers in the medium of its request, as CDAP
    TMS's does)."""
    accept = request.headers.get("accept")
    if not accept or columns.CONTENT_TYPE not in accept.lower():
        return False
    return any(
        part.split(";")[0].strip().lower() == columns.CONTENT_TYPE for part in accept.split(",")
    )


async def read_snapshot(api: Api) -> Transaction:
    """A read-committed snapshot: the transaction service's latest when it has one at
    hand, else a durable one taken on a worker thread. The callers' routes answer 503
    before this where the process runs no transaction service."""
    tx = api.services.tx
    assert tx is not None
    found = tx.snapshot(wait=False)
    if found is None:
        found = await api.blocking(_durable, tx)
    return found


def _durable(tx: TransactionManager) -> Transaction:
    found = tx.snapshot()
    assert found is not None
    return found

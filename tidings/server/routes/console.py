"""The web console (docs/console.md): its static files under ``/console/``, and the
three read-only endpoints it needs that the rest of the API does not give.

The console is a static page that calls the REST API with the user's token, so every
datum it shows passes the same permission checks as any client's request; its files
are open. The endpoints added for it:

- ``GET /v1/whoami`` (open): who the request's token belongs to, if anyone, so the
  page can ask for a token, and hide what the principal may not do (the server
  refuses it anyway);
- ``GET /v1/transactions/details``: the transaction state with each open
  transaction's producer, epoch and age, and every registered transactional id;
- ``GET .../topics/{topic}/messages?before=``: the page of messages *before* a
  position, which a poll (forward only) cannot give: the message browser's "back" and
  "latest".
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidings.codec import wire
from tidings.errors import BadRequest, Unauthorized
from tidings.messaging import MessagingService
from tidings.names import check_name
from tidings.server.handlers import Api, Endpoint, json_response
from tidings.server.routes.consumers import read_snapshot
from tidings.server.routes.messaging import COUNT_HEADER, TOPIC, _read_committed
from tidings.structs import Message, MessageId, Transaction
from tidings.tx.manager import TransactionDetails

__all__ = [
    "CONSOLE",
    "DETAILS",
    "MESSAGES",
    "STATIC_FILES",
    "WHOAMI",
    "details_json",
    "page_before",
    "routes",
]

CONSOLE = "/console/"
WHOAMI = "/v1/whoami"
DETAILS = "/v1/transactions/details"
MESSAGES = TOPIC + "/messages"

#: URL path -> (file in tidings/console/static, Content-Type). A fixed list rather than
#: a directory mount: nothing else under /console/ can be asked for.
STATIC_FILES: Mapping[str, tuple[str, str]] = {
    CONSOLE: ("index.html", "text/html; charset=utf-8"),
    CONSOLE + "console.js": ("console.js", "text/javascript; charset=utf-8"),
    CONSOLE + "console.css": ("console.css", "text/css; charset=utf-8"),
}

#: The console's scripts come from this server only; no inline script, no other origin.
_STATIC_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; "
        "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Small files, read once per visit: always revalidate, so an upgrade shows at once.
    "Cache-Control": "no-cache",
}

DEFAULT_PAGE = 20
INT32_MAX = 2**31 - 1
_HEX_ID = re.compile(r"[0-9a-fA-F]{40}")
#: Ids one window of page_before may scan before it narrows the window instead.
_SCAN_CAP = 20_000
#: The first window before a position (ms), and how much each empty one widens it.
_FIRST_SPAN_MS = 1_000
_WIDEN = 16


def _static(name: str) -> bytes:
    return resources.files("tidings.console").joinpath("static", name).read_bytes()


def _file_endpoint(body: bytes, media: str) -> Endpoint:
    async def serve(request: Request) -> Response:
        return Response(body, media_type=media, headers=_STATIC_HEADERS)

    return serve


def routes(api: Api) -> list[Route]:
    """The console's files and its three read-only endpoints."""
    max_limit = api.config.fetch_max_limit
    default_timeout_ms = round(api.config.tx_default_timeout * 1000)
    out: list[Route] = []

    for path, (name, media) in STATIC_FILES.items():
        # Read once: a file missing from the install stops the start, not a request.
        endpoint = api.endpoint(path)(_file_endpoint(_static(name), media))
        out.append(Route(path, endpoint, methods=["GET"]))

    @api.endpoint(WHOAMI)
    async def whoami(request: Request) -> Response:
        # Open, so the console learns that it needs a token without a 401 (which a
        # browser reports as an error): it authenticates the token itself.
        if api.auth is None:  # no auth file: everyone may do everything
            return json_response(
                {
                    "auth": False,
                    "name": None,
                    "admin": True,
                    "publish": ["*"],
                    "consume": ["*"],
                    "groups": None,
                    "queues": None,
                }
            )
        try:
            principal = api.auth.authenticate(request.headers.get("authorization"))
        except Unauthorized:
            return json_response(
                {
                    "auth": True,
                    "name": None,
                    "admin": False,
                    "publish": [],
                    "consume": [],
                    "groups": [],
                    "queues": [],
                }
            )
        return json_response(
            {
                "auth": True,
                "name": principal.name,
                "admin": principal.admin,
                "publish": list(principal.publish),
                "consume": list(principal.consume),
                # null: the auth file leaves the field out, so every group (queue) of
                # the topics it may consume is the principal's.
                "groups": None if principal.groups is None else list(principal.groups),
                "queues": None if principal.queues is None else list(principal.queues),
            }
        )

    @api.endpoint(DETAILS)
    async def details(request: Request) -> Response:
        tx = api.tx
        found = await api.blocking(tx.details)
        return json_response(details_json(found, default_timeout_ms))

    @api.endpoint(MESSAGES)
    async def messages(request: Request) -> Response:
        messaging = api.messaging
        params = request.path_params
        ns, topic = check_name(params["ns"], "namespace"), check_name(params["topic"], "topic")
        before = _before(request.query_params.get("before"))
        limit = _limit(request.query_params.get("limit"), max_limit)
        snapshot: Transaction | None = None
        if _read_committed(request):
            _ = api.tx  # 503 where this process runs no transaction service
            snapshot = await read_snapshot(api)
        found = await api.blocking(page_before, messaging, ns, topic, before, limit, snapshot)
        return Response(
            wire.encode_messages(found, wire.JSON),
            media_type=wire.JSON.value,
            headers={COUNT_HEADER: str(len(found))},
        )

    out += [
        Route(WHOAMI, whoami, methods=["GET"]),
        Route(DETAILS, details, methods=["GET"]),
        Route(MESSAGES, messages, methods=["GET"]),
    ]
    return out


def details_json(found: TransactionDetails, default_timeout_ms: int) -> dict[str, object]:
    """``GET /v1/transactions/details``: ages and timeouts in ms, times in ms since the
    epoch (``beganAt`` and ``timeoutMs`` null for a transaction begun before this
    process started)."""
    state = found.state
    return {
        "now": found.now,
        "readPointer": state.read_pointer,
        "lastWritePointer": state.last_write_pointer,
        "defaultTimeoutMs": default_timeout_ms,
        "inProgress": [
            {
                "writePointer": t.write_pointer,
                "beganAt": t.began_at,
                "expiresAt": t.expires_at,
                "timeoutMs": None if t.began_at is None else t.expires_at - t.began_at,
                "transactionalId": None if t.producer is None else t.producer.transactional_id,
                "producerId": None if t.producer is None else t.producer.producer_id,
                "epoch": None if t.producer is None else t.producer.epoch,
            }
            for t in found.open
        ],
        "invalid": list(state.invalid),
        "producers": [
            {"transactionalId": p.transactional_id, "producerId": p.producer_id, "epoch": p.epoch}
            for p in found.producers
        ],
    }


def _before(raw: str | None) -> MessageId | None:
    if raw is None:
        return None
    if not _HEX_ID.fullmatch(raw):
        raise BadRequest(f"before must be a message id of 40 hex digits, got {raw[:64]!r}")
    return MessageId.from_bytes(bytes.fromhex(raw))


def _limit(raw: str | None, cap: int) -> int:
    """The page size: 1 or more, clamped to the server's fetch maximum (as a poll's)."""
    if raw is None:
        return min(DEFAULT_PAGE, cap)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not 1 <= int(raw) <= INT32_MAX:
        raise BadRequest(f"limit must be an integer from 1 to {INT32_MAX}, got {raw[:64]!r}")
    return min(int(raw), cap)


@dataclass
class _Window:
    """The ids one scan found below the bound (the last ``limit`` of them)."""

    ids: deque[MessageId]
    #: Stopped at the scan cap before reaching the bound.
    overflowed: bool


def page_before(
    messaging: MessagingService,
    namespace: str,
    topic: str,
    before: MessageId | None,
    limit: int,
    snapshot: Transaction | None,
) -> list[Message]:
    """The last ``limit`` messages before ``before`` (exclusive; None: the end of the
    topic), oldest first, as a poll from an earlier position would return them
    (``snapshot``: read-committed, else everything).

    The store reads forward only, and ids begin with their publish time: so this scans
    a time window just below the bound, widening it while it holds too few messages
    and narrowing it (bisecting) when it holds so many that the scan would be long.
    """
    oldest = messaging.fetch_ids(namespace, topic, limit=1)
    if not oldest:
        return []
    if before is None:
        newest = messaging.end(namespace, topic, None).newest_id
        if newest is None:
            return []
        top, inclusive_top = newest, True
    else:
        top, inclusive_top = before, False
    floor = oldest[0].publish_ts
    page = min(max(limit, 1_000), messaging.config.fetch_max_limit)

    def scan(start_ts: int, cap: int | None) -> _Window:
        ids: deque[MessageId] = deque(maxlen=limit)
        seen = 0
        start: MessageId | int = start_ts
        inclusive = True
        while True:
            batch = messaging.fetch_ids(
                namespace, topic, start=start, inclusive=inclusive, limit=page, transaction=snapshot
            )
            for found in batch:
                if found > top or (found == top and not inclusive_top):
                    return _Window(ids, False)
                ids.append(found)
            seen += len(batch)
            if len(batch) < page:
                return _Window(ids, False)
            if cap is not None and seen >= cap:
                return _Window(ids, True)
            start, inclusive = batch[-1], False

    too_few, too_many = 0, 0  # spans (ms) known to hold too few / too many (0: none yet)
    span = _FIRST_SPAN_MS
    while True:
        # Once the two bounds meet, the wider window is scanned to its end, however long.
        exhaustive = too_many > 0 and too_many - too_few <= 1
        if exhaustive:
            span = too_many
        start_ts = max(top.publish_ts - span, 0)
        window = scan(start_ts, None if exhaustive else _SCAN_CAP)
        if window.overflowed:
            too_many = span
            span = (too_few + span) // 2
            continue
        if exhaustive or len(window.ids) >= limit or start_ts <= floor:
            break
        too_few = span
        span = (span + too_many) // 2 if too_many else span * _WIDEN
    if not window.ids:
        return []
    return _newest(messaging, namespace, topic, window.ids[0], top, inclusive_top, snapshot)


def _newest(
    messaging: MessagingService,
    namespace: str,
    topic: str,
    first: MessageId,
    top: MessageId,
    inclusive_top: bool,
    snapshot: Transaction | None,
) -> list[Message]:
    """The messages from ``first`` up to ``top``, the newest of them whose payloads and
    keys stay within the server's ``fetch_max_bytes`` (one at least): a page of large
    messages shows the newest, and the older ones come on the page before it. Read
    page by page, each bounded, so no more than about twice the bound is held."""
    bound = messaging.max_bytes(None)
    found: deque[Message] = deque()
    held = 0
    start, inclusive = first, True
    while True:
        page = messaging.fetch(
            namespace, topic, start=start, inclusive=inclusive, transaction=snapshot
        )
        if not page:
            return list(found)
        for message in page:
            if message.id > top or (message.id == top and not inclusive_top):
                return list(found)
            found.append(message)
            held += len(message.payload) + len(message.key or b"")
            while held > bound and len(found) > 1:
                oldest = found.popleft()
                held -= len(oldest.payload) + len(oldest.key or b"")
        start, inclusive = page[-1].id, False
        if start == top:
            return list(found)

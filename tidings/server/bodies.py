"""Reading request bodies: the size limit (413), the media type (415), JSON objects (400).

Message bodies themselves are decoded by :mod:`tidings.codec.wire`; this module only
gets the bytes in safely and parses the small JSON bodies of the admin endpoints (whose
fields :mod:`tidings.codec.admin` reads).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from tidings.codec import json_bodies
from tidings.codec.wire import Media, media_for
from tidings.errors import PayloadTooLarge, UnsupportedMediaType

__all__ = ["json_object", "read_body", "request_media", "require_json"]


def request_media(request: Request) -> Media:
    """The medium of the request's Content-Type (none means JSON); 415 otherwise."""
    return media_for(request.headers.get("content-type"))


def require_json(request: Request) -> None:
    """Admin and transaction endpoints speak JSON only."""
    if media_for(request.headers.get("content-type")) is not Media.JSON:
        raise UnsupportedMediaType("this endpoint accepts application/json only")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or :class:`PayloadTooLarge` as soon as it exceeds ``limit`` bytes.

    A declared Content-Length above the limit is refused before anything is read.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the maximum of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds the maximum of {limit} bytes")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """A JSON object body; an empty (or blank) body is ``{}``."""
    return json_bodies.obj(body if body.strip() else b"", what)

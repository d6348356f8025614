"""Reading request bodies: the size limit (413), the media type (415), JSON objects (400).

Message bodies themselves are decoded by :mod:`tidings.codec.wire`; this module only
gets the bytes in safely and parses the small JSON bodies of the admin endpoints (whose
fields :mod:`tidings.codec.admin` reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request

from tidings.codec.wire import Media, b64decode, media_for
from tidings.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from tidings.names import INT64_MAX, INT64_MIN

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
    """A JSON object body; an empty body is ``{}``."""
    if not body.strip():
        return {}
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest(f"malformed JSON {what}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the {what} must be a JSON object")
    return value


def opt_int(
    obj: Mapping[str, Any], field: str, lo: int = INT64_MIN, hi: int = INT64_MAX
) -> int | None:
    """An optional integer field in ``[lo, hi]`` (booleans are not integers)."""
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{field} must be an integer in [{lo}, {hi}]")
    return value


def opt_str(obj: Mapping[str, Any], field: str) -> str | None:
    """An optional non-empty string field."""
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{field} must be a non-empty string")
    return value


def opt_number(obj: Mapping[str, Any], field: str) -> float | None:
    """An optional finite number field."""
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadRequest(f"{field} must be a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise BadRequest(f"{field} must be a finite number")
    return float(value)


def base64_list(obj: Mapping[str, Any], field: str) -> list[bytes]:
    """An optional list of base64 strings (empty when absent)."""
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{field} must be a list of base64 strings")
    return [b64decode(item, f"{field}[{i}]") for i, item in enumerate(value)]


def int_list(obj: Mapping[str, Any], field: str, lo: int = 1, hi: int = INT64_MAX) -> list[int]:
    """An optional list of integers in ``[lo, hi]`` (empty when absent)."""
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi for v in value
    ):
        raise BadRequest(f"{field} must be a list of integers in [{lo}, {hi}]")
    return value

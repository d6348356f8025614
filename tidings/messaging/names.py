"""Validation of topic properties (names are :func:`tidings.names.check_name`).

Pure functions; each raises the :mod:`tidings.errors` class the REST API maps to 400
(invariant 5 of docs/design.md: bad input gets a clear error and changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from tidings.codec.json_bodies import whole
from tidings.errors import InvalidProperties
from tidings.names import MAX_TTL

__all__ = ["MAX_TTL", "TTL_PROPERTY", "normalize_properties", "parse_ttl"]

TTL_PROPERTY = "ttl"


def parse_ttl(value: object) -> int:
    """A ttl in seconds: a positive int, or a string of digits (CDAP TMS clients send both)."""
    if isinstance(value, bool):
        raise InvalidProperties(f"ttl must be a positive integer number of seconds, got {value!r}")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        ttl = int(value)
    elif isinstance(value, int):
        ttl = value
    else:
        raise InvalidProperties(f"ttl must be a positive integer number of seconds, got {value!r}")
    if not 0 < ttl <= MAX_TTL:
        raise InvalidProperties(f"ttl must be between 1 and {MAX_TTL} seconds, got {ttl}")
    return ttl


def normalize_properties(
    properties: Mapping[str, object] | None, default_ttl: int
) -> tuple[int, dict[str, str]]:
    """Validate topic properties; return ``(ttl, properties as str -> str)``.

    ``ttl`` is always present in the result (the default when absent), so a topic's
    properties say which retention applies even if the configured default changes later
    (CDAP stores it the same way). Other keys are kept as strings; their values must be
    strings or integers.
    """
    if properties is None:
        properties = {}
    if not isinstance(properties, Mapping):
        raise InvalidProperties(f"properties must be an object, got {type(properties).__name__}")
    result: dict[str, str] = {}
    # JSON has one number type: 3600.0 is the integer 3600 (as JSON Schema counts it).
    properties = {key: whole(value) for key, value in properties.items()}
    for key, value in properties.items():
        if not isinstance(key, str) or not key:
            raise InvalidProperties(f"property names must be non-empty strings, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidProperties(
                f"property {key!r} must be a string or an integer, got {type(value).__name__}"
            )
        result[key] = str(value)
    ttl = parse_ttl(properties[TTL_PROPERTY]) if TTL_PROPERTY in properties else default_ttl
    result[TTL_PROPERTY] = str(ttl)
    return ttl, result

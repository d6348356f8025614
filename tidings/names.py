"""Names and limits every layer shares (server, client, CLI, Spark): one home for each.

Pure values and one check; importing this loads nothing but :mod:`tidings.errors`.
"""

from __future__ import annotations

import re

from tidings.errors import InvalidName

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_TTL",
    "NAME_PATTERN",
    "check_name",
]

#: Where ``tidings serve`` listens by default, and where clients look without a URL.
DEFAULT_PORT = 8470
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"

#: Signed 64-bit bounds: write pointers, timestamps in ms, and the Avro ``long``.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: The largest topic ttl (seconds) whose milliseconds still fit in a signed 64-bit integer.
MAX_TTL = INT64_MAX // 1000

#: Namespace and topic names (also consumer group names): 1-128 of ``[A-Za-z0-9_-]``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def check_name(name: object, what: str = "topic") -> str:
    """``name`` if it is 1-128 characters of ``[A-Za-z0-9_-]``, else :class:`InvalidName`.

    ``what`` names the kind of name in the message ("topic", "namespace", "group").
    The client checks before sending too: an invalid name would otherwise change the
    URL's path and come back as an unknown path instead of the server's error.
    """
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise InvalidName(f"{what} name must be 1-128 characters of [A-Za-z0-9_-], got {name!r}")
    return name

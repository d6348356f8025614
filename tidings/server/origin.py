"""Refusing cross-site requests: a browser's write whose ``Origin`` is another site's.

Any page a developer opens can make their browser send a request to the server on
127.0.0.1, and a "simple" one (a POST of a body without a content type, a form's
POST) needs no CORS preflight: the browser sends it and only hides the answer from
the page. The server has no CORS support, so no page of another origin has a
legitimate reason to write to it. Browsers name the page's origin in the ``Origin``
header of every request but GET and HEAD, and a page cannot remove or change it;
other clients (the Python clients, curl, Spark) send none. So a request that changes
something and carries an ``Origin`` naming another origin than the request's own
(compared with its ``Host``) is refused with 403, unless ``allowed_origins`` names it.
Reads stay open: the browser's same-origin policy keeps their answers from the page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tidings.errors import Forbidden

__all__ = [
    "SAFE_METHODS",
    "allowed_set",
    "check_origin",
    "check_request",
    "normalize_origin",
    "refused_origin",
]

#: Methods that change nothing here, so need no check (OPTIONS is not routed at all).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def normalize_origin(origin: str) -> str:
    """``origin`` as a browser writes it in ``Origin`` (``scheme://host[:port]``,
    lower-case, without a default port); ``ValueError`` when it is not one."""
    text = origin.strip().lower().removesuffix("/")
    scheme, sep, authority = text.partition("://")
    if (
        not sep
        or scheme not in _DEFAULT_PORTS
        or not authority
        or any(c in authority for c in "/?#@*, ")
    ):
        raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
    return scheme + "://" + authority.removesuffix(_DEFAULT_PORTS[scheme])


def refused_origin(origin: str, host: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request carrying ``Origin: origin`` and ``Host: host`` comes from
    another origin than its own, and one ``allowed`` (normalized) does not name.

    Called only where the header is present: browsers' requests, never the clients'."""
    scheme, sep, authority = origin.partition("://")
    if sep and host is not None:
        if authority == host or authority.lower() == host.lower():
            return False
        # A Host header may name the scheme's default port that Origin leaves out.
        default = _DEFAULT_PORTS.get(scheme.lower())
        if default is not None and host.lower().removesuffix(default) == authority.lower():
            return False
    # "null" (a sandboxed frame, a file:// page, a redirect across sites) is nobody's
    # origin: configuration cannot allow it, so it is always refused here.
    return origin.lower() not in allowed


def check_origin(origin: str, host: str | None, allowed: frozenset[str]) -> None:
    """Raise :class:`~tidings.errors.Forbidden` when :func:`refused_origin` says so."""
    if refused_origin(origin, host, allowed):
        raise Forbidden(
            f"cross-origin request refused: Origin {origin} is not this server's own "
            f"(Host {host}) nor one of allowed_origins (docs/security.md)"
        )


def allowed_set(origins: Iterable[str]) -> frozenset[str]:
    """The configured origins as :func:`refused_origin` compares them."""
    return frozenset(normalize_origin(o) for o in origins)


def check_request(
    method: str, headers: Sequence[tuple[bytes, bytes]], allowed: frozenset[str]
) -> None:
    """:func:`check_origin` for a request's method and raw ASGI headers (names lower
    case). Clients send no ``Origin``: for them this is one pass over the header names,
    without Starlette's lower-casing and encoding, and ``Host`` is looked for only
    where ``Origin`` is present."""
    if method in SAFE_METHODS:
        return
    for name, value in headers:
        if name == b"origin":
            host = next((v for n, v in headers if n == b"host"), None)
            named = None if host is None else host.decode("latin-1")
            check_origin(value.decode("latin-1"), named, allowed)
            return

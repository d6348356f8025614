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

That policy is what DNS rebinding gets around: a page of ``evil.example`` has its name
resolve to 127.0.0.1, and its requests to ``http://evil.example:8470`` then reach the
server as the page's own origin, reads and writes alike. What gives them away is the
``Host`` header, which names the page's host. So a server on a loopback address answers
only ``Host`` values that are loopback names or addresses, plus ``allowed_hosts``
(:class:`HostAllowlist`); one on another address answers any unless ``allowed_hosts``
is set. A refused ``Host`` gets 400, before anything else is looked at.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from tidings.errors import BadRequest, Forbidden

__all__ = [
    "LOOPBACK_HOSTS",
    "SAFE_METHODS",
    "HostAllowlist",
    "allowed_set",
    "check_origin",
    "check_request",
    "host_allowlist",
    "is_loopback",
    "normalize_host",
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


#: The ``Host`` names a server on a loopback address always answers (any port).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: The most ``Host`` values whose verdict is remembered: a client sending a new one on
#: every request must not grow the server's memory.
_REMEMBERED = 1024


def is_loopback(host: str) -> bool:
    """Whether the listening address ``host`` is a loopback one (``localhost`` too)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def normalize_host(host: str) -> str:
    """``host`` as :class:`HostAllowlist` compares it: lower case, an IPv6 address in
    brackets, without a trailing dot; ``"*"`` stays. ``ValueError`` for anything else,
    a port included (every port of a listed name is answered)."""
    text = host.strip().lower()
    if text == "*":
        return text
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if ":" in inner:
        try:
            return f"[{ipaddress.IPv6Address(inner).compressed}]"
        except ValueError:
            raise ValueError(f"not a host name or address (without a port): {host!r}") from None
    name = text.removesuffix(".")
    if (
        not name
        or len(name) > 253
        or not all(c.isascii() and (c.isalnum() or c in "-._") for c in name)
        or any(not label for label in name.split("."))
    ):
        raise ValueError(f"not a host name or address (without a port): {host!r}")
    return name


class HostAllowlist:
    """The ``Host`` header values a server answers to (the module's docstring says
    why): the names listed, every port of each, and with ``loopback`` any loopback
    address. Verdicts are remembered per raw header value, so a request costs one
    dictionary lookup once its ``Host`` has been seen."""

    def __init__(self, names: Iterable[str], *, loopback: bool) -> None:
        self.names = frozenset(names)
        self.loopback = loopback
        self._seen: dict[bytes, bool] = {}

    def allows(self, host: bytes) -> bool:
        """Whether ``host`` (a raw ``Host`` header value) is answered."""
        verdict = self._seen.get(host)
        if verdict is None:
            verdict = self._judge(host.decode("latin-1"))
            if len(self._seen) < _REMEMBERED:
                self._seen[host] = verdict
        return verdict

    def check(self, host: bytes) -> None:
        """:class:`~tidings.errors.BadRequest` unless :meth:`allows` ``host``."""
        if not self.allows(host):
            shown = host.decode("latin-1")[:200]
            raise BadRequest(
                f"Host {shown!r} is not a name this server answers to; list it in "
                "allowed_hosts if clients reach the server by it (docs/security.md)"
            )

    def _judge(self, host: str) -> bool:
        text = host.strip().lower()
        if text.startswith("["):
            end = text.find("]") + 1
            name, port = text[:end], text[end:]
            if not end:
                return False
        else:
            name, sep, rest = text.partition(":")
            port = sep + rest
        digits = port[1:]
        if port and (port[0] != ":" or not ((digits.isascii() and digits.isdigit()) or not digits)):
            return False
        name = name.removesuffix(".")
        if name in self.names:
            return True
        if not self.loopback:
            return False
        try:
            return ipaddress.ip_address(name.strip("[]")).is_loopback
        except ValueError:
            return False


def host_allowlist(
    listen: str, allowed: Iterable[str], advertise_url: str | None = None
) -> HostAllowlist | None:
    """The ``Host`` check of a server listening on ``listen`` with ``allowed_hosts``
    ``allowed``; None where every ``Host`` is answered (another address than a loopback
    one and no ``allowed_hosts``, or ``"*"`` among them).

    The server's own address (``listen``, and ``advertise_url``'s host, by which the
    other instances forward to it) is always answered: the instances on one store reach
    each other by these."""
    names = {normalize_host(name) for name in allowed}
    loopback = is_loopback(listen)
    if "*" in names or not (names or loopback):
        return None
    if loopback:
        names |= LOOPBACK_HOSTS
    own = [listen]
    if advertise_url:
        own.append(urlsplit(advertise_url).hostname or "")
    for address in own:
        # An address is never what a rebinding page names (it needs a name of its own
        # to point at this server), so answering its own ones opens nothing.
        try:
            names.add(normalize_host(address))
        except ValueError:
            continue
    return HostAllowlist(names, loopback=loopback)


def check_request(
    method: str,
    headers: Sequence[tuple[bytes, bytes]],
    allowed: frozenset[str],
    hosts: HostAllowlist | None = None,
) -> None:
    """The ``Host`` check (``hosts``; None: every ``Host`` is answered), then
    :func:`check_origin`, for a request's method and raw ASGI headers (names lower
    case). One pass over the header names, without Starlette's lower-casing and
    decoding: for a read it stops at ``Host`` (which clients send first); without
    ``hosts``, reads are not scanned at all, and ``Host`` is looked for only where
    ``Origin`` is present."""
    if hosts is None:
        if method in SAFE_METHODS:
            return
        for name, value in headers:
            if name == b"origin":
                host = next((v for n, v in headers if n == b"host"), None)
                named = None if host is None else host.decode("latin-1")
                check_origin(value.decode("latin-1"), named, allowed)
                return
        return
    safe = method in SAFE_METHODS
    host = origin = None
    for name, value in headers:
        if name == b"host":
            if host is None:
                host = value
            if safe or origin is not None:
                break
        elif name == b"origin" and not safe:
            origin = value
            if host is not None:
                break
    # No Host at all (HTTP/1.0) is no browser's request: browsers always send one.
    if host is not None:
        hosts.check(host)
    if origin is not None:
        named = None if host is None else host.decode("latin-1")
        check_origin(origin.decode("latin-1"), named, allowed)

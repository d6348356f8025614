"""Bearer tokens and principals (docs/security.md).

The auth file (``auth_file``) is TOML, one ``[[principal]]`` table each::

    [[principal]]
    name = "billing"
    token_sha256 = "<hex sha-256 of the bearer token>"
    admin = false
    publish = ["billing-*"]             # topic patterns, fnmatch-style
    consume = ["orders", "billing-*"]
    transactional_ids = ["billing-*"]
    groups = ["billing-*"]              # optional: consumer groups (absent: all)
    queues = ["billing-*"]              # optional: queues (absent: all)

Only the tokens' hashes are kept. A request's token is hashed and compared with every
principal's hash in constant time (``hmac.compare_digest``), so the answer's timing
says nothing about how close a guess came. ``reload()`` (SIGHUP) reads the file again;
a file that does not load leaves the principals as they were.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import secrets
import threading
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tidings.errors import ConfigError, Forbidden, Unauthorized

__all__ = ["Authenticator", "Principal", "load_principals", "new_token"]

_log = logging.getLogger("tidings.server")
_FIELDS = {
    "name",
    "token_sha256",
    "admin",
    "publish",
    "consume",
    "transactional_ids",
    "groups",
    "queues",
}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token belongs to and what it may do. ``admin`` may do everything."""

    name: str
    token_sha256: bytes
    admin: bool = False
    publish: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    transactional_ids: tuple[str, ...] = ()
    #: Consumer group and queue name patterns; None (the field left out of the file)
    #: is every group or queue of the topics the principal may consume, which is what
    #: an auth file written before these fields existed meant.
    groups: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None

    def may_publish(self, topic: str) -> bool:
        return self.admin or _matches(topic, self.publish)

    def may_consume(self, topic: str) -> bool:
        return self.admin or _matches(topic, self.consume)

    def may_use(self, transactional_id: str) -> bool:
        return self.admin or _matches(transactional_id, self.transactional_ids)

    def may_use_group(self, group: str) -> bool:
        """The group's name is granted (``consume`` on its topic is checked apart)."""
        return self.admin or self.groups is None or _matches(group, self.groups)

    def may_use_queue(self, queue: str) -> bool:
        """The queue's name is granted (``consume`` on its topic is checked apart)."""
        return self.admin or self.queues is None or _matches(queue, self.queues)

    def require_publish(self, topic: str) -> None:
        if not self.may_publish(topic):
            raise Forbidden(f"principal {self.name} may not publish to topic {topic}")

    def require_consume(self, topic: str) -> None:
        if not self.may_consume(topic):
            raise Forbidden(f"principal {self.name} may not consume topic {topic}")

    def require_group(self, topic: str, group: str) -> None:
        """Kafka's group ACL: the topic to read and the group to read it as."""
        self.require_consume(topic)
        if not self.may_use_group(group):
            raise Forbidden(f"principal {self.name} may not use consumer group {group!r}")

    def require_queue(self, topic: str, queue: str) -> None:
        self.require_consume(topic)
        if not self.may_use_queue(queue):
            raise Forbidden(f"principal {self.name} may not use queue {queue!r}")

    def require_transactional_id(self, transactional_id: str | None) -> None:
        if transactional_id is not None and not self.may_use(transactional_id):
            raise Forbidden(
                f"principal {self.name} may not use transactional id {transactional_id!r}"
            )

    def require_admin(self) -> None:
        if not self.admin:
            raise Forbidden(f"principal {self.name} is not an admin")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    # fnmatchcase: "Orders" is not "orders" on any platform.
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def new_token() -> tuple[str, str]:
    """A new random bearer token and the hex sha-256 the auth file keeps of it."""
    token = secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode()).hexdigest()


def load_principals(path: Path) -> tuple[Principal, ...]:
    """The principals of an auth file; :class:`ConfigError` saying what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read auth file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"auth file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - {"principal"})
    if unknown:
        raise ConfigError(f"auth file {path}: unknown keys {', '.join(unknown)}")
    tables = raw.get("principal", [])
    if not isinstance(tables, list):
        raise ConfigError(f"auth file {path}: principal must be an array of tables")
    out: list[Principal] = []
    for i, table in enumerate(tables):
        where = f"auth file {path}, principal {i + 1}"
        extra = sorted(set(table) - _FIELDS)
        if extra:
            raise ConfigError(f"{where}: unknown keys {', '.join(extra)}")
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: name must be a non-empty string")
        digest = table.get("token_sha256")
        try:
            token_hash = bytes.fromhex(digest) if isinstance(digest, str) else b""
        except ValueError:
            token_hash = b""
        if len(token_hash) != 32:
            raise ConfigError(f"{where} ({name}): token_sha256 must be 64 hex digits")
        admin = table.get("admin", False)
        if not isinstance(admin, bool):
            raise ConfigError(f"{where} ({name}): admin must be true or false")
        lists = {}
        for key in ("publish", "consume", "transactional_ids"):
            value = table.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where} ({name}): {key} must be a list of patterns")
            lists[key] = tuple(value)
        names_of: dict[str, tuple[str, ...] | None] = {}
        for key in ("groups", "queues"):
            # Left out: every name (the file's meaning before the field existed);
            # an empty list: none.
            value = table.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise ConfigError(f"{where} ({name}): {key} must be a list of patterns")
            names_of[key] = None if value is None else tuple(value)
        out.append(
            Principal(
                name,
                token_hash,
                admin,
                **lists,
                groups=names_of["groups"],
                queues=names_of["queues"],
            )
        )
    names = [p.name for p in out]
    hashes = [p.token_sha256 for p in out]
    if len(set(names)) != len(names) or len(set(hashes)) != len(hashes):
        raise ConfigError(f"auth file {path}: names and tokens must be distinct")
    return tuple(out)


class Authenticator:
    """The principals of an auth file, and the check of a request's bearer token."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._principals = load_principals(path)
        self._lock = threading.Lock()

    @property
    def principals(self) -> tuple[Principal, ...]:
        return self._principals

    def reload(self) -> bool:
        """Read the file again (SIGHUP); on any problem keep the principals and log it.
        True if the new ones are in force."""
        # One reload at a time, from reading the file to putting it in force: each
        # SIGHUP reloads on a worker thread of its own, and a reload that read the file
        # before the operator's last change (a revoked token, say) must not finish
        # after the one that read it since.
        with self._lock:
            try:
                principals = load_principals(self.path)
            except ConfigError as exc:
                _log.error(f"auth file not reloaded: {exc.message}", extra={"event": "auth"})
                return False
            self._principals = principals
        _log.info(
            f"auth file reloaded: {len(principals)} principal(s)",
            extra={"event": "auth", "principals": [p.name for p in principals]},
        )
        return True

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer`` header; :class:`Unauthorized`
        without one, or for a token nobody has."""
        if authorization is None:
            raise Unauthorized("this server needs a bearer token (Authorization: Bearer ...)")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be Bearer <token>")
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for principal in self._principals:
            # Every hash is compared, match or not: the time taken does not depend on
            # where (or whether) the token is found.
            if hmac.compare_digest(digest, principal.token_sha256):
                found = principal
        if found is None:
            raise Unauthorized("unknown bearer token")
        return found

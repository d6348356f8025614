"""The server's settings and where they come from: flags > ``TIDINGS_*`` > TOML > defaults.

:class:`ServerConfig` is the one table: each field is declared once, with its type (the
annotation), default, bounds, whether ``tidings serve`` has a flag for it and what it
does. From it come the TOML key (the name), the environment variable (``TIDINGS_`` + the
name upper-cased), the flag (``--`` + the name dashed), each overridable in the field's
metadata, the checks, and docs/configuration.md's table (:func:`settings_table`; a test
keeps the two equal). A new setting is one new field.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from tidings.errors import ConfigError
from tidings.messaging.names import MAX_TTL
from tidings.server.origin import normalize_host, normalize_origin
from tidings.tx.config import MAX_TIMEOUT_LIMIT

__all__ = [
    "ROLES",
    "SETTINGS",
    "ConfigError",
    "ServerConfig",
    "Setting",
    "load_config",
    "example_toml",
    "settings_table",
]

Role = Literal["all", "messaging", "transactions"]
ROLES: tuple[Role, ...] = ("all", "messaging", "transactions")

ENV_PREFIX = "TIDINGS_"
#: The ``tidings serve`` flag that names the TOML file.
CONFIG_FLAG = "--config"
#: Names the TOML file when :data:`CONFIG_FLAG` is not given.
CONFIG_ENV = "TIDINGS_CONFIG"

#: Kinds of value: how a string from the environment (or a TOML value) is read.
Kind = Literal["str", "int", "float", "bool", "bytes", "path", "role", "level", "origins", "hosts"]
#: Lower bound a number must keep: above zero, or at least zero.
Bound = Literal["positive", "non-negative"]


def _setting(
    default: Any,
    what: str,
    *,
    kind: Kind | None = None,
    flag: bool | str = False,
    env: str | None = None,
    key: str | None = None,
    bound: Bound | None = None,
    shown: str | None = None,
) -> Any:
    """A :class:`ServerConfig` field with what the rest of the table is made from.

    ``kind`` defaults to the one the field's annotation implies; ``bytes`` and
    ``level`` must be named because ``int`` and ``str`` alone do not say how to read
    them. ``flag=True`` gives the derived ``--dashed-name`` flag, a string names the
    flag itself; ``env`` and ``key`` replace the derived ``TIDINGS_NAME`` variable and
    TOML key, for a setting whose public name cannot be its field name. ``shown`` is
    the default as docs/configuration.md writes it (else ``str(default)``).
    """
    meta = {
        "kind": kind,
        "what": what,
        "flag": flag,
        "env": env,
        "key": key,
        "bound": bound,
        "shown": shown,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``tidings serve`` needs to know (docs/configuration.md)."""

    host: str = _setting("127.0.0.1", "interface to listen on (`0.0.0.0` for all)", flag=True)
    port: int = _setting(
        8470, "TCP port (`0`: any free port; the start log line says which)", flag=True
    )
    data_dir: Path = _setting(
        Path("./tidings-data"),
        "the store lives in `<data_dir>/store`, the transaction log in `<data_dir>/tx`",
        flag=True,
        shown="./tidings-data",
    )
    role: Role = _setting(
        "all",
        "`all`, `messaging` or `transactions`: which services this process runs; the "
        "others answer 503",
        flag=True,
    )
    # HTTP
    max_body_bytes: int = _setting(
        64 << 20,
        "largest request body; larger is 413",
        kind="bytes",
        bound="positive",
        shown="64MiB",
    )
    max_wait_ms: int = _setting(30_000, "cap on a poll's `waitMs`", bound="positive")
    shutdown_timeout: float = _setting(
        30.0,
        "seconds a SIGTERM waits for in-flight requests before cancelling them",
        bound="non-negative",
        shown="30",
    )
    blocking_threads: int = _setting(
        32,
        "threads for blocking calls (transaction service, topic admin, stats, metrics); "
        "concurrent transaction calls beyond this queue",
        bound="positive",
    )
    # logging
    log_level: str = _setting(
        "info",
        "`debug`, `info`, `warning`, `error`, `critical`; the server's own lines (start, "
        "stop, errors); other components log warnings and errors unless `debug`",
        kind="level",
    )
    access_log: bool = _setting(False, "one log line per request", shown="false")
    # security (docs/security.md)
    auth_file: Path | None = _setting(
        None,
        "TOML file of principals (bearer-token hashes and permissions); unset: every "
        "request is allowed. SIGHUP reloads it",
        flag=True,
        shown="",
    )
    metrics_auth: bool = _setting(
        False, "`/metrics` needs a token too (with `auth_file`)", shown="false"
    )
    tls_cert: Path | None = _setting(
        None,
        "PEM certificate (chain) to serve HTTPS with; needs `tls_key`. SIGHUP reloads both",
        flag=True,
        shown="",
    )
    tls_key: Path | None = _setting(None, "PEM private key of `tls_cert`", flag=True, shown="")
    allowed_origins: tuple[str, ...] = _setting(
        (),
        "origins (`https://host[:port]`; comma-separated in a flag or variable, a list in "
        "TOML) whose browser pages may send requests that change something, besides the "
        "server's own: behind a proxy that rewrites `Host`, or an app of your own on "
        "another origin (docs/security.md)",
        kind="origins",
        flag=True,
        shown="",
    )
    allowed_hosts: tuple[str, ...] = _setting(
        (),
        "host names or addresses (no port; comma-separated in a flag or variable, a list "
        "in TOML) the server answers requests for, by their `Host` header, against DNS "
        "rebinding: on a loopback `host`, these besides `localhost` and the loopback "
        "addresses; on another, only these (unset: any). `*`: any (docs/security.md)",
        kind="hosts",
        flag=True,
        shown="",
    )
    # store
    store: str | None = _setting(
        None,
        "where everything lives: a `postgresql://USER@HOST:PORT/DB` URL (needs "
        "`tidings[postgres]`; the transaction log goes there too, and several instances "
        "may share it: one leads, the others stand by); unset: LMDB and the transaction "
        "log in `data_dir`",
        flag=True,
        shown="",
    )
    lease_seconds: float = _setting(
        5.0,
        "with a PostgreSQL store: how long the leader's lease lasts unrenewed; a standing-by "
        "instance takes over within about this long after the leader dies. Also about how "
        "long a connection to PostgreSQL whose network path was cut goes unnoticed",
        flag=True,
        bound="positive",
        shown="5",
    )
    advertise_url: str | None = _setting(
        None,
        "with a PostgreSQL store: the URL other instances and `GET /v1/cluster` show for "
        "this one (default `http://HOST:PORT`)",
        flag=True,
        shown="",
    )
    pg_readers: int = _setting(
        8,
        "with a PostgreSQL store: most connections this process's read pool opens; "
        "reads beyond it (on the `blocking_threads` workers) wait up to 10 s for one to "
        "be free. Each counts against PostgreSQL's `max_connections`. Ignored on LMDB",
        flag=True,
        bound="positive",
    )
    pg_connect_timeout: float = _setting(
        5.0,
        "with a PostgreSQL store: seconds opening a connection to PostgreSQL may take (the "
        "store's writer and read pool, the leader lease's), in whole seconds, at least 2; "
        "a positive `connect_timeout` in the `store` URL wins. An unreachable database stops a "
        "start with an error after about this long, and at run time a request that needs "
        "a new connection gets a retriable 503 instead of waiting. Also how long the "
        "writer keeps trying to learn whether a commit whose answer was lost committed "
        "(else 500 `OutcomeUnknown`). Ignored on LMDB",
        bound="positive",
        shown="5",
    )
    sync: bool = _setting(
        True,
        "fsync every group commit of the store and of the transaction log. `false`: "
        "acknowledged writes survive a crash of the process but not of the machine",
        shown="true",
    )
    map_size: int = _setting(
        1 << 40,
        "the most the LMDB data file may grow to (address space, not disk)",
        kind="bytes",
        bound="positive",
        shown="1TiB",
    )
    # messaging
    default_ttl: int = _setting(
        7 * 24 * 3600,
        "seconds a message lives when its topic sets no `ttl` (7 days)",
        bound="positive",
    )
    fetch_default_limit: int = _setting(
        1000, "messages a poll returns when it sets no `limit`", bound="positive"
    )
    fetch_max_limit: int = _setting(
        10_000, "most messages one poll returns (larger limits are clamped)", bound="positive"
    )
    fetch_max_bytes: int = _setting(
        16 << 20,
        "most bytes of messages one poll, group poll or pop returns, past the message "
        "that reaches them (larger `maxBytes` are clamped)",
        kind="bytes",
        bound="positive",
        shown="16MiB",
    )
    cleanup_interval: float = _setting(
        60.0,
        "seconds between passes of the cleaner (expired messages, deleted topics)",
        bound="positive",
        shown="60",
    )
    cleanup_batch: int = _setting(
        5000, "rows the cleaner deletes per write transaction", bound="positive"
    )
    producer_expiry: float = _setting(
        7 * 24 * 3600.0,
        "seconds an idempotent producer's last sequence number on a topic is kept after "
        "its last publish (7 days); a later publish starts a new sequence, and a retry "
        "arriving after that is written again: keep it far above any client's retry time",
        bound="positive",
        shown="604800",
    )
    # transactions
    tx_default_timeout: float = _setting(
        30.0,
        "seconds a transaction may stay open when `begin` sets no `timeout`",
        bound="positive",
        shown="30",
    )
    tx_max_timeout: float = _setting(
        3600.0,
        "largest `timeout` a `begin` may ask for (above: 400); at most 100 years",
        bound="positive",
        shown="3600",
    )
    tx_sweep_interval: float = _setting(
        1.0,
        "seconds between sweeps that move timed-out transactions to the invalid list",
        bound="positive",
        shown="1",
    )
    tx_snapshot_every: int = _setting(
        10_000,
        "transaction log records between snapshots (bounds recovery time)",
        bound="positive",
    )
    tx_max_open: int = _setting(
        10_000,
        "most transactions open at once, of every kind (with or without a "
        "`transactionalId`, and one-request transactions while they run); a begin "
        "beyond it is refused with 503 `TooManyTransactions` (retriable) and begins "
        "nothing. A transaction frees its slot when it ends (one past its timeout at "
        "the next sweep)",
        bound="positive",
    )
    tx_history_size: int = _setting(
        100_000,
        "ended transactions remembered, to answer 410 rather than 404 for them",
        bound="non-negative",
    )
    tx_producer_expiry: float = _setting(
        7 * 24 * 3600.0,
        "seconds a transactional id may go unused (no begin or commit) before it is "
        "forgotten (7 days; Kafka's `transactional.id.expiration.ms`); registering it "
        "again then starts afresh",
        bound="positive",
        shown="604800",
    )
    tx_prune_interval: float = _setting(
        3600.0,
        "seconds between passes that drop from the invalid list the pointers no stored "
        "entry names any more (a scan of the Message Table; only with role `all`); `0` "
        "turns it off",
        bound="non-negative",
        shown="3600",
    )

    @property
    def runs_messaging(self) -> bool:
        return self.role in ("all", "messaging")

    @property
    def runs_transactions(self) -> bool:
        return self.role in ("all", "transactions")

    @property
    def store_dir(self) -> Path:
        """Where the embedded (LMDB) store lives."""
        return self.data_dir / "store"

    @property
    def tx_dir(self) -> Path:
        """Where the transaction log and snapshots live."""
        return self.data_dir / "tx"


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the table: a :class:`ServerConfig` field and the names it goes by."""

    name: str
    kind: Kind
    what: str
    default: Any
    shown: str
    #: The TOML key.
    key: str
    #: The environment variable.
    env: str
    #: The ``tidings serve`` flag, if it has one.
    flag: str | None = None
    bound: Bound | None = None


# What each annotation is read as when the field names no kind of its own.
_IMPLIED: dict[object, Kind] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    Path: "path",
    Path | None: "path",
    str | None: "str",
    Role: "role",
}
# The annotation a named kind is stored as.
_STORED_AS: dict[Kind, object] = {
    "bytes": int,
    "level": str,
    "origins": tuple[str, ...],
    "hosts": tuple[str, ...],
}


def _row(f: dataclasses.Field[Any], annotation: object) -> Setting:
    meta = f.metadata
    implied = _IMPLIED.get(annotation)
    kind: Kind | None = meta["kind"] or implied
    if kind is None or not (kind == implied or _STORED_AS.get(kind) == annotation):
        raise TypeError(f"setting {f.name}: kind {kind!r} does not fit {annotation!r}")
    flag: bool | str = meta["flag"]
    if flag is True:
        flag = "--" + f.name.replace("_", "-")
    return Setting(
        name=f.name,
        kind=kind,
        what=meta["what"],
        default=f.default,
        shown=meta["shown"] if meta["shown"] is not None else str(f.default),
        key=meta["key"] or f.name,
        env=meta["env"] or ENV_PREFIX + f.name.upper(),
        flag=flag or None,
        bound=meta["bound"],
    )


def _table() -> tuple[Setting, ...]:
    hints = typing.get_type_hints(ServerConfig)
    rows = tuple(_row(f, hints[f.name]) for f in dataclasses.fields(ServerConfig))
    # An overridden name could shadow another setting's, or the variable naming the
    # TOML file; either would make one of them unreachable without any error.
    for what, names in (
        ("TOML key", [r.key for r in rows]),
        ("environment variable", [r.env for r in rows] + [CONFIG_ENV]),
        ("flag", [r.flag for r in rows if r.flag] + [CONFIG_FLAG]),
    ):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise TypeError(f"settings share the {what} {', '.join(twice)}")
    return rows


#: Every setting, in the order of :class:`ServerConfig`.
SETTINGS: tuple[Setting, ...] = _table()
_BY_NAME = {s.name: s for s in SETTINGS}
_BY_KEY = {s.key: s for s in SETTINGS}


def settings_table() -> str:
    """docs/configuration.md's table of settings, made from :data:`SETTINGS`."""
    lines = [
        "| TOML key | flag | environment | default | what |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        flag = f"`{s.flag}`" if s.flag else "\u2013"  # an en dash: no flag
        shown = f"`{s.shown}`" if s.shown else "not set"
        lines.append(f"| `{s.key}` | {flag} | `{s.env}` | {shown} | {s.what} |")
    return "\n".join(lines) + "\n"


def example_toml() -> str:
    """A reference TOML file: every setting at its default, with what it does (what
    ``tidings config example`` prints; ``--config`` reads it back unchanged)."""
    lines = ["# tidings serve --config FILE: every setting at its default.", ""]
    for s in SETTINGS:
        lines.append(f"# {s.what.replace('`', '')} [{s.env}]")
        value = s.default
        if value is None:
            rendered = '""'  # not set (TOML has no null)
        elif s.kind in ("bytes",):
            rendered = f'"{s.shown}"'
        elif isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, tuple):
            rendered = "[" + ", ".join(_toml_string(v) for v in value) + "]"
        elif isinstance(value, int | float):
            rendered = repr(value)
        else:
            rendered = _toml_string(str(value))
        lines.append(f"{s.key} = {rendered}")
        lines.append("")
    return "\n".join(lines)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_LEVELS = ("debug", "info", "warning", "error", "critical")
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse(setting: Setting, value: object, source: str) -> Any:
    """Convert ``value`` (a string from the environment, or a TOML/flag value)."""
    kind = setting.kind
    where = f"{setting.name} (from {source})"
    if setting.default is None and isinstance(value, str) and not value.strip():
        return None  # an optional setting left empty: not set
    if kind in ("str", "path", "role", "level"):
        if isinstance(value, Path) and kind == "path":
            return value
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
        text = value.strip()
        if kind == "path":
            return Path(text)
        if kind == "role":
            if text not in ROLES:
                raise ConfigError(f"{where} must be one of {', '.join(ROLES)}, got {text!r}")
            return text
        if kind == "level":
            if text.lower() not in _LEVELS:
                raise ConfigError(f"{where} must be one of {', '.join(_LEVELS)}, got {text!r}")
            return text.lower()
        return text
    if kind == "origins":
        return _parse_list(value, where, "origins", normalize_origin)
    if kind == "hosts":
        return _parse_list(value, where, "host names", normalize_host)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if kind == "int":
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ConfigError(f"{where} must be an integer, got {value!r}") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ConfigError(f"{where} must be a number, got {value!r}") from None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):
            # nan passes every bound check below, and inf overflows the timers.
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    assert kind == "bytes"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{where} must be a size like 67108864, 64MiB or 1GB, got {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _parse_list(
    value: object, where: str, what: str, normalize: Callable[[str], str]
) -> tuple[str, ...]:
    """A list of origins or host names: a TOML array, or one string of them separated
    by commas; each as ``normalize`` writes it, once."""
    if isinstance(value, str):
        items: list[object] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError(f"{where} must be a list of {what}, got {value!r}")
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{where} must be a list of {what}, got {item!r} in it")
        try:
            normalized = normalize(item)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if normalized not in out:
            out.append(normalized)
    return tuple(out)


def _check(cfg: ServerConfig, sources: Mapping[str, str] | None = None) -> None:
    sources = sources or {}

    def name(setting: str) -> str:
        # Which flag, variable or file set it: that is what the user has to change.
        source = sources.get(setting)
        return f"{setting} (from {source})" if source else setting

    problems = []
    if not 0 <= cfg.port <= 65535:
        problems.append(f"{name('port')} must be 0..65535, got {cfg.port}")
    for setting in SETTINGS:
        value = getattr(cfg, setting.name)
        if setting.bound == "positive" and value <= 0:
            problems.append(f"{name(setting.name)} must be positive, got {value}")
        elif setting.bound == "non-negative" and value < 0:
            problems.append(f"{name(setting.name)} must not be negative, got {value}")
    if cfg.default_ttl > MAX_TTL:
        problems.append(f"{name('default_ttl')} must be at most {MAX_TTL}, got {cfg.default_ttl}")
    if cfg.fetch_default_limit > cfg.fetch_max_limit:
        problems.append(f"{name('fetch_default_limit')} must not exceed {name('fetch_max_limit')}")
    if cfg.tx_default_timeout > cfg.tx_max_timeout:
        problems.append(f"{name('tx_default_timeout')} must not exceed {name('tx_max_timeout')}")
    if cfg.advertise_url is not None:
        parts = urlsplit(cfg.advertise_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(
                f"{name('advertise_url')} must be an http(s)://HOST[:PORT] URL, "
                f"got {cfg.advertise_url!r}"
            )
    if cfg.tx_max_timeout > MAX_TIMEOUT_LIMIT:
        problems.append(
            f"{name('tx_max_timeout')} must be at most {MAX_TIMEOUT_LIMIT:.0f} (100 years), "
            f"got {cfg.tx_max_timeout}"
        )

    if problems:
        raise ConfigError("; ".join(problems))


def read_toml(path: Path) -> dict[str, Any]:
    """The settings in a TOML file: top-level keys named like the settings."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - set(_BY_KEY))
    if unknown:
        raise ConfigError(f"config file {path}: unknown settings {', '.join(unknown)}")
    return raw


def load_config(
    overrides: Mapping[str, Any] | None = None,
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Merge defaults, the TOML file, ``TIDINGS_*`` variables and flag ``overrides``.

    Later sources win: flags > environment > TOML > defaults. The TOML file is
    ``config_file``, else the file ``TIDINGS_CONFIG`` names, else none. Unknown
    ``TIDINGS_*`` variables are ignored (clients read some); unknown TOML keys and
    unknown override names are errors. Raises :class:`ConfigError`.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is None and env.get(CONFIG_ENV):
        config_file = Path(env[CONFIG_ENV])
    if config_file is not None:
        for key, raw in read_toml(config_file).items():
            setting = _BY_KEY[key]
            sources[setting.name] = f"config file {config_file}"
            values[setting.name] = _parse(setting, raw, sources[setting.name])
    for setting in SETTINGS:
        if setting.env in env:
            sources[setting.name] = setting.env
            values[setting.name] = _parse(setting, env[setting.env], setting.env)
    for name, raw in (overrides or {}).items():
        if name not in _BY_NAME:
            raise ConfigError(f"unknown setting {name!r}")
        sources[name] = _BY_NAME[name].flag or "arguments"
        values[name] = _parse(_BY_NAME[name], raw, sources[name])
    cfg = ServerConfig(**values)
    _check(cfg, sources)
    return cfg

"""The server's settings and where they come from: flags > ``TIDINGS_*`` > TOML > defaults.

Every setting has one name, used unchanged as the TOML key, upper-cased behind
``TIDINGS_`` as the environment variable, and (for the few that have one) dashed as
the ``tidings serve`` flag. :data:`SETTINGS` is the single list; docs/configuration.md
describes the same list and a test checks that the two agree.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click

__all__ = ["ROLES", "SETTINGS", "ConfigError", "ServerConfig", "Setting", "load_config"]

Role = Literal["all", "messaging", "transactions"]
ROLES: tuple[Role, ...] = ("all", "messaging", "transactions")

ENV_PREFIX = "TIDINGS_"
#: Names the TOML file when ``--config`` is not given.
CONFIG_ENV = "TIDINGS_CONFIG"


class ConfigError(click.ClickException):
    """A setting has a wrong type or value; ``tidings serve`` exits 2 without starting."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``tidings serve`` needs to know. Field docs are in docs/configuration.md."""

    host: str = "127.0.0.1"
    port: int = 8470
    data_dir: Path = Path("./tidings-data")
    role: Role = "all"
    # HTTP
    max_body_bytes: int = 64 << 20
    max_wait_ms: int = 30_000
    shutdown_timeout: float = 30.0
    blocking_threads: int = 32
    # logging
    log_level: str = "info"
    access_log: bool = False
    # store
    sync: bool = True
    map_size: int = 1 << 40
    # messaging
    default_ttl: int = 7 * 24 * 3600
    fetch_default_limit: int = 1000
    fetch_max_limit: int = 10_000
    cleanup_interval: float = 60.0
    cleanup_batch: int = 5000
    # transactions
    tx_default_timeout: float = 30.0
    tx_max_timeout: float = 3600.0
    tx_sweep_interval: float = 1.0
    tx_snapshot_every: int = 10_000
    tx_history_size: int = 100_000
    tx_prune_interval: float = 3600.0

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
    """One setting: its name (TOML key), value kind, and flag if ``tidings serve`` has one."""

    name: str
    kind: str  # "str", "int", "float", "bool", "bytes", "path", "role", "level"
    flag: str | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def default(self) -> Any:
        return _DEFAULTS[self.name]


_KINDS: dict[str, str] = {
    "host": "str",
    "port": "int",
    "data_dir": "path",
    "role": "role",
    "max_body_bytes": "bytes",
    "max_wait_ms": "int",
    "shutdown_timeout": "float",
    "blocking_threads": "int",
    "log_level": "level",
    "access_log": "bool",
    "sync": "bool",
    "map_size": "bytes",
    "default_ttl": "int",
    "fetch_default_limit": "int",
    "fetch_max_limit": "int",
    "cleanup_interval": "float",
    "cleanup_batch": "int",
    "tx_default_timeout": "float",
    "tx_max_timeout": "float",
    "tx_sweep_interval": "float",
    "tx_snapshot_every": "int",
    "tx_history_size": "int",
    "tx_prune_interval": "float",
}
_FLAGS = {"host": "--host", "port": "--port", "data_dir": "--data-dir", "role": "--role"}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ServerConfig)}

#: Every setting, in the order of :class:`ServerConfig`.
SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name, _KINDS[f.name], _FLAGS.get(f.name)) for f in dataclasses.fields(ServerConfig)
)
_BY_NAME = {s.name: s for s in SETTINGS}

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
        return float(value)
    assert kind == "bytes"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{where} must be a size like 67108864, 64MiB or 1GB, got {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _check(cfg: ServerConfig) -> None:
    problems = []
    if not 0 <= cfg.port <= 65535:
        problems.append(f"port must be 0..65535, got {cfg.port}")
    positive = (
        "max_body_bytes", "max_wait_ms", "blocking_threads", "map_size", "default_ttl",
        "fetch_default_limit", "fetch_max_limit", "cleanup_interval", "cleanup_batch",
        "tx_default_timeout", "tx_max_timeout", "tx_sweep_interval", "tx_snapshot_every",
    )  # fmt: skip
    for name in positive:
        if getattr(cfg, name) <= 0:
            problems.append(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.tx_history_size < 0:
        problems.append(f"tx_history_size must not be negative, got {cfg.tx_history_size}")
    if cfg.tx_prune_interval < 0:
        problems.append(f"tx_prune_interval must not be negative, got {cfg.tx_prune_interval}")
    if cfg.shutdown_timeout < 0:
        problems.append(f"shutdown_timeout must not be negative, got {cfg.shutdown_timeout}")
    if cfg.fetch_default_limit > cfg.fetch_max_limit:
        problems.append("fetch_default_limit must not exceed fetch_max_limit")
    if cfg.tx_default_timeout > cfg.tx_max_timeout:
        problems.append("tx_default_timeout must not exceed tx_max_timeout")
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
    unknown = sorted(set(raw) - set(_BY_NAME))
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
    if config_file is None and env.get(CONFIG_ENV):
        config_file = Path(env[CONFIG_ENV])
    if config_file is not None:
        for name, raw in read_toml(config_file).items():
            values[name] = _parse(_BY_NAME[name], raw, f"config file {config_file}")
    for setting in SETTINGS:
        if setting.env in env:
            values[setting.name] = _parse(setting, env[setting.env], setting.env)
    for name, raw in (overrides or {}).items():
        if name not in _BY_NAME:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = _parse(_BY_NAME[name], raw, _BY_NAME[name].flag or "arguments")
    cfg = ServerConfig(**values)
    _check(cfg)
    return cfg

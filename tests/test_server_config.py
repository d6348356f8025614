"""Server settings: flags > TIDINGS_* environment > TOML file > defaults."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from click.testing import CliRunner

from tidings.cli import main
from tidings.server.config import (
    SETTINGS,
    ConfigError,
    ServerConfig,
    Setting,
    _row,
    _setting,
    load_config,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tidings.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    cfg = load_config({}, env={})
    assert (cfg.host, cfg.port, cfg.data_dir, cfg.role) == (
        "127.0.0.1",
        8470,
        Path("./tidings-data"),
        "all",
    )
    assert cfg.max_body_bytes == 64 * 1024 * 1024
    assert cfg.store_dir == Path("./tidings-data/store")
    assert cfg.tx_dir == Path("./tidings-data/tx")
    assert cfg.runs_messaging and cfg.runs_transactions


def test_precedence(tmp_path: Path) -> None:
    toml = write(tmp_path, 'port = 1000\nhost = "0.0.0.0"\nmax_wait_ms = 5\nsync = false\n')
    env = {"TIDINGS_PORT": "2000", "TIDINGS_HOST": "10.0.0.1", "TIDINGS_DEFAULT_TTL": "60"}
    cfg = load_config({"port": 3000}, config_file=toml, env=env)
    assert cfg.port == 3000  # flag > env > toml
    assert cfg.host == "10.0.0.1"  # env > toml
    assert cfg.max_wait_ms == 5  # toml > default
    assert cfg.sync is False
    assert cfg.default_ttl == 60  # env > default
    assert cfg.fetch_max_limit == 10_000  # default


def test_each_layer_alone(tmp_path: Path) -> None:
    assert load_config({"role": "messaging"}, env={}).role == "messaging"
    assert load_config({}, env={"TIDINGS_ROLE": "transactions"}).role == "transactions"
    toml = write(tmp_path, 'role = "messaging"\n')
    assert load_config({}, config_file=toml, env={}).role == "messaging"


def test_config_file_from_environment(tmp_path: Path) -> None:
    toml = write(tmp_path, "port = 1234\n")
    assert load_config({}, env={"TIDINGS_CONFIG": str(toml)}).port == 1234
    other = tmp_path / "other.toml"
    other.write_text("port = 4321\n")
    assert load_config({}, config_file=other, env={"TIDINGS_CONFIG": str(toml)}).port == 4321


def test_value_forms() -> None:
    env = {
        "TIDINGS_MAX_BODY_BYTES": "1MiB",
        "TIDINGS_MAP_SIZE": "10GB",
        "TIDINGS_ACCESS_LOG": "yes",
        "TIDINGS_SYNC": "0",
        "TIDINGS_SHUTDOWN_TIMEOUT": "2.5",
        "TIDINGS_LOG_LEVEL": "DEBUG",
        "TIDINGS_DATA_DIR": "/var/lib/tidings",
    }
    cfg = load_config({}, env=env)
    assert cfg.max_body_bytes == 1 << 20
    assert cfg.map_size == 10 * 1000**3
    assert cfg.access_log is True and cfg.sync is False
    assert cfg.shutdown_timeout == 2.5
    assert cfg.log_level == "debug"
    assert cfg.data_dir == Path("/var/lib/tidings")


def test_allowed_origins_are_kept_as_browsers_write_them(tmp_path: Path) -> None:
    """Lower-case, without a trailing slash or the scheme's default port: an
    ``Origin`` header is compared with them as it comes."""
    env = {"TIDINGS_ALLOWED_ORIGINS": " HTTPS://Console.Example:443/ , http://a.example:8080,"}
    assert load_config({}, env=env).allowed_origins == (
        "https://console.example",
        "http://a.example:8080",
    )
    toml = write(tmp_path, 'allowed_origins = ["http://b.example:80", "http://b.example"]\n')
    assert load_config({}, config_file=toml, env={}).allowed_origins == ("http://b.example",)
    with pytest.raises(ConfigError, match="list of origins"):
        load_config({}, config_file=write(tmp_path, "allowed_origins = [1]\n"), env={})


def test_allowed_hosts_are_kept_as_host_headers_name_them(tmp_path: Path) -> None:
    """Lower-case, an IPv6 address in brackets, without a trailing dot: the name part of
    a ``Host`` header is compared with them as it comes."""
    env = {"TIDINGS_ALLOWED_HOSTS": " Tidings.Example. , ::1, [2001:DB8::1],tidings.example"}
    assert load_config({}, env=env).allowed_hosts == (
        "tidings.example",
        "[::1]",
        "[2001:db8::1]",
    )
    toml = write(tmp_path, 'allowed_hosts = ["*", "a.example"]\n')
    assert load_config({}, config_file=toml, env={}).allowed_hosts == ("*", "a.example")
    with pytest.raises(ConfigError, match="list of host names"):
        load_config({}, config_file=write(tmp_path, "allowed_hosts = [1]\n"), env={})


def test_flag_values_keep_their_types() -> None:
    cfg = load_config({"data_dir": Path("d"), "port": 0, "host": "::1"}, env={})
    assert (cfg.data_dir, cfg.port, cfg.host) == (Path("d"), 0, "::1")


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"TIDINGS_PORT": "eighty"}, "TIDINGS_PORT"),
        ({"TIDINGS_PORT": "70000"}, "port"),
        ({"TIDINGS_ROLE": "both"}, "role"),
        ({"TIDINGS_SYNC": "maybe"}, "sync"),
        ({"TIDINGS_MAX_BODY_BYTES": "lots"}, "max_body_bytes"),
        ({"TIDINGS_MAX_BODY_BYTES": "0"}, "max_body_bytes"),
        ({"TIDINGS_LOG_LEVEL": "loud"}, "log_level"),
        ({"TIDINGS_FETCH_DEFAULT_LIMIT": "20000"}, "fetch_default_limit"),
        ({"TIDINGS_TX_DEFAULT_TIMEOUT": "7200"}, "tx_default_timeout"),
        ({"TIDINGS_SHUTDOWN_TIMEOUT": "-1"}, "shutdown_timeout"),
        ({"TIDINGS_ALLOWED_ORIGINS": "*"}, "allowed_origins"),
        ({"TIDINGS_ALLOWED_ORIGINS": "null"}, "allowed_origins"),
        ({"TIDINGS_ALLOWED_ORIGINS": "https://a.example/app"}, "allowed_origins"),
        ({"TIDINGS_ALLOWED_ORIGINS": "ftp://a.example"}, "allowed_origins"),
        ({"TIDINGS_ALLOWED_HOSTS": "tidings.example:8470"}, "without a port"),
        ({"TIDINGS_ALLOWED_HOSTS": "[::1]:8470"}, "allowed_hosts"),
        ({"TIDINGS_ALLOWED_HOSTS": "https://tidings.example"}, "allowed_hosts"),
        ({"TIDINGS_ALLOWED_HOSTS": "a b.example"}, "allowed_hosts"),
        ({"TIDINGS_ALLOWED_HOSTS": "a..example"}, "allowed_hosts"),
        ({"TIDINGS_ALLOWED_HOSTS": "*.example"}, "allowed_hosts"),
    ],
)
def test_bad_values(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config({}, env=env)


def test_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown settings"):
        load_config({}, config_file=write(tmp_path, "prot = 1\n"), env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config({}, config_file=write(tmp_path, "port = \n"), env={})
    with pytest.raises(ConfigError, match="must be an integer"):
        load_config({}, config_file=write(tmp_path, 'port = "x"\n'), env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config({}, config_file=tmp_path / "missing.toml", env={})


def test_unknown_environment_variables_are_ignored() -> None:
    assert load_config({}, env={"TIDINGS_URL": "http://x"}) == ServerConfig()


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ConfigError):
        load_config({"nope": 1}, env={})


def test_every_setting_with_a_flag_is_an_option_of_serve() -> None:
    help_text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    flagged = [s for s in SETTINGS if s.flag]
    assert flagged, "no setting has a flag"
    for setting in SETTINGS:
        assert (f"{setting.flag} " in help_text) == bool(setting.flag), setting.name


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.bound], ids=lambda s: s.name)
def test_every_bound_is_checked(setting: Setting) -> None:
    bad = "0" if setting.bound == "positive" else "-1"
    with pytest.raises(ConfigError, match=setting.name):
        load_config(env={setting.env: bad})


def test_bad_flag_value_exits_2_without_starting(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["serve", "--data-dir", str(tmp_path / "d")], env={"TIDINGS_MAX_WAIT_MS": "0"}
    )
    assert result.exit_code == 2, result.output
    assert "max_wait_ms (from TIDINGS_MAX_WAIT_MS) must be positive" in result.output
    assert not (tmp_path / "d").exists()


# --- every setting through ``tidings serve``: flag > environment > TOML > default ---


def samples(setting: Setting) -> tuple[Any, Any, Any]:
    """Values for the TOML file, the environment and a flag, each unlike the one
    before it and the first unlike the default, all within the setting's bounds and
    the checks between settings (so numbers only grow, and only a little)."""
    default = setting.default
    if setting.kind == "bool":
        return (not default, default, not default)
    if setting.kind == "role":
        return ("messaging", "transactions", "messaging")
    if setting.kind == "level":
        return ("debug", "warning", "error")
    if setting.kind in ("int", "bytes"):
        return (default + 1, default + 2, default + 3)
    if setting.kind == "float":
        return (default + 0.5, default + 1.5, default + 2.5)
    if setting.kind == "path":
        return (Path("/from/toml"), Path("/from/env"), Path("/from/flag"))
    if setting.kind == "origins":
        return (
            ("https://toml.example",),
            ("https://env.example", "http://localhost:3000"),
            ("https://flag.example",),
        )
    if setting.kind == "hosts":
        return (("toml.example",), ("env.example", "[::1]"), ("flag.example",))
    assert setting.kind == "str", setting.kind
    if setting.name == "advertise_url":
        return ("http://from-toml:1", "http://from-env:2", "https://from-flag:3")
    return ("from-toml", "from-env", "from-flag")


def as_toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(json.dumps(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string of plain text is a TOML string


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


class Serve(Protocol):
    def __call__(
        self, setting: Setting, *, toml: Any = None, env: Any = None, flag: Any = None
    ) -> Any: ...


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Serve:
    """``tidings serve`` up to the point it would start: the config it would run."""
    seen: list[ServerConfig] = []

    def run(config: ServerConfig) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr("tidings.server.main.run", run)
    for name in list(os.environ):
        if name.startswith("TIDINGS_"):
            monkeypatch.delenv(name)

    def invoke(setting: Setting, *, toml: Any = None, env: Any = None, flag: Any = None) -> Any:
        args = ["serve"]
        if toml is not None:
            path = tmp_path / "tidings.toml"
            path.write_text(f"{setting.key} = {as_toml(toml)}\n")
            args += ["--config", str(path)]
        if flag is not None:
            assert setting.flag is not None
            args += [setting.flag, as_text(flag)]
        environ = {setting.env: as_text(env)} if env is not None else {}
        result = CliRunner().invoke(main, args, env=environ)
        assert result.exit_code == 0, result.output
        return getattr(seen.pop(), setting.name)

    return invoke


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_each_setting_by_toml_env_and_flag(serve: Serve, setting: Setting) -> None:
    from_toml, from_env, from_flag = samples(setting)
    assert serve(setting) == setting.default
    assert serve(setting, toml=from_toml) == from_toml
    assert serve(setting, env=from_env) == from_env
    assert serve(setting, toml=from_toml, env=from_env) == from_env
    if setting.flag is None:
        return
    assert serve(setting, flag=from_flag) == from_flag
    assert serve(setting, toml=from_toml, flag=from_flag) == from_flag
    assert serve(setting, env=from_env, flag=from_flag) == from_flag
    assert serve(setting, toml=from_toml, env=from_env, flag=from_flag) == from_flag


# --- the table's rules for declaring a setting ---


def test_names_can_be_overridden_in_the_declaration() -> None:
    @dataclass
    class Declared:
        derived: int = _setting(1, "named after the field", flag=True)
        named: int = _setting(2, "named by hand", flag="--n", env="TIDINGS_N", key="n")
        unflagged: int = _setting(3, "no flag")

    derived, named, unflagged = (_row(f, int) for f in dataclasses.fields(Declared))
    assert (derived.key, derived.env, derived.flag) == ("derived", "TIDINGS_DERIVED", "--derived")
    assert (named.key, named.env, named.flag) == ("n", "TIDINGS_N", "--n")
    assert unflagged.flag is None


def test_kind_comes_from_the_annotation_unless_named() -> None:
    @dataclass
    class Declared:
        size: int = _setting(1, "a size", kind="bytes")
        wrong: str = _setting("x", "not a size", kind="bytes")
        unknown: complex = _setting(1j, "no kind reads this")

    size, wrong, unknown = dataclasses.fields(Declared)
    assert _row(size, int).kind == "bytes"
    with pytest.raises(TypeError, match="wrong"):
        _row(wrong, str)
    with pytest.raises(TypeError, match="unknown"):
        _row(unknown, complex)


def test_the_example_file_reads_back_as_the_defaults(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tidings.cli import main

    printed = CliRunner().invoke(main, ["config", "example"])
    assert printed.exit_code == 0
    path = tmp_path / "example.toml"
    path.write_text(printed.output)
    assert load_config({}, config_file=path, env={}) == ServerConfig()
    for setting in SETTINGS:  # every setting is in it, with its variable named
        assert f"\n{setting.key} = " in printed.output and setting.env in printed.output


def test_serving_a_network_address_without_an_auth_file_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tidings.server.main import _security

    with caplog.at_level("WARNING", logger="tidings.server"):
        assert _security(ServerConfig(host="127.0.0.1")) is None
        assert not caplog.records
        assert _security(ServerConfig(host="0.0.0.0")) is None
    assert "without an auth file" in caplog.text
    with pytest.raises(ConfigError, match="go together"):
        _security(ServerConfig(tls_cert=tmp_path / "cert.pem"))

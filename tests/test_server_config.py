"""Server settings: flags > TIDINGS_* environment > TOML file > defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tidings.server.config import (
    SETTINGS,
    ConfigError,
    ServerConfig,
    Setting,
    load_config,
    settings_table,
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


def test_docs_list_every_setting() -> None:
    """docs/configuration.md documents each setting with its env var and default."""
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", doc, re.M)}
    assert set(rows) == {s.name for s in SETTINGS}
    for setting in SETTINGS:
        row = rows[setting.name]
        assert f"`{setting.env}`" in row, setting.name
        if setting.flag:
            assert f"`{setting.flag}`" in row, setting.name


def test_docs_table_is_the_settings_table() -> None:
    """docs/configuration.md shows exactly the table the code makes from ServerConfig."""
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    table = settings_table()
    assert table in doc
    assert doc.count("| TOML key |") == 1


def test_every_setting_with_a_flag_is_an_option_of_serve() -> None:
    from click.testing import CliRunner

    from tidings.cli import main

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
    from click.testing import CliRunner

    from tidings.cli import main

    result = CliRunner().invoke(
        main, ["serve", "--data-dir", str(tmp_path / "d")], env={"TIDINGS_MAX_WAIT_MS": "0"}
    )
    assert result.exit_code == 2, result.output
    assert "max_wait_ms must be positive" in result.output
    assert not (tmp_path / "d").exists()

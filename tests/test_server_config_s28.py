"""Settings as a user gives them: each route (flag, variable, file) is named in the
error of a value out of range, and an empty path flag is refused like an empty
variable rather than read as the current directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tidings.cli import main
from tidings.server.config import ConfigError, load_config


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` stops where it would start a server: these tests are about settings."""
    monkeypatch.setattr("tidings.server.main.run", lambda config: 0)
    for name in ("TIDINGS_CONFIG", "TIDINGS_PORT", "TIDINGS_DATA_DIR", "TIDINGS_MAX_WAIT_MS"):
        monkeypatch.delenv(name, raising=False)


def serve(tmp_path: Path, *args: str, **env: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["serve", "--data-dir", str(tmp_path / "data"), *args], env=env
    )
    return result.exit_code, result.stderr


def test_an_empty_data_dir_flag_is_refused_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = serve(tmp_path, "--data-dir", "")
    assert code == 2
    assert err.strip() == "Error: data_dir (from --data-dir) must be a non-empty string, got ''"
    assert list(tmp_path.iterdir()) == []  # nothing created where the command ran


def test_an_empty_optional_path_flag_means_not_set() -> None:
    assert load_config({"auth_file": ""}, env={}).auth_file is None


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("flag", "port (from --port) must be 0..65535, got 70000"),
        ("env", "port (from TIDINGS_PORT) must be 0..65535, got 70000"),
        ("file", "port (from config file {file}) must be 0..65535, got 70000"),
    ],
)
def test_a_value_out_of_range_names_where_it_came_from(
    tmp_path: Path, route: str, expected: str
) -> None:
    file = tmp_path / "tidings.toml"
    file.write_text("port = 70000\n" if route == "file" else "")
    overrides = {"port": "70000"} if route == "flag" else {}
    env = {"TIDINGS_PORT": "70000"} if route == "env" else {}
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, config_file=file, env=env)
    assert caught.value.message == expected.format(file=file)


def test_the_cli_shows_where_a_bound_was_broken(tmp_path: Path) -> None:
    code, err = serve(tmp_path, TIDINGS_MAX_WAIT_MS="0")
    assert code == 2
    assert err.strip() == "Error: max_wait_ms (from TIDINGS_MAX_WAIT_MS) must be positive, got 0"
    assert not (tmp_path / "data").exists()


def test_two_settings_that_disagree_name_both_sources(tmp_path: Path) -> None:
    file = tmp_path / "tidings.toml"
    file.write_text("fetch_max_limit = 10\n")
    with pytest.raises(ConfigError) as caught:
        load_config({}, config_file=file, env={"TIDINGS_FETCH_DEFAULT_LIMIT": "20"})
    assert caught.value.message == (
        "fetch_default_limit (from TIDINGS_FETCH_DEFAULT_LIMIT) must not exceed "
        f"fetch_max_limit (from config file {file})"
    )


@pytest.mark.parametrize("url", ["tidings-1:8470", "ftp://tidings-1", "http://"])
def test_an_advertise_url_that_is_no_http_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=r"advertise_url .* must be an http"):
        load_config({}, env={"TIDINGS_ADVERTISE_URL": url})


def test_a_good_advertise_url_is_kept() -> None:
    cfg = load_config({"advertise_url": "https://tidings-1.example:8470"}, env={})
    assert cfg.advertise_url == "https://tidings-1.example:8470"


def test_a_read_pool_of_no_connections_is_refused_at_start(tmp_path: Path) -> None:
    code, err = serve(tmp_path, "--pg-readers", "0")
    assert code == 2
    assert err.strip() == "Error: pg_readers (from --pg-readers) must be positive, got 0"
    assert not (tmp_path / "data").exists()
    with pytest.raises(ConfigError, match="pg_readers"):
        load_config({}, env={"TIDINGS_PG_READERS": "many"})

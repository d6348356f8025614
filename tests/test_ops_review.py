"""Settings that must be refused before ``tidings serve`` opens anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.server.config import SETTINGS, ConfigError, Setting, load_config

#: Every setting read as a number of seconds (a float).
SECONDS = [s for s in SETTINGS if s.kind == "float"]


@pytest.mark.parametrize("setting", SECONDS, ids=lambda s: s.name)
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "infinity"])
def test_a_time_that_is_not_finite_is_refused_from_the_environment(
    setting: Setting, text: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{setting.name} .*finite"):
        load_config({}, env={setting.env: text})


@pytest.mark.parametrize("setting", SECONDS, ids=lambda s: s.name)
@pytest.mark.parametrize("literal", ["nan", "inf", "+inf"])
def test_a_time_that_is_not_finite_is_refused_from_the_file(
    tmp_path: Path, setting: Setting, literal: str
) -> None:
    path = tmp_path / "tidings.toml"
    path.write_text(f"{setting.key} = {literal}\n")
    with pytest.raises(ConfigError, match=rf"{setting.name} .*finite"):
        load_config({}, config_file=path, env={})


def test_a_time_that_is_not_finite_is_refused_from_a_flag() -> None:
    with pytest.raises(ConfigError, match=r"lease_seconds .*finite"):
        load_config({"lease_seconds": float("inf")}, env={})


def test_a_default_ttl_the_store_cannot_hold_is_refused() -> None:
    most = 2**63 // 1000  # expiries are milliseconds in a signed 64-bit integer
    assert load_config({}, env={"TIDINGS_DEFAULT_TTL": str(most - 1)}).default_ttl == most - 1
    with pytest.raises(ConfigError, match="default_ttl must be at most"):
        load_config({}, env={"TIDINGS_DEFAULT_TTL": str(most + 1)})

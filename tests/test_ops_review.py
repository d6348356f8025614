"""Settings refused before ``tidings serve`` opens anything; readiness of the services."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import httpx
import pytest

from tidings.errors import TidingsError
from tidings.server.app import create_app
from tidings.server.config import SETTINGS, ConfigError, ServerConfig, Setting, load_config
from tidings.server.handlers import Api
from tidings.server.inbox import LoopInbox
from tidings.server.longpoll import LongPolls
from tidings.server.metrics import Metrics, Sources
from tidings.server.services import Services

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


def test_readiness_ends_when_the_transaction_log_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(data_dir=tmp_path, role="transactions", tx_sweep_interval=60)
    services = Services.open(config)
    try:
        tx = services.tx
        assert tx is not None

        async def readyz() -> int:
            api = Api(
                config,
                services,
                Metrics(sources=Sources()),
                LongPolls(),
                LoopInbox(asyncio.get_running_loop()),
            )
            transport = httpx.ASGITransport(app=create_app(api))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return (await client.get("/readyz")).status_code

        assert services.ready and asyncio.run(readyz()) == 200
        began = tx.begin()

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", full)
        with pytest.raises(TidingsError):
            tx.commit(began.write_pointer, ())
        monkeypatch.undo()
        # Fail-stop: every call fails until a restart, so take it out of the balancer.
        with pytest.raises(TidingsError):
            tx.begin()
        assert not services.ready
        assert asyncio.run(readyz()) == 503
    finally:
        services.close()

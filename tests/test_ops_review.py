"""Settings refused before ``tidings serve`` opens anything; readiness of the services."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
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
    with pytest.raises(ConfigError, match=r"default_ttl .*must be at most"):
        load_config({}, env={"TIDINGS_DEFAULT_TTL": str(most + 1)})


@pytest.fixture
def stopped_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    """Services of role transactions whose log failed (a full disk at an fsync)."""
    config = ServerConfig(data_dir=tmp_path, role="transactions", tx_sweep_interval=60)
    services = Services.open(config)
    try:
        tx = services.tx
        assert tx is not None
        assert services.ready and asyncio.run(get(services, "/readyz")).status_code == 200
        began = tx.begin()

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as patched:
            patched.setattr(os, "fdatasync", full)
            with pytest.raises(TidingsError):
                tx.commit(began.write_pointer, ())
        # Fail-stop: every call fails until a restart.
        with pytest.raises(TidingsError):
            tx.begin()
        yield services
    finally:
        services.close()


async def get(services: Services, path: str) -> httpx.Response:
    """``GET path`` of the server's application over ``services``."""
    tx = services.tx
    sources = Sources(tx_state=None if tx is None else tx.state)
    api = Api(
        services.config,
        services,
        Metrics(sources=sources),
        LongPolls(),
        LoopInbox(asyncio.get_running_loop()),
    )
    transport = httpx.ASGITransport(app=create_app(api))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get(path)


def test_readiness_ends_when_the_transaction_log_fails(stopped_log: Services) -> None:
    # Take it out of the load balancer: it cannot serve a transaction until restarted.
    assert not stopped_log.ready
    assert asyncio.run(get(stopped_log, "/readyz")).status_code == 503


def test_metrics_still_answer_when_the_transaction_log_fails(stopped_log: Services) -> None:
    answer = asyncio.run(get(stopped_log, "/metrics"))
    assert answer.status_code == 200
    text = answer.text
    # What does not depend on the log is all there; the state's gauges are left out.
    for name in ("process_cpu_seconds_total", "tidings_transactions_begun_total"):
        assert f"\n{name} " in text, name
    assert "\ntidings_transactions_in_progress " not in text

"""The CLI against a server split into its two roles: --transactions-url names where
the transaction service answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.e2e.serverproc import ServerProcess
from tidings.cli import main

pytestmark = pytest.mark.e2e


def test_publish_tx_consume_and_tx_list_across_two_roles(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    transactions = start_server("--role", "transactions", data_dir=data)
    messaging = start_server("--role", "messaging", data_dir=data)
    runner = CliRunner()

    def run(*args: str, **env: str) -> str:
        result = runner.invoke(main, ["--url", messaging.url, *args], env=env)
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout

    run("topics", "create", "split")
    tx = ["--transactions-url", transactions.url]
    assert "in transaction" in run(*tx, "publish", "split", "--tx", "a", "b")
    assert run(*tx, "consume", "split").split() == ["a", "b"]
    assert "read pointer" in run("tx", "list", TIDINGS_TRANSACTIONS_URL=transactions.url)
    # Without it, the messaging process says what is missing, in one line.
    result = runner.invoke(main, ["--url", messaging.url, "consume", "split"])
    assert result.exit_code == 1 and result.stderr.startswith("Error: RoleUnavailable")


def test_a_transactions_url_that_is_no_url_is_wrong_usage() -> None:
    result = CliRunner().invoke(main, ["--transactions-url", "host:abc", "tx", "list"])
    assert result.exit_code == 2
    assert "Invalid value for --transactions-url" in result.stderr

"""``tidings tx`` and the abort/invalidate endpoints say what really happened.

An abort of a transaction that had timed out (or was invalidated) succeeds on the
server without changing anything, since its writes never show anyway; the CLI used to
print "aborted transaction N" for it, and exit 0, though nothing was aborted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from click.testing import CliRunner, Result

from tests.e2e.serverproc import ServerProcess
from tidings import Client, TransactionEnd
from tidings.cli import main

pytestmark = pytest.mark.e2e

Run = Callable[..., Result]


@pytest.fixture
def run(server: ServerProcess) -> Run:
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, ["--url", server.url, "tx", *args])

    return invoke


def _timed_out(client: Client) -> int:
    """A transaction that timed out and was swept onto the invalid list."""
    wp = client.begin(0.05).write_pointer
    deadline = time.monotonic() + 10
    while wp not in client.transactions().invalid:
        assert time.monotonic() < deadline, "the sweep did not invalidate it"
        time.sleep(0.05)
    return wp


def test_abort_of_a_timed_out_transaction_says_it_was_not_aborted(
    run: Run, server: ServerProcess
) -> None:
    with Client(server.url) as client:
        wp = _timed_out(client)
        result = run("abort", str(wp))
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        assert result.stderr.startswith(
            f"Error: TransactionTimedOut: transaction {wp} was not aborted: it timed out"
        ), result.stderr
        assert wp in client.transactions().invalid  # and still is

        invalidated = client.begin().write_pointer
        client.invalidate(invalidated)
        result = run("abort", str(invalidated))
        assert result.exit_code == 1
        assert result.stderr.startswith(
            f"Error: TransactionInvalid: transaction {invalidated} was not aborted: "
            "it was invalidated"
        ), result.stderr

        # An invalidate of either is what was asked for: it says they were invalid.
        again = run("invalidate", str(wp))
        assert again.exit_code == 0
        assert again.stdout == f"transaction {wp} was already invalid: it timed out\n"
        assert run("invalidate", str(invalidated)).stdout == (
            f"transaction {invalidated} was already invalid: it was invalidated\n"
        )


def test_abort_says_whether_this_call_aborted(run: Run, server: ServerProcess) -> None:
    with Client(server.url) as client:
        wp = client.begin().write_pointer
        first = run("abort", str(wp))
        assert (first.exit_code, first.stdout) == (0, f"aborted transaction {wp}\n")
        second = run("abort", str(wp))
        assert (second.exit_code, second.stdout) == (
            0,
            f"transaction {wp} was already aborted\n",
        )
        committed = client.begin().write_pointer
        client.commit(committed)
        refused = run("abort", str(committed))
        assert refused.exit_code == 1 and "TransactionCommitted" in refused.stderr
        unknown = run("abort", "1")
        assert unknown.exit_code == 1 and "TransactionNotFound" in unknown.stderr
        fresh = client.begin().write_pointer
        done = run("invalidate", str(fresh))
        assert (done.exit_code, done.stdout) == (0, f"invalidated transaction {fresh}\n")


def test_the_answers_and_the_client_name_the_outcome(server: ServerProcess) -> None:
    with Client(server.url) as client:
        wp = client.begin().write_pointer
        answer = httpx.post(f"{server.url}/v1/transactions/{wp}/abort", json={})
        assert answer.status_code == 200
        assert answer.json() == {"outcome": "aborted", "already": False}
        assert client.abort(wp) == TransactionEnd("aborted", already=True)

        timed_out = _timed_out(client)
        assert client.abort(timed_out) == TransactionEnd("timedOut", already=True)
        assert not client.abort(timed_out).aborted
        answer = httpx.post(f"{server.url}/v1/transactions/{timed_out}/invalidate")
        assert answer.json() == {"outcome": "timedOut", "already": True}

        fresh = client.begin().write_pointer
        assert client.invalidate(fresh) == TransactionEnd("invalidated", already=False)
        assert client.invalidate(fresh) == TransactionEnd("invalidated", already=True)


def test_prune_names_the_pointers_that_were_not_on_the_invalid_list(
    run: Run, server: ServerProcess
) -> None:
    with Client(server.url) as client:
        invalid = client.begin().write_pointer
        client.invalidate(invalid)
        open_tx = client.begin().write_pointer
        result = run("prune", str(invalid), str(open_tx), "1")
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == [
            "pruned 1 invalid pointer",
            f"  {invalid}",
            f"not on the invalid list: 1 {open_tx}",
        ]
        assert open_tx in client.transactions().in_progress
        client.abort(open_tx)

"""Transactions at the edges, through the real server, the real clients and the CLI:
a transaction context entered twice, timeouts that JSON cannot carry, write pointers
the command line cannot name."""

from __future__ import annotations

import asyncio
import math

import pytest
from click.testing import CliRunner

from tests.e2e.serverproc import ServerProcess
from tidings import JSON, AsyncClient, Client
from tidings.cli import main
from tidings.names import INT64_MAX

pytestmark = pytest.mark.e2e


def _committed(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in client.poll(topic, isolation="read_committed")]


def _everything(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in client.poll(topic)]


@pytest.mark.parametrize("defer_begin", [True, False])
def test_a_context_entered_again_inside_itself_commits_nothing(
    server: ServerProcess, topic: str, defer_begin: bool
) -> None:
    # Entering the context a second time used to start over where the transaction goes
    # in one request: what the outer block had published was dropped, the inner block
    # committed alone, and the rest of the outer block then failed: half a transaction.
    with Client(server.url) as client:
        client.create_topic(topic)
        tx = client.transaction(defer_begin=defer_begin)
        with pytest.raises(RuntimeError, match="use a new context"), tx:
            tx.publish(topic, b"outer")
            with tx:
                tx.publish(topic, b"inner")
            tx.publish(topic, b"outer, after")
        assert tx.state == "aborted"
        assert _committed(client, topic) == []


@pytest.mark.parametrize("defer_begin", [True, False])
def test_a_context_that_committed_cannot_be_entered_again(
    server: ServerProcess, topic: str, defer_begin: bool
) -> None:
    # One context, one transaction: a second ``with`` used to begin (and commit) a new
    # transaction behind the same object where the transaction goes in one request.
    with Client(server.url) as client:
        client.create_topic(topic)
        with client.transaction(defer_begin=defer_begin) as tx:
            tx.publish(topic, b"first")
        first = tx.write_pointer
        with pytest.raises(RuntimeError, match="committed; use a new context"), tx:
            tx.publish(topic, b"second")
        assert (tx.state, tx.write_pointer) == ("committed", first)
        assert _committed(client, topic) == [b"first"]
        aborted = client.transaction(defer_begin=defer_begin)
        with aborted:
            aborted.abort()
        with pytest.raises(RuntimeError, match="aborted; use a new context"), aborted:
            pass


def test_an_async_context_is_entered_once(server: ServerProcess, topic: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.url) as client:
            await client.create_topic(topic)
            with pytest.raises(RuntimeError, match="use a new context"):
                async with client.transaction() as tx:
                    await tx.publish(topic, b"outer")
                    async with tx:
                        await tx.publish(topic, b"inner")
            assert tx.state == "aborted"
            async with client.transaction() as tx:
                await tx.publish(topic, b"once")
            with pytest.raises(RuntimeError, match="committed; use a new context"):
                async with tx:
                    pass

    asyncio.run(run())
    with Client(server.url) as client:
        assert _committed(client, topic) == [b"once"]


@pytest.mark.parametrize("media", [None, JSON])
@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf])
def test_a_timeout_that_is_not_a_finite_number_is_refused_before_anything_is_sent(
    server: ServerProcess, topic: str, media: object, timeout: float
) -> None:
    # JSON has no NaN or infinity: the encoder wrote null, which the server reads as
    # "the default timeout", so a JSON client's begin (and every client's begin, which
    # is always JSON) silently began a 30 s transaction, where the same call in Avro
    # was refused.
    kwargs = {} if media is None else {"media": media}
    with Client(server.url, **kwargs) as client:
        client.create_topic(topic)
        before = client.transactions()
        with pytest.raises(ValueError, match="finite number"):
            client.begin(timeout)
        with pytest.raises(ValueError, match="finite number"):
            client.publish_transaction({topic: [b"x"]}, timeout=timeout)
        with pytest.raises(ValueError, match="finite number"):
            client.transaction(timeout=timeout)
        after = client.transactions()
        assert after.last_write_pointer == before.last_write_pointer
        assert _everything(client, topic) == []


def test_the_cli_refuses_write_pointers_no_transaction_can_have(server: ServerProcess) -> None:
    # A pointer past 64 bits used to crash ``tx prune`` with a traceback (the client
    # could not encode it); every such argument is now a usage error (exit status 2).
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, ["--url", server.url, "tx", *args])
        return result.exit_code, result.output

    too_big = str(INT64_MAX + 1)
    for args in (
        ["prune", too_big],
        ["prune", "--below", too_big],
        ["prune", "--below", "-1"],
        ["prune", "0"],
        ["abort", too_big],
        ["abort", "0"],
        ["invalidate", "--", "-5"],
    ):
        code, output = run(*args)
        assert code == 2, (args, output)
        assert "Traceback" not in output and "not in the range" in output, (args, output)
    assert run("prune", str(INT64_MAX))[0] == 0
    assert run("prune", "--below", "0")[0] == 0
    with Client(server.url) as client:
        with pytest.raises(ValueError, match="below"):
            client.prune(below=INT64_MAX + 1)
        with pytest.raises(ValueError, match="ids"):
            client.prune(ids=[1, 0])

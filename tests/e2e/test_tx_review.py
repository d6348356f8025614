"""Transactions at the edges, through the real server, the real clients and the CLI:
a transaction context entered twice, timeouts that JSON cannot carry, write pointers
the command line cannot name, commits whose answer an instance standing by lost."""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import AVRO_EXT, JSON, AsyncClient, Client
from tidings.cli import main
from tidings.codec.media import Media
from tidings.errors import ServerError
from tidings.names import INT64_MAX
from tidings.server.forward import Forwarder
from tidings.structs import Transaction

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


@pytest.mark.parametrize("media", [AVRO_EXT, JSON])
@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf])
def test_a_timeout_that_is_not_a_finite_number_is_refused_before_anything_is_sent(
    server: ServerProcess, topic: str, media: Media, timeout: float
) -> None:
    # JSON has no NaN or infinity: the encoder wrote null, which the server reads as
    # "the default timeout", so a JSON client's begin (and every client's begin, which
    # is always JSON) silently began a 30 s transaction, where the same call in Avro
    # was refused.
    with Client(server.url, media=media) as client:
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


@contextlib.contextmanager
def _standby(real: str, late_path: str, timeout: float, delay: float) -> Iterator[str]:
    """A standby (the real Forwarder) whose leader carries out every request on
    ``real`` and answers those to ``late_path`` ``delay`` s late (tests/e2e/tx_standby.py);
    yields the standby's URL."""
    leader_port, standby_port = free_port(), free_port()
    args = [real, late_path, str(leader_port), str(standby_port), str(timeout), str(delay)]
    proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.tx_standby", *args])
    url = f"http://127.0.0.1:{standby_port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "the standby exited"
            try:
                if httpx.get(f"http://127.0.0.1:{leader_port}/healthz").status_code == 200:
                    httpx.get(f"{url}/metrics").raise_for_status()
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the standby did not start"
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("late_path", "defer_begin"),
    [("/transactions/publish", True), ("/commit", False)],
    ids=["one-request", "commit"],
)
def test_a_commit_whose_answer_a_standby_lost_is_neither_repeated_nor_rolled_back(
    server: ServerProcess, topic: str, late_path: str, defer_begin: bool
) -> None:
    # A standby (several instances on one store) forwards every request to the leader.
    # When the leader's answer did not come in time, it answered 503, which says "not
    # done": the context then sent its one-request transaction again step by step (two
    # copies committed), or rolled back the entries of a commit that had gone through
    # and called it aborted (a committed transaction's messages gone).
    with (
        _standby(server.url, late_path, timeout=0.5, delay=2.0) as url,
        Client(url) as client,
        Client(server.url) as direct,
    ):
        direct.create_topic(topic)
        tx = client.transaction(defer_begin=defer_begin)
        try:
            with tx:
                tx.publish(topic, [b"m1", b"m2"])
        except ServerError as exc:  # the answer was lost: the outcome is unknown
            assert "did not answer" in str(exc)
            assert tx.state == "unknown"
        else:  # the context asked, and learnt that the commit went through
            assert tx.state == "committed"
        time.sleep(2.5)  # the leader's late answers are in
        assert _committed(direct, topic) == [b"m1", b"m2"]
        assert _everything(direct, topic) == [b"m1", b"m2"]


def test_a_standby_that_cannot_reach_the_leader_answers_503(server: ServerProcess) -> None:
    # Not sent at all: that is still the retriable "not done" 503.
    nobody = f"http://127.0.0.1:{free_port()}"

    async def ask() -> httpx.Response:
        forwarder = Forwarder(lambda: nobody, me="http://127.0.0.1:1", max_body=1 << 20, timeout=1)
        try:
            transport = httpx.ASGITransport(app=forwarder)
            async with httpx.AsyncClient(transport=transport, base_url="http://standby") as c:
                return await c.post("/v1/transactions", json={})
        finally:
            await forwarder.aclose()

    answer = asyncio.run(ask())
    assert answer.status_code == 503
    assert answer.json()["type"] == "ServiceUnavailable"
    assert answer.headers["retry-after"] == "1"


class _SlowStart:
    """A participant whose start takes a while (it writes somewhere, say)."""

    name = "slow"

    def __init__(self) -> None:
        self.started: list[int] = []

    async def start(self, transaction: Transaction) -> None:
        await asyncio.sleep(0.2)
        self.started.append(transaction.write_pointer)

    async def changes(self) -> list[bytes]:
        return []

    async def commit(self) -> None:
        pass

    async def post_commit(self) -> None:
        pass

    async def rollback(self) -> None:
        pass


def test_concurrent_publishes_past_the_threshold_begin_one_transaction(
    server: ServerProcess, topic: str
) -> None:
    # Publishes gathered on one context, each past the payload threshold, each began a
    # transaction of its own while the context was waiting for its begin: the commit
    # made the last one's messages visible, the others' were lost without an error,
    # and their transactions stayed open until they timed out.
    payloads = [b"m%02d-" % i + b"x" * 40 for i in range(6)]

    async def run(client: AsyncClient) -> None:
        async with client.transaction(payload_threshold=16) as tx:
            await asyncio.gather(*(tx.publish(topic, p) for p in payloads))
        assert tx.state == "committed"
        # Enlisting while another call begins it waits for that begin too.
        slow = _SlowStart()
        async with client.transaction(payload_threshold=16) as tx:
            await tx.publish(topic, b"small")  # buffered: nothing begun yet
            await asyncio.gather(
                tx.enlist(slow), *(tx.publish(topic, b"late-" + p) for p in payloads[:2])
            )
        assert tx.state == "committed" and slow.started == [tx.write_pointer]

    async def main() -> None:
        async with AsyncClient(server.url) as client:
            await client.create_topic(topic)
            before = (await client.transactions()).last_write_pointer
            await run(client)
            state = await client.transactions()
            assert [wp for wp in state.in_progress if wp > before] == []

    asyncio.run(main())
    with Client(server.url) as client:
        expected = payloads + [b"small"] + [b"late-" + p for p in payloads[:2]]
        assert sorted(_committed(client, topic)) == sorted(expected)
        assert sorted(_everything(client, topic)) == sorted(expected)


def test_a_context_cancelled_during_its_commit_does_not_roll_it_back(
    server: ServerProcess, topic: str
) -> None:
    # Cancelled while the commit was on its way, the context said "active", and an
    # abort() then rolled back the entries of a transaction that did commit: its
    # messages were gone. Its state is now "unknown", and abort() leaves it alone.
    async def run(url: str) -> None:
        async with AsyncClient(url, timeout=10) as client:
            tx = client.transaction(defer_begin=False)

            async def body() -> None:
                async with tx:
                    await tx.publish(topic, [b"m1", b"m2"])

            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(body(), 1.0)  # the commit is answered after 2 s
            assert tx.state == "unknown"
            await tx.abort()
            assert tx.state == "unknown"

    with (
        _standby(server.url, "/commit", timeout=10, delay=2.0) as url,
        Client(server.url) as direct,
    ):
        direct.create_topic(topic)
        asyncio.run(run(url))
        time.sleep(1.5)  # the commit is in by now
        assert _committed(direct, topic) == [b"m1", b"m2"]
        assert _everything(direct, topic) == [b"m1", b"m2"]

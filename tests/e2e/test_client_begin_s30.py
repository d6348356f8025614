"""A begin whose answer is lost: the client sends it again under the same ``beginId``
and the server answers the transaction that id began, so no transaction is left open
that nobody can end (it would hold one of ``tx_max_open`` slots and show in every
snapshot until its timeout). Through :class:`~tests.e2e.faultproxy.FaultProxy`, which
drops the begin's answer after the server carried it out (the field itself:
test_tx_begin_s30.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.faultproxy import Fault, FaultProxy
from tests.e2e.serverproc import ServerProcess, readiness
from tidings import AsyncClient, Client, RetryPolicy

pytestmark = pytest.mark.e2e

TX = "/v1/transactions"
#: Quick resends: the proxy fails at once, no need to wait.
RETRY = RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.05)


def _is_begin(line: bytes) -> bool:
    return line.startswith(b"POST /v1/transactions ")


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    port = urlsplit(server.url).port
    assert port is not None
    with FaultProxy(port, matches=_is_begin) as p:
        yield p


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def _open(api: httpx.Client) -> set[int]:
    return {e["writePointer"] for e in api.get(TX).json()["inProgress"]}


def test_a_context_whose_begin_answer_is_lost_begins_once_and_commits(
    proxy: FaultProxy, api: httpx.Client, topic: str
) -> None:
    before = _open(api)
    with Client(proxy.url, timeout=5, retry=RETRY) as client:
        client.create_topic(topic)
        proxy.load([Fault.DROP_AFTER])
        with client.transaction(defer_begin=False) as tx:  # begins here
            wp = tx.transaction.write_pointer
            tx.publish(topic, b"once")
        assert proxy.applied == [Fault.DROP_AFTER, Fault.PASS]  # sent again
        assert [m.payload for m in client.consume(topic, follow=False)] == [b"once"]
    # The lost answer's transaction is the one that committed: none left open.
    assert _open(api) <= before
    assert wp not in _open(api)


async def test_async_begin_whose_answers_are_lost_begins_once(
    proxy: FaultProxy, api: httpx.Client
) -> None:
    before = _open(api)
    async with AsyncClient(proxy.url, timeout=5, retry=RETRY) as client:
        proxy.load([Fault.DROP_AFTER, Fault.CUT_MID])
        tx = await client.begin()
        assert proxy.applied == [Fault.DROP_AFTER, Fault.CUT_MID, Fault.PASS]
        assert _open(api) - before == {tx.write_pointer}
        assert (await client.abort(tx)).outcome == "aborted"
    assert _open(api) <= before


def test_without_retries_the_begin_fails_and_its_key_still_ends_it(
    proxy: FaultProxy, api: httpx.Client
) -> None:
    # A caller that gives up may send the begin again itself, with its begin_id.
    before = _open(api)
    with Client(proxy.url, timeout=5, retry=RetryPolicy(attempts=1)) as client:
        proxy.load([Fault.DROP_AFTER])
        with pytest.raises(Exception):  # noqa: B017 (how the transport says it)
            client.begin(begin_id="lost-answer-1")
        tx = client.begin(begin_id="lost-answer-1")
        client.commit(tx)
    assert _open(api) <= before


def test_through_a_standby_the_key_reaches_the_leader(tmp_path: Path, postgres_url: str) -> None:
    # PostgreSQL store, two instances: the begin goes to the one standing by, which
    # forwards it to the leader; its answer is lost on the way back to the client.
    url = fresh_database(postgres_url)
    nodes = [
        ServerProcess(tmp_path / f"n{n}", ["--store", url, "--lease-seconds", "3"]).start()
        for n in range(2)
    ]
    try:
        standby = nodes[1]
        assert readiness(standby) == "forwarding"
        port = urlsplit(standby.url).port
        assert port is not None
        with (
            FaultProxy(port, matches=_is_begin) as proxy,
            Client(proxy.url, timeout=5, retry=RETRY) as client,
            httpx.Client(base_url=nodes[0].url, timeout=10) as leader,
        ):
            proxy.load([Fault.DROP_AFTER])
            tx = client.begin()
            assert proxy.applied == [Fault.DROP_AFTER, Fault.PASS]
            assert _open(leader) == {tx.write_pointer}
            client.commit(tx)
            assert _open(leader) == set()
    finally:
        for node in nodes:
            node.kill()

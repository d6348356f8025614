"""A pop carrying acks (``ackIds``) whose acks' store write fails, through the server's
application in process over LMDB: the failure must land where the server has not
popped yet, which a server in its own process gives no hold on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tidings.codec import queue_bodies
from tidings.errors import StoreFull
from tidings.server.app import create_app
from tidings.server.config import ServerConfig
from tidings.server.handlers import Api
from tidings.server.inbox import LoopInbox
from tidings.server.longpoll import LongPolls
from tidings.server.metrics import Metrics, Sources
from tidings.server.services import Services
from tidings.store.backend import WriteView
from tidings.structs import Message

T = TypeVar("T")

POP = "/v1/namespaces/ns/topics/t/queues/q/pop"


async def _post(services: Services, path: str, body: object) -> httpx.Response:
    tx = services.tx
    assert tx is not None
    api = Api(
        services.config,
        services,
        Metrics(sources=Sources(tx_state=tx.state)),
        LongPolls(),
        LoopInbox(asyncio.get_running_loop()),
    )
    transport = httpx.ASGITransport(app=create_app(api))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.post(path, json=body)


@pytest.mark.parametrize("wait_ms", [0, 200])
def test_a_pop_whose_acks_fail_to_be_written_leaves_nothing_leased(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_ms: int
) -> None:
    services = Services.open(ServerConfig(data_dir=tmp_path, tx_sweep_interval=3600))
    try:
        store, messaging, queues, tx = (
            services.store,
            services.messaging,
            services.queues,
            services.tx,
        )
        assert store is not None and messaging is not None
        assert queues is not None and tx is not None
        assert not store.reads_block  # LMDB: the acks' write is awaited on the loop
        messaging.create_topic("ns", "t")
        messaging.publish("ns", "t", [b"%d" % i for i in range(4)])

        def pop(worker: str, n: int) -> list[Message]:
            snap = tx.snapshot()
            assert snap is not None
            return queues.pop("ns", "t", "q", worker, max_messages=n, snapshot=snap)

        batch = pop("w1", 2)  # in memory now, its lease not written (pops write nothing)
        submit = store.submit
        failed: list[object] = []

        def full(fn: Callable[[WriteView], T]) -> Future[T]:
            # The next write (the acks') fails as a full store does, and has failed
            # before the route goes on: a writer quicker than the event loop.
            def refused(view: WriteView) -> T:
                raise StoreFull("the store is full")

            monkeypatch.setattr(store, "submit", submit)
            done = submit(refused)
            failed.append(done)
            done.exception()
            return done

        monkeypatch.setattr(store, "submit", full)
        body = {
            "consumerId": "w1",
            "maxMessages": 2,
            "ackIds": queue_bodies.ack_request("w1", [m.id for m in batch])["ids"],
        }
        answer = asyncio.run(_post(services, f"{POP}?waitMs={wait_ms}", body))
        assert len(failed) == 1
        assert answer.status_code == 503, answer.text
        # The pop leased nothing to w1; the messages whose acks failed stay w1's, as
        # it held them (SQS keeps a message whose delete failed invisible until its
        # timeout): another worker gets only the rest, and w1 may ack them again.
        again = pop("w2", 10)
        assert sorted(m.payload for m in again) == [b"2", b"3"]
        assert queues.describe("ns", "t", "q").consumers == {"w1": 2, "w2": 2}
        queues.ack("ns", "t", "q", "w1", [m.id for m in batch])
        assert queues.describe("ns", "t", "q").consumers == {"w2": 2}
    finally:
        services.close()

"""The transaction manager at the edges of its settings and of its transactional ids."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import zlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import pytest

from tidings.clock import FakeClock
from tidings.errors import ConfigError, ProducerFenced, TopicNotFound
from tidings.messaging import MessagingService
from tidings.server.config import load_config
from tidings.server.inbox import LoopInbox
from tidings.server.routes.transactions import _transact
from tidings.structs import Record
from tidings.tx import TransactionManager, TxConfig, snapshot
from tidings.tx.config import MAX_TIMEOUT_LIMIT
from tidings.tx.snapshot import decode_state, encode_state
from tidings.tx.state import TxStateMachine


def test_a_max_timeout_whose_expiry_cannot_be_logged_is_refused(tmp_path: Path) -> None:
    # An expiry is ms in a signed 64-bit field. With a maximum of ~3e8 years a begin
    # was applied in memory and then failed to be logged ("int too large to convert"):
    # an open transaction no record names, and every later snapshot failing on it.
    with pytest.raises(ValueError, match="max_timeout"):
        TxConfig(max_timeout=1e17)
    with pytest.raises(ConfigError, match="tx_max_timeout"):
        load_config(env={"TIDINGS_TX_MAX_TIMEOUT": "1e17"})
    config = TxConfig(max_timeout=MAX_TIMEOUT_LIMIT)
    with TransactionManager(tmp_path, config) as m:
        tx = m.begin(MAX_TIMEOUT_LIMIT)
        m.take_snapshot()
    with TransactionManager(tmp_path, config) as m:
        assert list(m.state().in_progress) == [tx.write_pointer]
        m.commit(tx.write_pointer)


def test_a_zombie_of_a_forgotten_transactional_id_is_fenced(tmp_path: Path) -> None:
    # An id unused for producer_expiry is forgotten; registering it again used to
    # start at epoch 0, the very epoch its forgotten holder had. Calls name the id and
    # the epoch, not the producer id, so that holder, come back as a zombie, passed for
    # the new one: it began, committed and aborted as the new holder, its transactions
    # too. The fresh registration's epoch is now above every forgotten one's.
    clock = FakeClock()
    config = TxConfig(sweep_interval=3600, producer_expiry=60.0)
    with TransactionManager(tmp_path, config, clock) as m:
        old = m.register_producer("app")
        bumped = m.register_producer("app")  # epoch 1: the zombie holds this one
        other = m.register_producer("other")
        m.expire()
        clock.advance(61_000)
        m.register_producer("other")  # in use: not forgotten
        m.expire()
        new = m.register_producer("app")
        assert new.producer_id != old.producer_id and new.epoch == bumped.epoch + 1
        tx = m.begin(transactional_id="app", epoch=new.epoch)
        for call in (
            lambda: m.begin(transactional_id="app", epoch=bumped.epoch),
            lambda: m.abort(tx.write_pointer, transactional_id="app", epoch=bumped.epoch),
            lambda: m.commit(tx.write_pointer, transactional_id="app", epoch=bumped.epoch),
        ):
            with pytest.raises(ProducerFenced):
                call()
        # An id never seen before starts above the forgotten epochs as well.
        assert m.register_producer("brand-new").epoch == bumped.epoch + 1
        assert m.register_producer("other").epoch == other.epoch + 2
        m.take_snapshot()  # the forgotten id is not in it; the floor is
    with TransactionManager(tmp_path, config, clock) as m:
        with pytest.raises(ProducerFenced):
            m.commit(tx.write_pointer, transactional_id="app", epoch=bumped.epoch)
        m.commit(tx.write_pointer, transactional_id="app", epoch=new.epoch)
        m.expire()
        clock.advance(61_000)
        m.expire()  # all forgotten now, the floor survives them
        assert m.register_producer("app").epoch == new.epoch + 1
        m.take_snapshot()
    with TransactionManager(tmp_path, config, clock) as m:
        assert m.register_producer("other").epoch > bumped.epoch


def test_snapshots_of_version_2_are_still_read() -> None:
    image = TxStateMachine().export()
    data = encode_state(dataclasses.replace(image, epoch_floor=7))
    assert decode_state(data).epoch_floor == 7
    # Version 2: the same without the floor's 8 bytes after the reservation.
    head = len(snapshot.MAGIC) + 24 + 16
    body = b"TDTXSNP\x02" + data[len(snapshot.MAGIC) : head] + data[head + 8 : -4]
    v2 = body + struct.pack(">I", zlib.crc32(body))
    assert decode_state(v2) == image


@pytest.mark.parametrize("given_back", [True, False])
async def test_a_failed_one_request_transaction_whose_acks_stay_is_invalidated(
    tmp_path: Path, given_back: bool
) -> None:
    # A one-request transaction whose publish fails gives its queue acks and group
    # positions back, then aborts. If giving them back failed, it aborted all the same,
    # and an aborted transaction's acks and positions count as committed (an abort
    # says its writes were undone): messages acked, a batch skipped, by a transaction
    # that failed. It is now invalidated instead, so they count for nothing.
    class Failing:
        def publish_all_future(self, ns: str, batches: Any, wp: int | None) -> Future[Any]:
            future: Future[Any] = Future()
            future.set_exception(TopicNotFound("deleted meanwhile"))
            return future

    async def settle(wp: int) -> tuple[list[Any], list[Future[None]]]:
        return [], []

    async def unsettle(wp: int) -> bool:
        return given_back

    with TransactionManager(tmp_path / "tx", TxConfig(sweep_interval=3600)) as m:
        inbox = LoopInbox(asyncio.get_running_loop())
        ended: list[str] = []
        batches: list[Any] = [("t", [Record(b"x")])]
        messaging = cast(MessagingService, Failing())
        with pytest.raises(TopicNotFound):
            await _transact(
                inbox, messaging, m, "ns", batches, None, None, None, ended, (settle, unsettle)
            )
        wp = m.state().last_write_pointer
        if given_back:
            assert ended == ["begun", "aborted"] and wp not in m.state().invalid
        else:
            assert ended == ["begun", "invalidated"] and wp in m.state().invalid

"""The transaction manager at the edges of its settings and of its transactional ids."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path

import pytest

from tidings.clock import FakeClock
from tidings.errors import ConfigError, ProducerFenced
from tidings.server.config import load_config
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

"""The transaction manager at the edges of its settings and of its transactional ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.errors import ConfigError
from tidings.server.config import load_config
from tidings.tx import TransactionManager, TxConfig
from tidings.tx.config import MAX_TIMEOUT_LIMIT


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

"""The transaction service's maintenance (timeouts, snapshots) outlives a store that
is full or cannot be reached for a while: it used to stop for good at the first such
failure, and no transaction timed out again until a restart."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tidings.errors import ServiceUnavailable, StoreFull, StoreUnavailable
from tidings.tx import TransactionManager, TxConfig


@pytest.mark.parametrize("error", [StoreUnavailable, StoreFull])
def test_a_sweep_failing_for_the_store_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[ServiceUnavailable]
) -> None:
    calls: list[int] = []
    swept = threading.Event()
    with TransactionManager(tmp_path, TxConfig(sweep_interval=0.05)) as tx:
        real = tx.expire

        def expire() -> list[int]:
            calls.append(1)
            if len(calls) == 1:
                raise error("PostgreSQL is restarting")
            swept.set()
            return real()

        monkeypatch.setattr(tx, "expire", expire)
        assert swept.wait(5), "maintenance stopped after the store's failure"

"""The transaction log kept in the store: what a call whose log write failed says."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import pytest

from tidings.errors import LeaseLost, LogFailed, OutcomeUnknown, TidingsError
from tidings.store.backend import WriteView
from tidings.store.backends.memory import MemoryStore
from tidings.tx import TransactionManager, TxConfig

T = TypeVar("T")
QUIET = TxConfig(sweep_interval=3600)


class _FailingStore(MemoryStore):
    """Commits until given an error, then fails every write with it."""

    error: TidingsError | None = None

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        if self.error is not None:
            future: Future[T] = Future()
            future.set_exception(self.error)
            return future
        return super().submit(fn)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        # The write's COMMIT went unanswered: the commit may have happened.
        (OutcomeUnknown("the commit's answer was lost"), OutcomeUnknown),
        # The fence refused the write: nothing this instance writes commits any more.
        (LeaseLost("this instance no longer holds the leader lease"), LeaseLost),
    ],
)
def test_a_call_whose_log_write_failed_says_what_became_of_it(
    error: TidingsError, raised: type[TidingsError]
) -> None:
    store = _FailingStore()
    m = TransactionManager(None, QUIET, store=store)
    m.start()
    try:
        tx = m.begin()
        m.state()
        store.error = error
        with pytest.raises(raised):
            m.commit(tx.write_pointer)
        # Later calls are refused before anything is written (fail-stop).
        with pytest.raises(LeaseLost if raised is LeaseLost else LogFailed):
            m.begin()
    finally:
        store.error = None
        m.close()

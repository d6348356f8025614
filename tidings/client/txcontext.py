"""What a transaction context holds and decides without I/O; the contexts and the
participant protocol are in :mod:`tidings.client._async.transactions` (and its
generated sync twin), where the steps are described."""

from __future__ import annotations

import enum
from typing import Protocol

from tidings.client.api import check_timeout
from tidings.client.txbuffer import ambiguous
from tidings.errors import TidingsError, TransactionFailure
from tidings.structs import ProducerInfo, Transaction

__all__ = ["ContextState", "State", "attach", "failure_of", "name_of"]


class _Deferrable(Protocol):
    def end_deferred(self) -> None: ...


class State(enum.Enum):
    NEW = "new"
    #: Entered with the begin deferred to the commit: nothing sent yet.
    PENDING = "pending"
    ACTIVE = "active"
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"


def name_of(participant: object) -> str:
    name = getattr(participant, "name", None)
    return name if isinstance(name, str) else type(participant).__name__


def failure_of(participant: object, step: str, error: BaseException) -> BaseException:
    """What to raise for ``error`` from a participant's ``step``."""
    if isinstance(error, TidingsError) or not isinstance(error, Exception):
        return error
    return TransactionFailure(f"{name_of(participant)}.{step}() failed: {error!r}")


class ContextState:
    """State and decisions shared by the sync and async contexts."""

    publisher: _Deferrable

    def __init__(
        self,
        participants: tuple[object, ...],
        timeout: float | None,
        producer: ProducerInfo | None,
        defer_begin: bool,
    ) -> None:
        self._participants = participants
        self._timeout = check_timeout(timeout)
        self._producer = producer
        self._tx: Transaction | None = None
        self._state = State.NEW
        # Only the messaging publisher takes part: nobody needs the transaction before
        # the commit, which can then be a single request.
        self._defer = defer_begin and len(participants) == 1

    def _snapshot(self) -> Transaction:
        if self._tx is None:
            raise RuntimeError("the transaction has not started")
        return self._tx

    @property
    def write_pointer(self) -> int:
        """The transaction's id."""
        return self.transaction.write_pointer

    @property
    def transaction(self) -> Transaction:
        """The transaction's snapshot; RuntimeError before it began."""
        return self._snapshot()

    @property
    def state(self) -> str:
        """new, active, committed, aborted, or unknown (the commit's answer was lost)."""
        return State.ACTIVE.value if self._state is State.PENDING else self._state.value

    @property
    def _producer_id(self) -> str | None:
        return None if self._producer is None else self._producer.transactional_id

    @property
    def _epoch(self) -> int | None:
        return None if self._producer is None else self._producer.epoch

    def _require(self, state: State) -> Transaction:
        if self._state is not state:
            raise RuntimeError(f"the transaction is {self.state}, not {state.value}")
        return self._snapshot()

    def _require_new(self) -> None:
        """RuntimeError unless the context was never entered: one context runs one
        transaction."""
        if self._state is not State.NEW:
            raise RuntimeError(f"the transaction is {self.state}; use a new context")

    def _require_open(self) -> None:
        if self._state is not State.ACTIVE and self._state is not State.PENDING:
            raise RuntimeError(f"the transaction is {self.state}, not active")

    def _drop(self) -> None:
        """End a deferred transaction that sent nothing."""
        self.publisher.end_deferred()
        self._state = State.ABORTED

    def _one_request_failed(self, error: TidingsError) -> None:
        """The state after the one-request commit failed with ``error``."""
        if ambiguous(error):
            self._state = State.UNKNOWN
            error.add_note(
                "the outcome of the transaction is unknown (no answer): if it did not "
                "commit, it becomes invalid when it times out, so none of it shows"
            )
        else:
            self._state = State.ABORTED  # the server rolled back and aborted


def attach(cause: BaseException | None, notes: list[str]) -> None:
    if cause is None:
        if notes:
            raise TransactionFailure("; ".join(notes))
        return
    for note in notes:
        cause.add_note(note)

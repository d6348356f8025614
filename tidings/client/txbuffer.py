"""What a transactional publisher holds and decides without I/O (CDAP TMS
"Transactional publishing"); the publishers themselves are in
:mod:`tidings.client._async.txpublisher` and its generated sync twin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tidings.client.base import MessageLike, Outgoing, to_records
from tidings.client.batching import record_size, records_size
from tidings.errors import ClientError, ServerError, TransactionFailure
from tidings.names import check_name
from tidings.structs import RollbackInfo, Transaction

__all__ = [
    "DEFAULT_PAYLOAD_THRESHOLD",
    "STORE_CHUNK_BYTES",
    "TxBuffer",
    "TxPublisherState",
    "ambiguous",
    "chunks",
    "raise_first",
    "raise_rollback_errors",
]

#: Bytes a transaction buffers client-side before it streams with ``store``.
DEFAULT_PAYLOAD_THRESHOLD = 1 << 20
#: Largest ``store`` request the payload path sends (well below the server's body limit).
STORE_CHUNK_BYTES = 4 << 20


class TxBuffer:
    """What a transactional publisher holds, and when to stream it (no I/O)."""

    def __init__(self, payload_threshold: int) -> None:
        if payload_threshold < 0:
            raise ValueError("payload_threshold must not be negative")
        self.payload_threshold = payload_threshold
        self.buffers: dict[str, list[Outgoing]] = {}
        self.buffered_bytes = 0
        #: Topics whose messages went (partly) to the Payload Table.
        self.streamed: dict[str, None] = {}
        #: What each publish wrote, to roll it back.
        self.published: list[tuple[str, RollbackInfo]] = []
        #: A publish failed without saying whether it wrote: rollback cannot be complete.
        self.unknown_publish = False

    def add(self, topic: str, records: list[Outgoing]) -> list[tuple[str, list[Outgoing]]]:
        """Buffer ``records``; returns what to ``store`` now (once past the threshold)."""
        self.buffers.setdefault(topic, []).extend(records)
        self.buffered_bytes += records_size(records)
        if self.buffered_bytes <= self.payload_threshold:
            return []
        out = [(t, chunk) for t, recs in self.buffers.items() for chunk in chunks(recs) if recs]
        for t, _ in out:
            self.streamed[t] = None
        self.buffers = {t: [] for t in self.buffers}
        self.buffered_bytes = 0
        return out

    def try_add(self, topic: str, records: list[Outgoing]) -> bool:
        """Buffer ``records`` if they keep the buffer within the threshold; else False
        (and nothing buffered)."""
        size = records_size(records)
        if self.buffered_bytes + size > self.payload_threshold:
            return False
        self.buffers.setdefault(topic, []).extend(records)
        self.buffered_bytes += size
        return True

    def commit_plan(self) -> list[tuple[str, list[Outgoing], bool]]:
        """``(topic, records, streamed)`` per topic: store the records first if streamed,
        then publish (the records directly, or the write pointer alone)."""
        topics = dict.fromkeys([*self.streamed, *self.buffers])
        plan = [(t, self.buffers.get(t, []), t in self.streamed) for t in topics]
        return [(t, recs, streamed) for t, recs, streamed in plan if recs or streamed]

    def clear(self) -> None:
        self.buffers.clear()
        self.buffered_bytes = 0
        self.streamed.clear()
        self.published.clear()
        self.unknown_publish = False


def chunks(records: list[Outgoing]) -> list[list[Outgoing]]:
    """``records`` cut into ``store`` requests of at most STORE_CHUNK_BYTES (roughly)."""
    chunks: list[list[Outgoing]] = [[]]
    size = 0
    for record in records:
        n = record_size(record)
        if chunks[-1] and size + n > STORE_CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(record)
        size += n
    return chunks


def ambiguous(error: BaseException) -> bool:
    """True if a failed call may still have taken effect (no answer, or a 5xx)."""
    return isinstance(error, ClientError | ServerError) and not isinstance(
        error, TransactionFailure
    )


class TxPublisherState:
    """What the transactional publishers hold and decide (no I/O)."""

    name = "tidings"

    def __init__(self, payload_threshold: int) -> None:
        self._buffer = TxBuffer(payload_threshold)
        self._tx: Transaction | None = None
        self._deferred = False

    @property
    def transaction(self) -> Transaction:
        """The transaction in progress; RuntimeError if none."""
        if self._tx is None:
            raise RuntimeError("no transaction in progress: start() was not called")
        return self._tx

    @property
    def published(self) -> list[tuple[str, RollbackInfo]]:
        """What the commit published, per topic (for inspection and tests)."""
        return list(self._buffer.published)

    def defer(self) -> None:
        """Buffer messages before the transaction begins (see :meth:`buffer`); a later
        ``start()`` keeps them."""
        self._buffer.clear()
        self._tx = None
        self._deferred = True

    def buffer(self, topic: str, messages: MessageLike | Iterable[MessageLike]) -> bool:
        """Before the transaction began (:meth:`defer`): buffer the messages if they fit
        within the payload threshold; False (nothing buffered) if they do not, and the
        transaction must begin first."""
        if not self._deferred:
            raise RuntimeError("buffer() is for a deferred transaction: call defer() first")
        return self._buffer.try_add(check_name(topic), to_records(messages))

    def batches(self) -> list[tuple[str, list[Outgoing]]]:
        """What a deferred transaction publishes: each topic's buffered messages."""
        return [(t, recs) for t, recs, _ in self._buffer.commit_plan()]

    def _begin(self, transaction: Transaction) -> None:
        if not self._deferred:
            self._buffer.clear()
        self._deferred = False
        self._tx = transaction

    def _add(
        self, topic: str, messages: MessageLike | Iterable[MessageLike]
    ) -> list[tuple[str, list[Outgoing]]]:
        if self._tx is None:
            raise RuntimeError("no transaction in progress: start() was not called")
        return self._buffer.add(check_name(topic), to_records(messages))

    def _note_publish_failure(self, error: BaseException) -> None:
        # A cancelled publish may have reached the server all the same.
        if ambiguous(error) or isinstance(error, asyncio.CancelledError):
            self._buffer.unknown_publish = True

    def _end(self) -> None:
        self._buffer.clear()
        self._tx = None
        self._deferred = False

    def end_deferred(self) -> None:
        """A deferred transaction ended (committed in one request, or dropped)."""
        self._end()


def raise_first(errors: list[BaseException]) -> None:
    """Raise the first of ``errors`` (if any), the others attached as notes."""
    if errors:
        first = errors[0]
        for other in errors[1:]:
            if other is not first:
                first.add_note(f"also: {other!r}")
        raise first


def raise_rollback_errors(buffer: TxBuffer, errors: list[BaseException]) -> None:
    if buffer.unknown_publish:
        errors.append(
            TransactionFailure("a publish failed without an answer; its entries are unknown")
        )
    raise_first(errors)

"""Transactional ids, producer ids and epochs (KIP-98), as a pure table.

A transactional id is the name a producer keeps across restarts. Registering it hands out
the same producer id every time and a new, higher epoch; a call carrying an older epoch
comes from a zombie and is fenced. The table only decides; the state machine logs
:class:`~tidings.tx.records.Register` records and applies them here.
"""

from __future__ import annotations

from collections.abc import Iterator

from tidings.errors import InvalidProducer, ProducerFenced, ProducerNotFound, UnknownProducerEpoch
from tidings.structs import ProducerInfo

__all__ = ["MAX_TRANSACTIONAL_ID", "ProducerTable", "validate_transactional_id"]

#: Longest transactional id accepted, in UTF-8 bytes (Kafka's are short names too).
MAX_TRANSACTIONAL_ID = 255


def validate_transactional_id(transactional_id: object) -> str:
    """``transactional_id`` if it is 1-255 UTF-8 bytes of printable text, else InvalidProducer."""
    if not isinstance(transactional_id, str) or not transactional_id:
        raise InvalidProducer("a transactional id is a non-empty string")
    if not transactional_id.isprintable():
        raise InvalidProducer("a transactional id must be printable text")
    try:
        size = len(transactional_id.encode())
    except UnicodeEncodeError:
        raise InvalidProducer("a transactional id must be valid Unicode text") from None
    if size > MAX_TRANSACTIONAL_ID:
        raise InvalidProducer(f"a transactional id is at most {MAX_TRANSACTIONAL_ID} bytes")
    return transactional_id


class ProducerTable:
    """Every registered transactional id with its producer id and current epoch."""

    def __init__(self) -> None:
        self._by_tid: dict[str, ProducerInfo] = {}
        #: The same registrations by producer id (each id is handed out once).
        self._by_pid: dict[int, ProducerInfo] = {}
        self.next_producer_id = 1
        #: The epoch a registration of an id not in the table gets: 0, or once ids
        #: were forgotten (:meth:`expire`), one above the highest epoch any of them had.
        #: Calls carry the id and epoch only, so an id registered afresh at an epoch a
        #: forgotten holder of it had could not be told from that holder (a zombie).
        self.epoch_floor = 0
        #: When each id last began or committed a transaction (ms; not logged: after a
        #: restart every id's idle time starts again at the first sweep).
        self.last_used: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_tid)

    def __iter__(self) -> Iterator[ProducerInfo]:
        return iter(self._by_tid.values())

    def get(self, transactional_id: str) -> ProducerInfo | None:
        return self._by_tid.get(transactional_id)

    def of_producer(self, producer_id: int) -> ProducerInfo | None:
        """The registration holding ``producer_id`` (None: none does)."""
        return self._by_pid.get(producer_id)

    def next_registration(self, transactional_id: str) -> ProducerInfo:
        """What registering ``transactional_id`` now yields (not applied)."""
        tid = validate_transactional_id(transactional_id)
        current = self._by_tid.get(tid)
        if current is None:
            return ProducerInfo(tid, self.next_producer_id, self.epoch_floor)
        return ProducerInfo(tid, current.producer_id, current.epoch + 1)

    def apply(self, info: ProducerInfo) -> ProducerInfo | None:
        """Record ``info`` as current; returns the registration it replaces, if any."""
        previous = self._by_tid.get(info.transactional_id)
        self._by_tid[info.transactional_id] = info
        if previous is not None and previous.producer_id != info.producer_id:
            self._by_pid.pop(previous.producer_id, None)
        self._by_pid[info.producer_id] = info
        self.last_used.pop(info.transactional_id, None)
        self.next_producer_id = max(self.next_producer_id, info.producer_id + 1)
        return previous

    def expire(self, now_ms: int, idle_ms: int, busy: set[int]) -> list[str]:
        """Forget the ids unused for ``idle_ms`` whose producer has no transaction open
        (``busy``: producer ids with one): Kafka's ``transactional.id.expiration.ms``.
        Registering such an id again starts it afresh: a new producer id, and an epoch
        above every epoch a forgotten id had (:attr:`epoch_floor`), so that a zombie of
        the forgotten registration is fenced."""
        idle = []
        for tid, info in self._by_tid.items():
            last = self.last_used.setdefault(tid, now_ms)
            if now_ms - last >= idle_ms and info.producer_id not in busy:
                idle.append(tid)
        for tid in idle:
            forgotten = self._by_tid.pop(tid)
            self._by_pid.pop(forgotten.producer_id, None)
            self.epoch_floor = max(self.epoch_floor, forgotten.epoch + 1)
            self.last_used.pop(tid, None)
        return idle

    def check(self, transactional_id: str | None, epoch: int | None) -> ProducerInfo | None:
        """The caller's registration, or None for a call without a transactional id.

        Fencing comes before everything else, so a zombie learns it is one whatever the
        state of the transaction it names (KIP-98).
        """
        if transactional_id is None:
            if epoch is not None:
                raise InvalidProducer("an epoch was given without a transactional id")
            return None
        info = self._by_tid.get(transactional_id)
        if info is None:
            validate_transactional_id(transactional_id)
            raise ProducerNotFound(f"transactional id {transactional_id!r} is not registered")
        if epoch is None or isinstance(epoch, bool) or not isinstance(epoch, int):
            raise InvalidProducer(f"transactional id {transactional_id!r} needs its epoch")
        if epoch < info.epoch:
            raise ProducerFenced(
                f"transactional id {transactional_id!r} epoch {epoch} was fenced "
                f"by epoch {info.epoch}"
            )
        if epoch > info.epoch:
            raise UnknownProducerEpoch(
                f"transactional id {transactional_id!r} has no epoch {epoch} "
                f"(current: {info.epoch})"
            )
        return info

"""The cleaner: deletes expired rows and every row of older generations.

Cleanup of expired and deleted data by a periodic thread, as CDAP TMS does on LevelDB. Per topic:

* rows of older generations (``gen < abs(current)``, and all rows once deleted) in both
  tables: one contiguous key range per table (see :mod:`tidings.codec.keys`), and
  their seal markers, tallies and open-transaction markers;
* Message Table rows older than ``now - ttl``: a key prefix of the live generation;
* Payload Table rows written before ``now - ttl``: a key prefix under each write pointer;
* rows past their own per-message expiry, found through the expiry index.

Every deletion runs in write functions of at most ``batch`` rows, each its own commit,
so a publish waits behind at most one batch, never a whole pass. Ranges are looked at
in a read snapshot first, so a pass over a clean store writes (and fsyncs) nothing.
Fetch hides expired rows by itself; the cleaner reclaims space, and takes what it
deletes from the live generation off the topic's counts in the same write
(:mod:`tidings.messaging.accounting`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from tidings.clock import Clock
from tidings.codec import keys, values
from tidings.codec.values import TopicState
from tidings.errors import StoreFull
from tidings.messaging import accounting
from tidings.messaging.fetching import retention_cutoff
from tidings.messaging.topics import Topics
from tidings.store.backend import Store, WriteView

__all__ = ["CleanupReport", "Cleaner", "producers_range"]

T = TypeVar("T")

_META = "metadata"
_MESSAGES = "messages"
_PAYLOADS = "payloads"


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """What one cleaner pass did."""

    topics: int
    #: Message Table rows deleted: a message, a batch entry or a pointer entry each.
    messages_deleted: int
    #: Payload Table rows deleted.
    payloads_deleted: int
    batches: int
    seconds: float
    #: Idempotent producers' records (one per producer id and topic generation) left
    #: after the pass.
    producers: int = 0


class Cleaner:
    """One pass at a time over every topic; the service runs it on a thread."""

    def __init__(
        self,
        store: Store,
        topics: Topics,
        clock: Clock,
        batch: int,
        *,
        producer_expiry_ms: int = 7 * 24 * 3600 * 1000,
    ) -> None:
        if batch < 1:
            raise ValueError(f"cleanup batch must be at least 1, got {batch}")
        self._store = store
        self._topics = topics
        self._clock = clock
        self._batch = batch
        self._producer_expiry_ms = producer_expiry_ms
        self._deleted = {_MESSAGES: 0, _PAYLOADS: 0}
        self._batches = 0

    def run_once(self) -> CleanupReport:
        """One full pass; returns what it deleted."""
        began = time.monotonic()
        self._deleted = {_MESSAGES: 0, _PAYLOADS: 0}
        self._batches = 0
        now = self._clock.now_ms()
        states = self._topics.live_states()
        for topic_id, state in states:
            self._clean_topic(topic_id, state, now)
        self._clean_expired(now)
        producers = self._clean_producers(now)
        return CleanupReport(
            topics=len(states),
            messages_deleted=self._deleted[_MESSAGES],
            payloads_deleted=self._deleted[_PAYLOADS],
            batches=self._batches,
            seconds=time.monotonic() - began,
            producers=producers,
        )

    def _clean_topic(self, topic_id: int, state: TopicState, now: int) -> None:
        generation = state.generation
        live = generation if generation > 0 else -generation + 1
        # Older generations are not in the counts (a new generation starts at zero).
        start, stop = keys.older_generations_range(topic_id, live)
        self._drain(_MESSAGES, start, stop)
        self._drain(_PAYLOADS, start, stop)
        self._drain(_META, *keys.sealed_range(topic_id, 0, live))
        self._drain(_META, *keys.tallies_range(topic_id, 0, live))
        # Open-transaction markers of older generations: no end() asks about those.
        self._drain(_META, keys.open_range(topic_id, 0)[0], keys.open_range(topic_id, live)[0])
        if generation <= 0:
            return
        # The pass decides from this state, but every write that deletes takes the
        # cutoff again from the state it reads (_Cutoff): a TTL made longer meanwhile
        # shows those messages again, and they must stay.
        live_cutoff = _Cutoff(topic_id, generation, now)
        cutoff_ms = retention_cutoff(state, now)
        cutoff = keys.ts_seq(cutoff_ms, 0)
        prefix, stop = keys.generation_range(topic_id, generation)
        self._drain(_MESSAGES, prefix, prefix + cutoff, counted=live_cutoff)
        for pointer_prefix in self._expired_pointers(prefix, stop, cutoff):
            self._drain(_PAYLOADS, pointer_prefix, pointer_prefix + cutoff, counted=live_cutoff)
        # Seal markers after the entries they guard: a marker never goes while one of
        # its entries may still show (the TTL made longer before the entries' write).
        self._clean_seals(topic_id, generation, cutoff_ms, live_cutoff)
        self._clean_tallies(topic_id, generation, cutoff, live_cutoff)

    def _expired_pointers(self, prefix: bytes, stop: bytes, cutoff: bytes) -> list[bytes]:
        # Rows under one pointer sort by write_ts, so its oldest row is its first: one
        # seek per write pointer, not a read of every row.
        found: list[bytes] = []
        with self._store.read() as view:
            cursor = prefix
            while True:
                first = next(iter(view.scan(_PAYLOADS, cursor, stop, 1)), None)
                if first is None:
                    return found
                pointer_prefix = first[0][:16]
                if first[0][16:] < cutoff:
                    found.append(pointer_prefix)
                flipped = int.from_bytes(pointer_prefix[8:16], "big")
                if flipped == 2**64 - 1:
                    return found
                cursor = pointer_prefix[:8] + (flipped + 1).to_bytes(8, "big")

    def _clean_seals(
        self, topic_id: int, generation: int, cutoff_ms: int, live_cutoff: _Cutoff
    ) -> None:
        # A marker can go once its pointer entries are past the TTL: no fetch reaches
        # them any more, so rows stored under the pointer later are never exposed. What
        # the entries still add to the topic's counts goes with it.
        start, stop = keys.sealed_range(topic_id, generation, generation + 1)
        with self._store.read() as view:
            old = [k for k, v in view.scan(_META, start, stop) if values.seal_time(v) < cutoff_ms]

        def drop(view: WriteView, chunk: list[bytes]) -> None:
            now_ms = live_cutoff.ms(view)
            if now_ms is not None:
                found = [(k, view.get(_META, k)) for k in chunk]
                accounting.drop_seals(
                    view, [k for k, v in found if v is not None and values.seal_time(v) < now_ms]
                )

        self._in_batches(old, drop)

    def _clean_tallies(
        self, topic_id: int, generation: int, cutoff: bytes, live_cutoff: _Cutoff
    ) -> None:
        # Tallies of pointers never published whose last row is past the cutoff: the
        # drain above took each row it deleted off its tally (and a tally with no rows
        # left goes), so this only drops what a store left that no row matches.
        start, stop = keys.tallies_range(topic_id, generation, generation + 1)
        with self._store.read() as view:
            # A tally's value starts with its last position, comparable as bytes.
            old = [k for k, v in view.scan(_META, start, stop) if v[:10] < cutoff]

        def drop(view: WriteView, chunk: list[bytes]) -> None:
            now = live_cutoff.position(view)
            if now is not None:
                found = [(k, view.get(_META, k)) for k in chunk]
                _delete_metadata(view, [k for k, v in found if v is not None and v[:10] < now])

        self._in_batches(old, drop)

    def _in_batches(
        self, doomed: list[bytes], delete: Callable[[WriteView, list[bytes]], int | None]
    ) -> int:
        """``delete(view, chunk)`` over Metadata keys, ``batch`` of them per write;
        returns the sum of what the ``delete`` calls that committed returned."""
        total = 0
        for first in range(0, len(doomed), self._batch):
            chunk = doomed[first : first + self._batch]

            def write(view: WriteView, chunk: list[bytes] = chunk) -> int | None:
                return delete(view, chunk)

            total += self._store.apply(write) or 0
            self._batches += 1
        return total

    def _drain(
        self, table: str, start: bytes, stop: bytes, *, counted: _Cutoff | None = None
    ) -> None:
        """Delete ``[start, stop)``, ``batch`` rows per write; ``counted``: rows of a
        live generation below its retention cutoff (``start`` is the prefix the cutoff
        follows), taken off the topic's counts in the same write."""
        if not self._store.scan_list(table, start, stop, 1):
            return

        def delete(view: WriteView, batch: int) -> int:
            return view.delete_range(table, start, stop, batch)

        def delete_counted(view: WriteView, batch: int) -> int:
            assert counted is not None
            cutoff = counted.position(view)
            if cutoff is None:
                return 0  # the generation ended: the next pass drops all of it
            end = min(stop, start + cutoff)
            rows = list(view.scan(table, start, end, batch))
            if rows:
                accounting.forget_rows(view, table, rows)
                view.delete_range(table, start, end, len(rows))
            return len(rows)

        while True:
            removed, batch = self._apply_batch(delete if counted is None else delete_counted)
            self._batches += 1
            if table in self._deleted:  # seal markers are not counted as rows
                self._deleted[table] += removed
            if removed < batch:
                return

    def _apply_batch(self, fn: Callable[[WriteView, int], T]) -> tuple[T, int]:
        """``fn(view, batch)`` as one write, and the batch it ran with: ``batch`` rows,
        or fewer where the store is full. A full store may lack the room a deletion of
        a whole batch needs to commit (the new pages of the tree and the list of the
        pages it frees), and only deleting can make room: the batch is halved until
        a write goes through."""
        batch = self._batch
        while True:
            try:
                return self._store.apply(partial(_with_batch, fn, batch)), batch
            except StoreFull:
                if batch == 1:
                    raise
                batch //= 2

    def _clean_producers(self, now: int) -> int:
        """Forget idle producers; returns how many producer records are left."""
        # An idempotent producer idle past the expiry is forgotten: its next publish
        # (if any) starts a sequence afresh. Also drops deleted topics' producers.
        cutoff = now - self._producer_expiry_ms
        start, stop = producers_range()

        def doomed(key: bytes, value: bytes, live: set[tuple[int, int]]) -> bool:
            topic_id = int.from_bytes(key[len(start) : len(start) + 4], "big")
            generation = int.from_bytes(key[len(start) + 4 : len(start) + 8], "big")
            last_ms = int.from_bytes(value[8:16], "big", signed=True)
            return last_ms < cutoff or (topic_id, generation) not in live

        live = self._live()
        seen = 0
        idle: dict[bytes, bytes] = {}
        with self._store.read() as view:
            for k, v in view.scan(_META, start, stop):
                seen += 1
                if doomed(k, v, live):
                    idle[k] = v
        # A topic made after the live ones were listed, and published to before the
        # read, is live now: its producers stay.
        live = self._live()
        idle = {k: v for k, v in idle.items() if doomed(k, v, live)}

        def drop(view: WriteView, chunk: list[bytes]) -> int:
            # Only a record as it was read: one the producer published under meanwhile
            # (its time moved on) stays, or a retry of that publish would be a copy.
            dropped = 0
            for key in chunk:
                if view.get(_META, key) == idle[key]:
                    view.delete(_META, key)
                    dropped += 1
            return dropped

        return seen - self._in_batches(list(idle), drop)

    def _live(self) -> set[tuple[int, int]]:
        return {(topic_id, state.generation) for topic_id, state in self._topics.live_states()}

    def _clean_expired(self, now: int) -> None:
        start = keys.EXPIRY_PREFIX
        stop = keys.expiry_key(now + 1, "m", b"")[: len(start) + 8]
        if not self._store.scan_list(_META, start, stop, 1):
            return

        def delete(view: WriteView, batch: int) -> tuple[int, int, int]:
            entries = [k for k, _ in view.scan(_META, start, stop, batch)]
            found: dict[str, dict[bytes, bytes]] = {_MESSAGES: {}, _PAYLOADS: {}}
            for entry in entries:
                _, table, row_key = keys.parse_expiry_key(entry)
                value = view.get(table, row_key)
                if value is not None:  # else retention or its generation's drop took it
                    found[table][row_key] = value
                view.delete(_META, entry)
            for table, rows in found.items():
                accounting.forget_rows(view, table, sorted(rows.items()))
                for row_key in rows:
                    view.delete(table, row_key)
            return len(entries), len(found[_MESSAGES]), len(found[_PAYLOADS])

        while True:
            (entries, messages, payloads), batch = self._apply_batch(delete)
            self._batches += 1
            self._deleted[_MESSAGES] += messages
            self._deleted[_PAYLOADS] += payloads
            if entries < batch:
                return


@dataclass(frozen=True, slots=True)
class _Cutoff:
    """A live generation's retention cutoff at the pass's ``now``, read in the write
    that deletes by it from the state that write sees."""

    topic_id: int
    generation: int
    now: int

    def ms(self, view: WriteView) -> int | None:
        """The cutoff in ms; None if the generation is not the live one any more."""
        raw = view.get(_META, keys.state_key(self.topic_id))
        if raw is None:
            return None
        state = values.decode_state(raw)
        if state.generation != self.generation:
            return None
        return retention_cutoff(state, self.now)

    def position(self, view: WriteView) -> bytes | None:
        """The cutoff as the 10-byte ``ts | seq`` that keys end with."""
        ms = self.ms(view)
        return None if ms is None else keys.ts_seq(ms, 0)


def producers_range() -> tuple[bytes, bytes]:
    """``[start, stop)`` of every idempotent producer's record (Metadata table)."""
    start = keys.PRODUCER_PREFIX
    return start, start[:-1] + bytes((start[-1] + 1,))


def _with_batch(fn: Callable[[WriteView, int], T], batch: int, view: WriteView) -> T:
    return fn(view, batch)


def _delete_metadata(view: WriteView, doomed: list[bytes]) -> None:
    for key in doomed:
        view.delete(_META, key)

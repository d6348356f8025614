"""The cleaner: deletes expired rows and every row of older generations.

Seed 000 "Data Cleanup In Tables" (the LevelDB column: a periodic thread). Per topic:

* rows of older generations (``gen < abs(current)``, and all rows once deleted) in both
  tables: one contiguous key range per table (see :mod:`tidings.codec.keys`);
* Message Table rows older than ``now - ttl``: a key prefix of the live generation;
* Payload Table rows written before ``now - ttl``: a key prefix under each write pointer;
* rows past their own per-message expiry, found through the expiry index.

Every deletion runs in write functions of at most ``batch`` rows, each its own commit,
so a publish waits behind at most one batch, never a whole pass. Ranges are looked at
in a read snapshot first, so a pass over a clean store writes (and fsyncs) nothing.
Fetch hides expired rows by itself; the cleaner only reclaims space.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidings.clock import Clock
from tidings.codec import keys
from tidings.codec.values import TopicState
from tidings.messaging.fetching import retention_cutoff
from tidings.messaging.topics import Topics
from tidings.store.backend import Store, WriteView

__all__ = ["CleanupReport", "Cleaner"]

_META = "metadata"
_MESSAGES = "messages"
_PAYLOADS = "payloads"


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """What one cleaner pass did."""

    topics: int
    messages_deleted: int
    payloads_deleted: int
    batches: int
    seconds: float


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
        self._clean_producers(now)
        return CleanupReport(
            topics=len(states),
            messages_deleted=self._deleted[_MESSAGES],
            payloads_deleted=self._deleted[_PAYLOADS],
            batches=self._batches,
            seconds=time.monotonic() - began,
        )

    def _clean_topic(self, topic_id: int, state: TopicState, now: int) -> None:
        generation = state.generation
        live = generation if generation > 0 else -generation + 1
        start, stop = keys.older_generations_range(topic_id, live)
        self._drain(_MESSAGES, start, stop)
        self._drain(_PAYLOADS, start, stop)
        self._drain(_META, *keys.sealed_range(topic_id, 0, live))
        if generation <= 0:
            return
        self._clean_seals(topic_id, generation, retention_cutoff(state, now))
        cutoff = keys.ts_seq(retention_cutoff(state, now), 0)
        prefix, stop = keys.generation_range(topic_id, generation)
        self._drain(_MESSAGES, prefix, prefix + cutoff)
        for pointer_prefix in self._expired_pointers(prefix, stop, cutoff):
            self._drain(_PAYLOADS, pointer_prefix, pointer_prefix + cutoff)

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

    def _clean_seals(self, topic_id: int, generation: int, cutoff_ms: int) -> None:
        # A marker can go once its pointer entry is past the TTL: no fetch reaches that
        # entry any more, so rows stored under the pointer later are never exposed.
        start, stop = keys.sealed_range(topic_id, generation, generation + 1)
        with self._store.read() as view:
            old = [
                k for k, v in view.scan(_META, start, stop) if int.from_bytes(v, "big") < cutoff_ms
            ]
        self._delete_keys(old)

    def _delete_keys(self, doomed: list[bytes]) -> None:
        """Delete Metadata rows, ``batch`` per write."""
        for first in range(0, len(doomed), self._batch):
            chunk = doomed[first : first + self._batch]

            def delete(view: WriteView, chunk: list[bytes] = chunk) -> None:
                for key in chunk:
                    view.delete(_META, key)

            self._store.apply(delete)
            self._batches += 1

    def _drain(self, table: str, start: bytes, stop: bytes) -> None:
        if not self._store.scan_list(table, start, stop, 1):
            return
        batch = self._batch

        def delete(view: WriteView) -> int:
            return view.delete_range(table, start, stop, batch)

        while True:
            removed = self._store.apply(delete)
            self._batches += 1
            if table in self._deleted:  # seal markers are not counted as rows
                self._deleted[table] += removed
            if removed < batch:
                return

    def _clean_producers(self, now: int) -> None:
        # An idempotent producer idle past the expiry is forgotten: its next publish
        # (if any) starts a sequence afresh. Also drops deleted topics' producers.
        cutoff = now - self._producer_expiry_ms
        live = {(topic_id, state.generation) for topic_id, state in self._topics.live_states()}
        start = keys.PRODUCER_PREFIX
        stop = start[:-1] + bytes((start[-1] + 1,))
        with self._store.read() as view:
            idle = []
            for key, value in view.scan(_META, start, stop):
                topic_id = int.from_bytes(key[len(start) : len(start) + 4], "big")
                generation = int.from_bytes(key[len(start) + 4 : len(start) + 8], "big")
                last_ms = int.from_bytes(value[8:16], "big", signed=True)
                if last_ms < cutoff or (topic_id, generation) not in live:
                    idle.append(key)
        self._delete_keys(idle)

    def _clean_expired(self, now: int) -> None:
        start = keys.EXPIRY_PREFIX
        stop = keys.expiry_key(now + 1, "m", b"")[: len(start) + 8]
        if not self._store.scan_list(_META, start, stop, 1):
            return
        batch = self._batch

        def delete(view: WriteView) -> tuple[int, int, int]:
            entries = [k for k, _ in view.scan(_META, start, stop, batch)]
            removed = {_MESSAGES: 0, _PAYLOADS: 0}
            for entry in entries:
                _, table, row_key = keys.parse_expiry_key(entry)
                removed[table] += view.delete(table, row_key)
                view.delete(_META, entry)
            return len(entries), removed[_MESSAGES], removed[_PAYLOADS]

        while True:
            entries, messages, payloads = self._store.apply(delete)
            self._batches += 1
            self._deleted[_MESSAGES] += messages
            self._deleted[_PAYLOADS] += payloads
            if entries < batch:
                return

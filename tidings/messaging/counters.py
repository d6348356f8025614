"""Per-topic traffic counters the HTTP layer exports; the core only counts.

Counting is a few integer additions under one lock per publish or fetch (not per
message), so it stays off the profile of the hot paths.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LATENCY_BUCKETS", "Counters", "LatencyHistogram", "RateMeter", "TopicCounters"]

#: Upper bounds (seconds) of the publish latency buckets; the last one catches the rest.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    float("inf"),
)


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Publish latency (call to durable). ``counts[i]`` counts values in bucket ``i``:
    ``bounds[i-1] < v <= bounds[i]`` (not cumulative; see :meth:`cumulative`)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, count of values <= bound)`` pairs, as Prometheus wants them."""
        total = 0
        out: list[tuple[float, int]] = []
        for bound, n in zip(self.bounds, self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class TopicCounters:
    """A snapshot of one topic's counters since the service started.

    ``messages_published`` / ``bytes_published`` count payloads as they are written
    (publish and store; a later rollback does not subtract them).
    """

    messages_published: int
    bytes_published: int
    fetches: int
    messages_fetched: int
    publish_latency: LatencyHistogram


class RateMeter:
    """Events per second over the last ``window`` seconds, in one-second slots."""

    __slots__ = ("_slots", "_window")

    def __init__(self, window: int = 60) -> None:
        self._window = window
        self._slots: dict[int, int] = {}

    def add(self, n: int, now: float) -> None:
        second = int(now)
        self._slots[second] = self._slots.get(second, 0) + n
        if len(self._slots) > self._window + 1:
            horizon = second - self._window
            for old in [s for s in self._slots if s <= horizon]:
                del self._slots[old]

    def rate(self, now: float) -> float:
        horizon = int(now) - self._window
        return sum(n for s, n in self._slots.items() if s > horizon) / self._window


class _Topic:
    __slots__ = (
        "bytes_published",
        "fetch_rate",
        "fetches",
        "latency_counts",
        "latency_sum",
        "messages_fetched",
        "messages_published",
        "publish_rate",
    )

    def __init__(self) -> None:
        self.messages_published = 0
        self.bytes_published = 0
        self.fetches = 0
        self.messages_fetched = 0
        self.latency_counts = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.publish_rate = RateMeter()
        self.fetch_rate = RateMeter()


class Counters:
    """The counters of every topic this service has seen traffic for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._topics: dict[tuple[str, str], _Topic] = {}
        # Every publish's latency, kept apart from the topics': forgetting a deleted
        # topic must not take its publishes out of the histogram of all of them (its
        # counts would go down, which Prometheus reads as a restart).
        self._latency_counts = [0] * len(LATENCY_BUCKETS)
        self._latency_sum = 0.0

    def published(self, topic: tuple[str, str], messages: int, size: int, seconds: float) -> None:
        """Count one durable publish or store of ``messages`` payloads, ``size`` bytes."""
        bucket = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        now = time.monotonic()
        with self._lock:
            t = self._topic(topic)
            t.messages_published += messages
            t.bytes_published += size
            t.latency_counts[bucket] += 1
            t.latency_sum += seconds
            t.publish_rate.add(messages, now)
            self._latency_counts[bucket] += 1
            self._latency_sum += seconds

    def fetched(self, topic: tuple[str, str], messages: int) -> None:
        """Count one fetch that returned ``messages`` messages."""
        now = time.monotonic()
        with self._lock:
            t = self._topic(topic)
            t.fetches += 1
            t.messages_fetched += messages
            t.fetch_rate.add(1, now)

    def latency(self) -> LatencyHistogram:
        """The latency of every publish and store since the service started, deleted
        topics' included."""
        with self._lock:
            counts = tuple(self._latency_counts)
            return LatencyHistogram(LATENCY_BUCKETS, counts, self._latency_sum, sum(counts))

    def forget(self, topic: tuple[str, str]) -> None:
        """Drop a deleted topic's counters (its metric series go with them)."""
        with self._lock:
            self._topics.pop(topic, None)

    def snapshot(self) -> Mapping[tuple[str, str], TopicCounters]:
        """Immutable copies of every topic's counters."""
        with self._lock:
            return {key: self._freeze(t) for key, t in self._topics.items()}

    def get(self, topic: tuple[str, str]) -> TopicCounters:
        """One topic's counters (zeros if it had no traffic)."""
        with self._lock:
            t = self._topics.get(topic)
            return self._freeze(t if t is not None else _Topic())

    def rates(self, topic: tuple[str, str]) -> tuple[float, float]:
        """``(messages published per second, fetches per second)`` over the last minute."""
        now = time.monotonic()
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                return 0.0, 0.0
            return t.publish_rate.rate(now), t.fetch_rate.rate(now)

    def _topic(self, topic: tuple[str, str]) -> _Topic:
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = _Topic()
        return t

    @staticmethod
    def _freeze(t: _Topic) -> TopicCounters:
        return TopicCounters(
            messages_published=t.messages_published,
            bytes_published=t.bytes_published,
            fetches=t.fetches,
            messages_fetched=t.messages_fetched,
            publish_latency=LatencyHistogram(
                bounds=LATENCY_BUCKETS,
                counts=tuple(t.latency_counts),
                sum=t.latency_sum,
                count=sum(t.latency_counts),
            ),
        )

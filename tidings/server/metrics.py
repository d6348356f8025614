"""Prometheus metrics, counted cheaply on the request path and rendered at scrape time.

prometheus-client's own Counter/Histogram take a lock and build label children on
every call: ~10 us per request for a labelled counter plus histogram (measured), half
the cost of polling one message. So the request path only bumps plain integers here
(~0.8 us: one dict update and one list update, on the event loop thread, no lock), and
a custom collector turns them, the messaging core's per-topic counters, the
transaction service's state and the store's commit counter into metric families when
``/metrics`` is scraped. Names follow docs/api.md.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from tidings.messaging import LatencyHistogram, TopicCounters
from tidings.structs import QueueStats, TransactionState

__all__ = ["CONTENT_TYPE", "HTTP_BUCKETS", "HttpStats", "Metrics", "TxStats"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

log = logging.getLogger("tidings.server")

#: Upper bounds (seconds) of the request duration histogram; +Inf is implied.
HTTP_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class HttpStats:
    """Request counts by (method, route, status) and durations by route."""

    __slots__ = ("durations", "requests")

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        # route -> [count per bucket (last = above every bound)..., sum]
        self.durations: dict[str, list[float]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        slots = self.durations.get(route)
        if slots is None:
            slots = self.durations[route] = [0.0] * (len(HTTP_BUCKETS) + 2)
        slots[bisect.bisect_left(HTTP_BUCKETS, seconds)] += 1
        slots[-1] += seconds


@dataclass(slots=True)
class TxStats:
    """Outcomes of the transaction endpoints (the manager itself keeps no counters)."""

    begun: int = 0
    committed: int = 0
    aborted: int = 0
    invalidated: int = 0
    conflicts: int = 0
    #: Begins refused because ``tx_max_open`` transactions were open.
    refused: int = 0


@dataclass
class Sources:
    """Where scrape-time values come from; None for a service this process does not run."""

    topic_counters: Callable[[], Mapping[tuple[str, str], TopicCounters]] | None = None
    #: Every publish's latency, deleted topics' included (else summed over the topics).
    publish_latency: Callable[[], LatencyHistogram] | None = None
    #: Idempotent producers' records in the store (as the last cleaner pass counted).
    producer_records: Callable[[], int] | None = None
    tx_state: Callable[[], TransactionState] | None = None
    store_commits: Callable[[], int] | None = None
    tx_pruned: Callable[[], int] | None = None
    #: ``(namespace, topic, group, lag, exact)`` of every consumer group.
    group_lags: Callable[[], list[tuple[str, str, str, int | None, bool]]] | None = None
    #: ``(namespace, topic, stats)`` of every queue the server has used.
    queue_stats: Callable[[], list[tuple[str, str, QueueStats]]] | None = None


def _cumulative(bounds: Sequence[float], counts: Sequence[float]) -> list[tuple[str, float]]:
    """Prometheus buckets from per-bucket counts; the last bucket is +Inf (implied or not)."""
    if not bounds or bounds[-1] != float("inf"):
        bounds = (*bounds, float("inf"))
    out: list[tuple[str, float]] = []
    total = 0.0
    for bound, n in zip(bounds, counts, strict=True):
        total += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return out


@dataclass
class Metrics:
    """All of the server's metrics and the registry that renders them."""

    http: HttpStats = field(default_factory=HttpStats)
    tx: TxStats = field(default_factory=TxStats)
    sources: Sources = field(default_factory=Sources)
    registry: CollectorRegistry = field(init=False)

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics
        # Sections that failed at the last scrape: logged when they start failing.
        self._failing: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        for section in (
            self._topics,
            self._http,
            self._transaction_counts,
            self._transaction_state,
            self._groups,
            self._queues,
            self._store,
        ):
            # A source that fails (the transaction log stopped, say) leaves out its
            # own families, not the whole scrape: the rest is what shows the trouble.
            name = section.__name__
            try:
                families = list(section())
            except Exception:
                if name not in self._failing:
                    self._failing.add(name)
                    log.warning(
                        f"metrics: {name.strip('_')} left out, its source failed",
                        exc_info=True,
                        extra={"event": "metrics"},
                    )
                continue
            self._failing.discard(name)
            yield from families

    def _store(self) -> Iterator[Metric]:
        if self._m.sources.store_commits is not None:
            commits = self._m.sources.store_commits()
            family = CounterMetricFamily(
                "tidings_store_commits", "Write transactions committed (one fsync each)."
            )
            family.add_metric([], commits)
            yield family

    def _topics(self) -> Iterator[Metric]:
        if self._m.sources.topic_counters is None:
            return
        counters = self._m.sources.topic_counters()
        labels = ["namespace", "topic"]
        published = CounterMetricFamily(
            "tidings_messages_published", "Messages written by publish and store.", labels=labels
        )
        size = CounterMetricFamily(
            "tidings_bytes_published", "Payload bytes written by publish and store.", labels=labels
        )
        fetched = CounterMetricFamily(
            "tidings_messages_fetched", "Messages returned by polls.", labels=labels
        )
        fetches = CounterMetricFamily("tidings_fetches", "Polls served.", labels=labels)
        bounds: tuple[float, ...] = ()
        latency_counts: list[int] = []
        latency_sum = 0.0
        for (ns, topic), c in sorted(counters.items()):
            published.add_metric([ns, topic], c.messages_published)
            size.add_metric([ns, topic], c.bytes_published)
            fetched.add_metric([ns, topic], c.messages_fetched)
            fetches.add_metric([ns, topic], c.fetches)
            hist = c.publish_latency
            if not latency_counts:
                bounds, latency_counts = hist.bounds, [0] * len(hist.counts)
            for i, n in enumerate(hist.counts):
                latency_counts[i] += n
            latency_sum += hist.sum
        yield from (published, size, fetched, fetches)
        if self._m.sources.publish_latency is not None:
            hist = self._m.sources.publish_latency()
            bounds, latency_counts, latency_sum = hist.bounds, list(hist.counts), hist.sum
        latency = HistogramMetricFamily(
            "tidings_publish_latency_seconds",
            "Time from a publish or store call to its data being durable.",
        )
        latency.add_metric([], _cumulative(bounds, latency_counts or [0]), latency_sum)
        yield latency
        if self._m.sources.producer_records is not None:
            yield GaugeMetricFamily(
                "tidings_idempotent_producers",
                "Idempotent producers' records kept (one per producer id and topic), "
                "as the cleaner's last pass counted them.",
                value=self._m.sources.producer_records(),
            )

    def _http(self) -> Iterator[Metric]:
        http = self._m.http
        requests = CounterMetricFamily(
            "tidings_http_requests", "HTTP requests answered.", labels=["method", "route", "status"]
        )
        for (method, route, status), n in sorted(http.requests.items()):
            requests.add_metric([method, route, str(status)], n)
        yield requests
        durations = HistogramMetricFamily(
            "tidings_http_request_duration_seconds",
            "Time from routing a request to its response being ready.",
            labels=["route"],
        )
        for route, slots in sorted(http.durations.items()):
            durations.add_metric([route], _cumulative(HTTP_BUCKETS, slots[:-1]), slots[-1])
        yield durations

    def _transaction_counts(self) -> Iterator[Metric]:
        if self._m.sources.tx_state is None:
            return
        tx = self._m.tx
        for name, value, doc in (
            ("begun", tx.begun, "Transactions begun."),
            ("committed", tx.committed, "Transactions committed."),
            ("aborted", tx.aborted, "Transactions aborted."),
            ("invalidated", tx.invalidated, "Transactions invalidated by request."),
            ("conflicts", tx.conflicts, "Commits refused for a write conflict."),
            ("refused", tx.refused, "Begins refused: tx_max_open transactions were open."),
        ):
            family = CounterMetricFamily(f"tidings_transactions_{name}", doc)
            family.add_metric([], value)
            yield family
        pruned = self._m.sources.tx_pruned
        if pruned is not None:
            family = CounterMetricFamily(
                "tidings_transactions_pruned",
                "Invalid write pointers pruned automatically (no entry named them).",
            )
            family.add_metric([], pruned())
            yield family

    def _transaction_state(self) -> Iterator[Metric]:
        if self._m.sources.tx_state is None:
            return
        state = self._m.sources.tx_state()
        yield GaugeMetricFamily(
            "tidings_transactions_in_progress",
            "Transactions in progress.",
            value=len(state.in_progress),
        )
        yield GaugeMetricFamily(
            "tidings_transactions_invalid",
            "Write pointers on the invalid list.",
            value=len(state.invalid),
        )

    def _groups(self) -> Iterator[Metric]:
        if self._m.sources.group_lags is None:
            return
        lag = GaugeMetricFamily(
            "tidings_group_lag",
            "Read-committed messages after a consumer group's committed positions (a lower "
            "bound past 100,000 examined per group); absent for a group starting at latest "
            "that committed nothing.",
            labels=["namespace", "topic", "group"],
        )
        for namespace, topic, group, value, _ in self._m.sources.group_lags():
            # No series rather than a 0 that would read as "caught up" (Prometheus's way
            # of saying unknown; kafka_exporter likewise leaves such partitions out of its sum).
            if value is not None:
                lag.add_metric([namespace, topic, group], value)
        yield lag

    def _queues(self) -> Iterator[Metric]:
        if self._m.sources.queue_stats is None:
            return
        labels = ["namespace", "topic", "queue"]
        gauges = {
            "pending": GaugeMetricFamily(
                "tidings_queue_pending", "Messages leased to a queue's workers now.", labels=labels
            ),
            "waiting": GaugeMetricFamily(
                "tidings_queue_waiting",
                "Messages a queue could hand out now (its depth; a lower bound past 100,000).",
                labels=labels,
            ),
        }
        counters = {
            name: CounterMetricFamily(f"tidings_queue_{name}", text, labels=labels)
            for name, text in (
                ("popped", "Deliveries by a queue since the server started."),
                ("acked", "Messages acked in a queue since the server started."),
                ("nacked", "Messages nacked in a queue since the server started."),
                ("redelivered", "Deliveries after the first since the server started."),
                ("dead_lettered", "Messages moved to the dead-letter topic."),
                ("expired", "Messages whose lease ran out before an ack."),
            )
        }
        for namespace, topic, stats in self._m.sources.queue_stats():
            key = [namespace, topic, stats.queue]
            gauges["pending"].add_metric(key, stats.pending)
            gauges["waiting"].add_metric(key, stats.waiting)
            for name, family in counters.items():
                family.add_metric(key, getattr(stats, name))
        yield from gauges.values()
        yield from counters.values()

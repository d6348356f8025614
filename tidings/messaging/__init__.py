"""The messaging core (after CDAP TMS), transport-free: topics, publish, store, rollback,
fetch, retention and counters over a :class:`~tidings.store.Store`."""

from tidings.messaging.counters import LatencyHistogram, TopicCounters
from tidings.messaging.retention import CleanupReport
from tidings.messaging.service import MessagingConfig, MessagingService

__all__ = [
    "CleanupReport",
    "LatencyHistogram",
    "MessagingConfig",
    "MessagingService",
    "TopicCounters",
]

"""Tidings: a transactional messaging system.

Topics with one immutable order, transactional publish and consume, and exactly-once
pipelines on Spark. See README.md for a tour.
"""

from tidings.errors import *  # noqa: F403
from tidings.errors import __all__ as _error_names
from tidings.structs import (
    Message,
    MessageId,
    ProducerInfo,
    Record,
    RollbackInfo,
    TopicMetadata,
    TopicStats,
    Transaction,
    TransactionState,
)

__version__ = "0.1.0"

__all__ = [
    # value types
    "Message",
    "MessageId",
    "ProducerInfo",
    "Record",
    "RollbackInfo",
    "TopicMetadata",
    "TopicStats",
    "Transaction",
    "TransactionState",
    # errors (tidings.errors)
    *_error_names,
]

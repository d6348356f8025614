"""Tidings: a transactional messaging system.

Topics with one immutable order, transactional publish and consume, and exactly-once
pipelines on Spark. See README.md for a tour.
"""

from tidings.client import (
    AVRO,
    AVRO_EXT,
    JSON,
    AsyncClient,
    AsyncConsumer,
    AsyncPublisher,
    AsyncTransactionalPublisher,
    AsyncTransactionAware,
    AsyncTransactionContext,
    Client,
    Consumer,
    Media,
    Publisher,
    RetryPolicy,
    TransactionalPublisher,
    TransactionAware,
    TransactionContext,
)
from tidings.errors import *  # noqa: F403
from tidings.errors import __all__ as _error_names
from tidings.structs import (
    Message,
    MessageId,
    PayloadRange,
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
    # clients (tidings.client)
    "AsyncClient",
    "Client",
    "RetryPolicy",
    # body encodings of publish, store and poll (tidings.codec.wire)
    "AVRO",
    "AVRO_EXT",
    "JSON",
    "Media",
    # publishing and consuming
    "AsyncConsumer",
    "AsyncPublisher",
    "Consumer",
    "Publisher",
    # transactions across the messaging system and your own participants
    "AsyncTransactionAware",
    "AsyncTransactionContext",
    "AsyncTransactionalPublisher",
    "TransactionAware",
    "TransactionContext",
    "TransactionalPublisher",
    # value types
    "Message",
    "MessageId",
    "PayloadRange",
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

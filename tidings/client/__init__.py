"""The Python client: :class:`Client` (sync) and :class:`AsyncClient` over the REST API.

Both share every decision in :mod:`.base` and differ only in how they do I/O
(:mod:`.transports`). See docs/client.md.
"""

from tidings.client.async_client import AsyncClient
from tidings.client.base import MessageLike, RetryPolicy, StartPosition
from tidings.client.consumer import AsyncConsumer, Consumer
from tidings.client.publisher import AsyncPublisher, Publisher
from tidings.client.sync_client import Client
from tidings.client.transactions import (
    AsyncTransactionAware,
    AsyncTransactionContext,
    TransactionAware,
    TransactionContext,
)
from tidings.client.txpublisher import AsyncTransactionalPublisher, TransactionalPublisher
from tidings.codec.wire import AVRO, AVRO_EXT, JSON, Media

__all__ = [
    # clients
    "AsyncClient",
    "Client",
    "RetryPolicy",
    # body encodings
    "AVRO",
    "AVRO_EXT",
    "JSON",
    "Media",
    # publishing and consuming
    "AsyncConsumer",
    "AsyncPublisher",
    "Consumer",
    "MessageLike",
    "Publisher",
    "StartPosition",
    # transactions
    "AsyncTransactionAware",
    "AsyncTransactionContext",
    "AsyncTransactionalPublisher",
    "TransactionAware",
    "TransactionContext",
    "TransactionalPublisher",
]

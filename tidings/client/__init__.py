"""The Python client: :class:`Client` (sync) and :class:`AsyncClient` over the REST API.

The async code in :mod:`._async` is the one source: :mod:`._sync` is generated from
it (``python scripts/unasync.py``). Every decision without I/O is in the modules
beside them (:mod:`.base`, :mod:`.api`, :mod:`.cursor`, :mod:`.batching`,
:mod:`.txbuffer`, :mod:`.txcontext`). See docs/client.md.
"""

from tidings.client._async.client import AsyncClient
from tidings.client._async.consumer import AsyncConsumer
from tidings.client._async.group_consumer import AsyncGroupConsumer
from tidings.client._async.publisher import AsyncPublisher
from tidings.client._async.queue import AsyncQueue
from tidings.client._async.transactions import AsyncTransactionAware, AsyncTransactionContext
from tidings.client._async.txpublisher import AsyncTransactionalPublisher
from tidings.client._sync.client import Client
from tidings.client._sync.consumer import Consumer
from tidings.client._sync.group_consumer import GroupConsumer
from tidings.client._sync.publisher import Publisher
from tidings.client._sync.queue import Queue
from tidings.client._sync.transactions import TransactionAware, TransactionContext
from tidings.client._sync.txpublisher import TransactionalPublisher
from tidings.client.base import MessageLike, RetryPolicy, StartPosition
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
    "AsyncGroupConsumer",
    "AsyncPublisher",
    "AsyncQueue",
    "Consumer",
    "GroupConsumer",
    "MessageLike",
    "Publisher",
    "Queue",
    "StartPosition",
    # transactions
    "AsyncTransactionAware",
    "AsyncTransactionContext",
    "AsyncTransactionalPublisher",
    "TransactionAware",
    "TransactionContext",
    "TransactionalPublisher",
]

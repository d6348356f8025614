"""Tidings: a transactional messaging system.

Topics with one immutable order, transactional publish and consume, and exactly-once
pipelines on Spark. See README.md for a tour.
"""

import typing as _typing

from tidings.errors import *  # noqa: F403
from tidings.errors import __all__ as _error_names
from tidings.structs import *  # noqa: F403
from tidings.structs import __all__ as _struct_names

if _typing.TYPE_CHECKING:
    from tidings.client import *  # noqa: F403

__version__ = "0.1.0"

# The client's names, loaded on first use: every module of the server is in this
# package too, and a server start need not load the whole client (tidings.client's
# __all__, which tests/test_exported_members.py keeps equal to this).
_client_names = [
    "AVRO",
    "AVRO_EXT",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncPublisher",
    "AsyncQueue",
    "AsyncTransactionAware",
    "AsyncTransactionContext",
    "AsyncTransactionalPublisher",
    "Client",
    "Consumer",
    "GroupConsumer",
    "JSON",
    "Media",
    "MessageLike",
    "Publisher",
    "Queue",
    "RetryPolicy",
    "StartPosition",
    "TransactionAware",
    "TransactionContext",
    "TransactionalPublisher",
]

#: The clients, their publishers, consumers and transactions, and the body encodings
#: (tidings.client); the value types (tidings.structs); the errors (tidings.errors).
__all__ = [*_client_names, *_struct_names, *_error_names]


def __getattr__(name: str) -> _typing.Any:
    if name in _client_names:
        import tidings.client

        value = getattr(tidings.client, name)
        globals()[name] = value  # once: later lookups are plain attribute reads
        return value
    raise AttributeError(f"module 'tidings' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_client_names})

"""Tidings: a transactional messaging system.

Topics with one immutable order, transactional publish and consume, and exactly-once
pipelines on Spark. See README.md for a tour.
"""

from tidings.client import *  # noqa: F403
from tidings.client import __all__ as _client_names
from tidings.errors import *  # noqa: F403
from tidings.errors import __all__ as _error_names
from tidings.structs import *  # noqa: F403
from tidings.structs import __all__ as _struct_names

__version__ = "0.1.0"

#: The clients, their publishers, consumers and transactions, and the body encodings
#: (tidings.client); the value types (tidings.structs); the errors (tidings.errors).
__all__ = [*_client_names, *_struct_names, *_error_names]

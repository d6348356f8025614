"""Ordered key-value tables: the :class:`Store` interface and its backends."""

from tidings.store.backend import TABLES, ReadView, Store, WriteView
from tidings.store.backends.lmdb import LmdbStore
from tidings.store.backends.memory import MemoryStore

__all__ = ["TABLES", "LmdbStore", "MemoryStore", "ReadView", "Store", "WriteView"]

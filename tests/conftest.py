"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tidings.store import MemoryStore, Store

# The suite shares two cores with whatever else CI runs: a property's examples may take
# longer than hypothesis's 200 ms deadline without anything being wrong, and timing is
# not among the properties tested. Tests that set their own settings keep this default.
settings.register_profile("tidings", deadline=None)
settings.load_profile("tidings")

STORE_KINDS = ["memory", "lmdb"]


def make_store(kind: str, path: Path) -> Store:
    """A fresh store of ``kind`` ("memory" or "lmdb") with its data under ``path``."""
    if kind == "memory":
        return MemoryStore()
    if kind == "lmdb":
        from tidings.store.backends.lmdb import LmdbStore

        return LmdbStore(path / "store")
    raise ValueError(kind)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every store backend in turn: one suite runs against all of them."""
    s = make_store(request.param, tmp_path)
    try:
        yield s
    finally:
        s.close()

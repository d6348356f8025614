"""Store contract cases found wanting on the PostgreSQL store, run against every
backend (the ``store`` fixture), and what only the PostgreSQL store does."""

from __future__ import annotations

import pytest

from tidings.store import Store, WriteView

M = "messages"
END = b"\xff" * 8


class Boom(Exception):
    pass


def _fill(store: Store) -> None:
    store.apply(lambda view: view.put_many(M, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]))


def test_a_range_delete_of_a_function_that_raises_is_undone(store: Store) -> None:
    # The range delete is the function's first write: nothing of its own was buffered
    # before it, and the PostgreSQL store then took no savepoint to roll back to.
    _fill(store)

    def failing(view: WriteView) -> None:
        view.delete_range(M, b"a", b"c")
        raise Boom("no")

    with pytest.raises(Boom):
        store.submit(failing).result()
    assert store.scan_list(M, b"", END) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_a_range_delete_after_a_scan_of_a_function_that_raises_is_undone(store: Store) -> None:
    _fill(store)

    def failing(view: WriteView) -> None:
        assert len(list(view.scan(M, b"", END))) == 3
        view.delete_range(M, b"b", END, limit=1)
        view.put(M, b"d", b"4")
        assert [k for k, _ in view.scan(M, b"", END)] == [b"a", b"c", b"d"]
        raise Boom("no")

    with pytest.raises(Boom):
        store.submit(failing).result()
    assert store.scan_list(M, b"", END) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]

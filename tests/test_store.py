"""The Store contract, run against every backend (the ``store`` fixture)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.store import TABLES, Store, WriteView

M = "messages"
P = "payloads"
END = b"\xff" * 8  # above every key these tests write


def put(store: Store, key: bytes, value: bytes, table: str = M) -> None:
    store.apply(lambda view: view.put(table, key, value))


def everything(store: Store, table: str = M) -> list[tuple[bytes, bytes]]:
    return store.scan_list(table, b"", END)


@contextmanager
def writer_held(store: Store) -> Iterator[None]:
    """Hold a threaded writer so that what is submitted inside the block forms one group.

    A store that runs write functions in the caller's thread (MemoryStore) is not held.
    """
    running = threading.Event()
    release = threading.Event()
    caller = threading.get_ident()

    def gate(view: WriteView) -> None:
        running.set()
        if threading.get_ident() != caller:
            release.wait(10)

    gated = store.submit(gate)
    running.wait(10)  # the gate's group has started: later submits queue behind it
    try:
        yield
    finally:
        release.set()
        gated.result()


class Boom(Exception):
    pass


def test_get_put_delete(store: Store) -> None:
    assert store.get(M, b"k") is None
    put(store, b"k", b"v1")
    assert store.get(M, b"k") == b"v1"
    put(store, b"k", b"v2")
    assert store.get(M, b"k") == b"v2"
    assert store.get(P, b"k") is None  # tables are separate
    assert store.apply(lambda v: v.delete(M, b"k")) is True
    assert store.apply(lambda v: v.delete(M, b"k")) is False
    assert store.get(M, b"k") is None


def test_unknown_table_is_a_value_error(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown table"):
        store.get("nope", b"k")
    with pytest.raises(ValueError, match="unknown table"):
        store.apply(lambda v: v.put("nope", b"k", b"v"))


def test_scan_bounds_and_limits(store: Store) -> None:
    store.apply(lambda v: v.put_many(M, [(bytes([c]), b"%d" % c) for c in b"abcdef"]))
    keys = lambda items: b"".join(k for k, _ in items)  # noqa: E731
    assert keys(store.scan_list(M, b"b", b"e")) == b"bcd"  # start included, stop excluded
    assert keys(store.scan_list(M, b"bb", b"e")) == b"cd"
    assert keys(store.scan_list(M, b"", END)) == b"abcdef"
    assert keys(store.scan_list(M, b"a", b"z", limit=2)) == b"ab"
    assert keys(store.scan_list(M, b"e", b"z", limit=5)) == b"ef"
    assert store.scan_list(M, b"a", b"z", limit=0) == []
    assert store.scan_list(M, b"d", b"d") == []
    assert store.scan_list(M, b"e", b"b") == []
    assert store.scan_list(M, b"x", b"z") == []
    assert store.scan_list(M, b"c", b"d") == [(b"c", b"99")]


def test_last_below_with_floor(store: Store) -> None:
    store.apply(lambda v: v.put_many(M, [(b"a1", b"1"), (b"a3", b"3"), (b"b1", b"4")]))
    assert store.last_below(M, b"a3") == (b"a1", b"1")  # bound is exclusive
    assert store.last_below(M, b"a4") == (b"a3", b"3")
    assert store.last_below(M, b"z") == (b"b1", b"4")
    assert store.last_below(M, b"a1") is None
    assert store.last_below(M, b"") is None
    assert store.last_below(M, b"b2", floor=b"b") == (b"b1", b"4")
    assert store.last_below(M, b"b0", floor=b"b") is None  # a3 is below the floor
    assert store.last_below(M, b"a4", floor=b"a3") == (b"a3", b"3")  # floor is inclusive
    assert store.last_below(P, b"z") is None


def test_delete_range_with_limit(store: Store) -> None:
    store.apply(lambda v: v.put_many(M, [(b"k%d" % i, b"v") for i in range(10)]))
    assert store.apply(lambda v: v.delete_range(M, b"k2", b"k8", limit=3)) == 3
    assert [k for k, _ in everything(store)] == [b"k%d" % i for i in (0, 1, 5, 6, 7, 8, 9)]
    assert store.apply(lambda v: v.delete_range(M, b"k2", b"k8")) == 3
    assert store.apply(lambda v: v.delete_range(M, b"k0", b"k9", limit=0)) == 0
    assert store.apply(lambda v: v.delete_range(M, b"", END)) == 4
    assert everything(store) == []
    assert store.apply(lambda v: v.delete_range(M, b"", END)) == 0


def test_put_many(store: Store) -> None:
    put(store, b"b", b"old")
    items = [(b"c", b"3"), (b"a", b"1"), (b"b", b"2"), (b"c", b"33")]  # unsorted, a duplicate
    store.apply(lambda v: v.put_many(M, items))
    assert everything(store) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"33")]
    batch = [(b"m%05d" % i, bytes(100)) for i in range(500)]
    store.apply(lambda v: v.put_many(M, iter(batch)))  # any iterable
    assert store.scan_list(M, b"m", b"n") == batch
    store.apply(lambda v: v.put_many(M, []))


def test_put_many_append_is_only_a_hint(store: Store) -> None:
    tail = [(b"t%03d" % i, b"%d" % i) for i in range(300)]
    store.apply(lambda v: v.put_many(M, tail, append=True))  # after every key: appended
    # Below the table's last key, with duplicates and out of order: written all the same.
    middle = [(b"m2", b"x"), (b"m1", b"y"), (b"t005", b"new"), (b"m2", b"z"), (b"z", b"last")]
    store.apply(lambda v: v.put_many(M, iter(middle), append=True))
    expected = dict(tail) | {b"m1": b"y", b"m2": b"z", b"t005": b"new", b"z": b"last"}
    assert everything(store) == sorted(expected.items())


def test_failed_write_leaves_nothing_and_spares_the_group(store: Store) -> None:
    put(store, b"x", b"before")

    def failing(view: WriteView) -> None:
        view.put(M, b"f1", b"v")
        view.put_many(M, [(b"f2", b"v")])
        view.put(P, b"f3", b"v")
        view.delete(M, b"x")
        view.delete_range(M, b"a", b"z")
        raise Boom("no")

    with writer_held(store):
        first = store.submit(lambda v: v.put(M, b"a", b"1"))
        bad = store.submit(failing)
        last = store.submit(lambda v: v.put(M, b"b", b"2") or "done")
    assert first.result() is None
    with pytest.raises(Boom):
        bad.result()
    assert last.result() == "done"
    assert everything(store) == [(b"a", b"1"), (b"b", b"2"), (b"x", b"before")]
    assert everything(store, P) == []


def test_snapshot_isolation(store: Store) -> None:
    put(store, b"a", b"1")
    with store.read() as view:
        put(store, b"b", b"2")
        store.apply(lambda v: v.delete(M, b"a"))
        assert list(view.scan(M, b"", END)) == [(b"a", b"1")]
        assert view.get(M, b"a") == b"1"
        assert view.get(M, b"b") is None
        assert view.last_below(M, END) == (b"a", b"1")
    assert everything(store) == [(b"b", b"2")]


def test_write_view_sees_own_and_earlier_writes(store: Store) -> None:
    def second(view: WriteView) -> tuple[Any, ...]:
        seen_earlier = view.get(M, b"k1")
        view.put(M, b"k2", b"v2")
        view.delete(M, b"k0")
        return (
            seen_earlier,
            view.get(M, b"k2"),
            list(view.scan(M, b"", END)),
            view.last_below(M, END),
        )

    put(store, b"k0", b"v0")
    with writer_held(store):
        store.submit(lambda v: v.put(M, b"k1", b"v1"))
        result = store.submit(second)
    assert result.result() == (
        b"v1",
        b"v2",
        [(b"k1", b"v1"), (b"k2", b"v2")],
        (b"k2", b"v2"),
    )


def test_a_write_read_back_after_a_scan_is_the_new_value(store: Store) -> None:
    # A scan makes a buffering writer send its writes ahead of the commit; a read of a
    # key after it must see the value just written, not the committed one it may
    # remember (PostgreSQL's writer remembers values it read or committed).
    put(store, b"k", b"old")
    store.submit(lambda v: v.get(M, b"k")).result()  # read once: remembered
    store.submit(lambda v: v.get(M, b"n")).result()  # absent: remembered as such

    def rewrite(view: WriteView) -> tuple[Any, ...]:
        view.put(M, b"k", b"new")
        view.put(M, b"n", b"born")
        list(view.scan(M, b"", END))
        return view.get(M, b"k"), view.get(M, b"n")

    assert store.submit(rewrite).result() == (b"new", b"born")
    assert store.submit(lambda v: (v.get(M, b"k"), v.get(M, b"n"))).result() == (b"new", b"born")


def test_multi_table_atomicity(store: Store) -> None:
    def both(fail: bool) -> Any:
        def fn(view: WriteView) -> None:
            view.put(M, b"m", b"%d" % fail)
            view.put(P, b"p", b"%d" % fail)
            view.put("tx", b"t", b"%d" % fail)
            if fail:
                raise Boom

        return fn

    with pytest.raises(Boom):
        store.apply(both(True))
    with store.read() as view:
        assert [view.get(t, k) for t, k in ((M, b"m"), (P, b"p"), ("tx", b"t"))] == [None] * 3
    store.apply(both(False))
    with store.read() as view:
        assert [view.get(t, k) for t, k in ((M, b"m"), (P, b"p"), ("tx", b"t"))] == [b"0"] * 3


def test_submit_from_many_threads(store: Store) -> None:
    def writer(n: int) -> None:
        for i in range(20):
            key = b"t%02d-%03d" % (n, i)
            store.apply(lambda v, key=key: v.put(M, key, key))
            assert store.get(M, key) == key  # durable and visible once apply returns

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(everything(store)) == 160


async def test_submit_from_asyncio(store: Store) -> None:
    def write(i: int) -> Future[int]:
        return store.submit(lambda v: v.put(M, b"%02d" % i, b"") or i)

    def fail(view: WriteView) -> None:
        raise Boom

    results = await asyncio.gather(*(asyncio.wrap_future(write(i)) for i in range(20)))
    assert results == list(range(20))
    assert len(everything(store)) == 20
    with pytest.raises(Boom):
        await asyncio.wrap_future(store.submit(fail))


def test_closed_store_refuses_work(store: Store) -> None:
    store.close()
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.submit(lambda v: None)


# A model check: random operation sequences against a plain dict.

_keys = st.lists(st.sampled_from(b"ab\x00\xff"), min_size=1, max_size=3).map(bytes)
_bounds = st.lists(st.sampled_from(b"ab\x00\xff"), max_size=3).map(bytes)
_limits = st.none() | st.integers(0, 4)
_writes = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TABLES[:2]), _keys, st.binary(max_size=3)),
    st.tuples(st.just("delete"), st.sampled_from(TABLES[:2]), _keys),
    st.tuples(st.just("delete_range"), st.just(M), _bounds, _bounds, _limits),
    st.tuples(st.just("put_many"), st.just(M), st.lists(st.tuples(_keys, st.binary(max_size=2)))),
    # append=True is only a hint: any run of keys, in any order, must give the same table.
    st.tuples(
        st.just("put_many_append"), st.just(M), st.lists(st.tuples(_keys, st.binary(max_size=2)))
    ),
    # A write function's own reads (a store may answer them from what it wrote or
    # read before: they must still be what is committed).
    st.tuples(st.just("get"), st.sampled_from(TABLES[:2]), _keys),
)
_ops = st.one_of(
    _writes,
    st.tuples(st.just("fail"), st.just(M), _keys),
    # A function that raises after its writes went out under a savepoint (a scan
    # flushes them).
    st.tuples(st.just("fail_flushed"), st.sampled_from(TABLES[:2]), _keys),
)
_reads = st.one_of(
    st.tuples(st.just("scan"), _bounds, _bounds, _limits),
    st.tuples(st.just("last_below"), _bounds, _bounds),
    st.tuples(st.just("get"), _keys),
)


def _apply_to_model(model: dict[str, dict[bytes, bytes]], op: tuple[Any, ...]) -> Any:
    kind, table, *args = op
    data = model[table]
    if kind == "put":
        data[args[0]] = args[1]
    elif kind == "delete":
        return data.pop(args[0], None) is not None
    elif kind == "delete_range":
        start, stop, limit = args
        doomed = sorted(k for k in data if start <= k < stop)[:limit]
        for k in doomed:
            del data[k]
        return len(doomed)
    elif kind in ("put_many", "put_many_append"):
        data.update(args[0])
    elif kind == "get":
        return data.get(args[0])
    return None


def _apply_to_view(view: WriteView, op: tuple[Any, ...]) -> Any:
    kind, table, *args = op
    if kind == "fail":
        view.put(table, args[0], b"doomed")
        raise Boom
    if kind == "fail_flushed":
        view.put(table, args[0], b"doomed")
        list(view.scan(table, b"", END))
        assert view.get(table, args[0]) == b"doomed"
        raise Boom
    if kind == "put_many_append":
        return view.put_many(table, *args, append=True)
    return getattr(view, kind)(table, *args)


def _read_model(data: dict[bytes, bytes], read: tuple[Any, ...]) -> Any:
    kind, *args = read
    keys = sorted(data)
    if kind == "scan":
        start, stop, limit = args
        return [(k, data[k]) for k in keys if start <= k < stop][:limit]
    if kind == "last_below":
        bound, floor = args
        below = [k for k in keys if floor <= k < bound]
        return (below[-1], data[below[-1]]) if below else None
    return data.get(args[0])


def _read_view(view: Any, read: tuple[Any, ...]) -> Any:
    kind, *args = read
    if kind == "scan":
        return list(view.scan(M, *args))
    return getattr(view, kind)(M, *args)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(st.tuples(_ops, _reads), max_size=15))
def test_matches_a_dict_model(store: Store, steps: list[tuple[Any, Any]]) -> None:
    store.apply(lambda v: [v.delete_range(t, b"", END) for t in TABLES])  # a fresh example
    model: dict[str, dict[bytes, bytes]] = {t: {} for t in TABLES}
    for op, read in steps:
        expected = _apply_to_model(model, op)
        future = store.submit(lambda v, op=op: _apply_to_view(v, op))
        if op[0] in ("fail", "fail_flushed"):
            with pytest.raises(Boom):
                future.result()
        else:
            assert future.result() == expected
        with store.read() as view:
            assert _read_view(view, read) == _read_model(model[M], read)
            for table in TABLES[:2]:
                assert list(view.scan(table, b"", END)) == sorted(model[table].items())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rounds=st.lists(st.lists(st.lists(_writes, max_size=6), max_size=4), max_size=5))
def test_functions_of_many_writes_submitted_together_match_a_dict_model(
    store: Store, rounds: list[list[list[tuple[Any, ...]]]]
) -> None:
    # Several writes of one key in one function and across the functions of one group
    # (a store that buffers a group's writes must keep only the last of each key).
    store.apply(lambda v: [v.delete_range(t, b"", END) for t in TABLES])
    model: dict[str, dict[bytes, bytes]] = {t: {} for t in TABLES}
    for functions in rounds:
        submitted = []
        for ops in functions:
            expected = [_apply_to_model(model, op) for op in ops]
            future = store.submit(lambda v, ops=ops: [_apply_to_view(v, op) for op in ops])
            submitted.append((future, expected))
        for future, expected in submitted:
            assert future.result() == expected
        with store.read() as view:
            for table in TABLES[:2]:
                assert list(view.scan(table, b"", END)) == sorted(model[table].items())


def test_the_last_write_of_a_key_in_one_group_wins_whatever_its_kind(store: Store) -> None:
    # A slow function holds the writer, so that the functions after it queue up and
    # go into one group commit together.
    store.apply(lambda v: [v.delete_range(t, b"", END) for t in TABLES])
    store.apply(lambda v: v.put(M, b"d", b"stored"))
    first = store.submit(lambda v: time.sleep(0.3))
    steps: list[Callable[[WriteView], Any]] = [
        lambda v: v.put(M, b"a", b"plain"),
        lambda v: v.put_many(M, [(b"a", b"appended")], append=True),
        lambda v: v.put_many(M, [(b"b", b"appended")], append=True),
        lambda v: v.put(M, b"b", b"plain"),
        lambda v: v.put_many(M, [(b"c", b"appended")], append=True),
        lambda v: v.delete(M, b"c"),
        lambda v: v.put_many(M, [(b"d", b"appended")], append=True),
        lambda v: (v.get(M, b"a"), v.get(M, b"b"), v.get(M, b"c"), v.get(M, b"d")),
    ]
    futures = [store.submit(step) for step in steps]
    first.result()
    answers = [f.result() for f in futures]
    assert answers[-1] == (b"appended", b"plain", None, b"appended")
    with store.read() as view:
        assert list(view.scan(M, b"", END)) == [
            (b"a", b"appended"),
            (b"b", b"plain"),
            (b"d", b"appended"),
        ]

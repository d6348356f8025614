"""What only the LMDB store promises: group commit, durability, other processes reading."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

import tidings
from tests.test_store import END, Boom, M, P, writer_held
from tidings.store import LmdbStore, WriteView

REPO = str(Path(tidings.__file__).resolve().parent.parent)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(path)
    try:
        yield s
    finally:
        s.close()


def run_python(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_concurrent_writers_share_commits(store: LmdbStore) -> None:
    def writer(n: int) -> None:
        for i in range(50):
            key = b"%02d-%03d" % (n, i)
            store.apply(lambda v, key=key: v.put(M, key, b"v"))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.writes == 800
    assert len(store.scan_list(M, b"", END)) == 800
    # Every thread waits for its own commit, so up to 16 writes can share each one.
    assert store.commits <= store.writes // 2


def test_queued_functions_form_one_commit(store: LmdbStore) -> None:
    before = store.commits
    with writer_held(store):
        futures = [store.submit(lambda v, i=i: v.put(M, b"%d" % i, b"v")) for i in range(10)]
        time.sleep(0.05)
        assert not any(f.done() for f in futures)  # nothing is acknowledged before commit
    for f in futures:
        f.result()
    assert store.commits - before == 2  # the holding function's commit, then all ten
    assert store.writes == 11


def test_failed_function_shares_the_commit_of_the_others(store: LmdbStore) -> None:
    def fail(view: WriteView) -> None:
        view.put(M, b"bad", b"v")
        raise Boom

    before = store.commits
    with writer_held(store):
        ok = store.submit(lambda v: v.put(M, b"good", b"v"))
        bad = store.submit(fail)
    ok.result()
    with pytest.raises(Boom):
        bad.result()
    assert store.commits - before == 2  # the holding function's commit, then both
    assert store.scan_list(M, b"", END) == [(b"good", b"v")]


def test_a_caller_returns_after_its_own_commit(store: LmdbStore) -> None:
    seen: list[bool] = []

    def writer(n: int) -> None:
        for i in range(30):
            key = b"%d-%d" % (n, i)
            store.apply(lambda v, key=key: v.put(M, key, b"v"))
            seen.append(store.get(M, key) == b"v")  # a fresh snapshot, straight away

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 240 and all(seen)


def test_cancelled_function_never_runs(store: LmdbStore) -> None:
    with writer_held(store):
        doomed = store.submit(lambda v: v.put(M, b"doomed", b"v"))
        assert doomed.cancel()
    store.apply(lambda v: None)
    assert store.get(M, b"doomed") is None


def test_inline_write_commits_in_the_callers_thread_when_nothing_else_runs(
    store: LmdbStore,
) -> None:
    threads: list[int] = []

    def put(view: WriteView) -> str:
        threads.append(threading.get_ident())
        view.put(M, b"here", b"v")
        return "done"

    # Without a check (the default) nothing commits in the caller's thread.
    assert store.submit_inline(put).result() == "done"
    assert threads[-1] != threading.get_ident()
    store.set_inline_check(lambda: True)
    before = store.commits
    future = store.submit_inline(put)
    assert future.done() and future.result() == "done"  # resolved before it returned
    assert threads[-1] == threading.get_ident()
    assert store.commits == before + 1
    assert store.get(M, b"here") == b"v"
    # Plain submit never does.
    store.submit(put).result()
    assert threads[-1] != threading.get_ident()
    # Nor does submit_inline while the check says no.
    store.set_inline_check(lambda: False)
    store.submit_inline(put).result()
    assert threads[-1] != threading.get_ident()


def test_inline_write_queues_behind_a_running_commit(store: LmdbStore) -> None:
    store.set_inline_check(lambda: True)
    with writer_held(store):
        queued = store.submit_inline(lambda v: v.put(M, b"queued", b"v"))
        time.sleep(0.05)
        # The writer's commit holds LMDB's one write transaction: this one waits.
        assert not queued.done()
    queued.result()
    assert store.get(M, b"queued") == b"v"


def test_no_inline_write_while_writes_have_company(store: LmdbStore) -> None:
    store.set_inline_check(lambda: True)
    threads: list[int] = []

    def put(view: WriteView) -> None:
        threads.append(threading.get_ident())

    with writer_held(store):
        grouped = [store.submit(put), store.submit(put)]
    for f in grouped:
        f.result()  # the writer just committed a group of two
    store.submit_inline(put).result()
    assert threads[-1] != threading.get_ident()  # concurrent writers: keep grouping
    time.sleep(0.1)  # a while of lone writes only (see _COMPANY)
    store.submit_inline(put).result()
    assert threads[-1] == threading.get_ident()


def test_writer_waits_for_an_inline_commit(store: LmdbStore) -> None:
    store.set_inline_check(lambda: True)
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def slow(view: WriteView) -> None:
        inside.set()
        release.wait(10)
        view.put(M, b"k", b"inline")
        order.append("inline")

    def later(view: WriteView) -> None:
        order.append("writer")
        view.put(M, b"k", b"writer")

    caller = threading.Thread(target=lambda: store.submit_inline(slow).result())
    caller.start()
    assert inside.wait(10)
    queued = store.submit(later)
    time.sleep(0.05)
    assert not queued.done()  # no second write transaction beside the inline one
    release.set()
    caller.join(10)
    queued.result()
    assert order == ["inline", "writer"]
    assert store.get(M, b"k") == b"writer"


def test_inline_write_that_raises_leaves_nothing(store: LmdbStore) -> None:
    store.set_inline_check(lambda: True)

    def fail(view: WriteView) -> None:
        view.put(M, b"bad", b"v")
        raise Boom

    future = store.submit_inline(fail)
    assert future.done()
    with pytest.raises(Boom):
        future.result()
    assert store.get(M, b"bad") is None
    store.submit_inline(lambda v: v.put(M, b"after", b"v")).result()
    assert store.scan_list(M, b"", END) == [(b"after", b"v")]


def test_close_waits_for_an_inline_commit(path: Path) -> None:
    store = LmdbStore(path)
    store.set_inline_check(lambda: True)
    inside = threading.Event()

    def slow(view: WriteView) -> None:
        inside.set()
        time.sleep(0.1)
        view.put(M, b"k", b"v")

    caller = threading.Thread(target=lambda: store.submit_inline(slow).result())
    caller.start()
    assert inside.wait(10)
    store.close()
    caller.join(10)
    with LmdbStore(path, readonly=True) as again:
        assert again.get(M, b"k") == b"v"


def test_reopen_keeps_the_data(path: Path) -> None:
    with LmdbStore(path) as s:
        s.apply(lambda v: v.put_many(M, [(b"a", b"1"), (b"b", b"2")]))
        s.apply(lambda v: v.put(P, b"p", b"3"))
    with LmdbStore(path) as s:
        assert s.scan_list(M, b"", END) == [(b"a", b"1"), (b"b", b"2")]
        assert s.get(P, b"p") == b"3"


def test_close_finishes_queued_writes(path: Path) -> None:
    s = LmdbStore(path)
    futures = [s.submit(lambda v, i=i: v.put(M, b"%03d" % i, b"v") or i) for i in range(100)]
    s.close()
    assert [f.result(timeout=0) for f in futures] == list(range(100))
    s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        s.submit(lambda v: None)
    with pytest.raises(RuntimeError, match="closed"), s.read():
        pass
    with LmdbStore(path) as s:
        assert len(s.scan_list(M, b"", END)) == 100


def test_readonly_store(path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LmdbStore(path, readonly=True)
    with LmdbStore(path) as s:
        s.apply(lambda v: v.put(M, b"k", b"v"))
    with LmdbStore(path, readonly=True) as ro:
        assert ro.get(M, b"k") == b"v"
        with pytest.raises(RuntimeError, match="readonly=True"):
            ro.submit(lambda v: v.put(M, b"x", b"y"))


def test_another_process_reads_while_the_store_writes(store: LmdbStore, path: Path) -> None:
    # Every commit keeps count == number of message rows == number of payload rows.
    stop = threading.Event()

    def write_forever() -> None:
        i = 0
        while not stop.is_set():

            def fn(v: WriteView, i: int = i) -> None:
                v.put(M, b"%08d" % i, b"m")
                v.put(P, b"%08d" % i, b"p")
                v.put("tx", b"count", b"%d" % (i + 1))

            store.apply(fn)
            i += 1

    writer = threading.Thread(target=write_forever)
    writer.start()
    try:
        child = run_python(
            f"""
            import time
            from tidings.store import LmdbStore
            counts = []
            with LmdbStore({str(path)!r}, readonly=True) as s:
                for _ in range(20):
                    with s.read() as v:
                        n = int(v.get("tx", b"count") or 0)
                        assert len(list(v.scan("messages", b"", b"\\xff"))) == n
                        assert len(list(v.scan("payloads", b"", b"\\xff"))) == n
                    counts.append(n)
                    time.sleep(0.01)
            print(counts[0], counts[-1])
            """
        )
        with child:
            out, err = child.communicate(timeout=60)
    finally:
        stop.set()
        writer.join()
    assert child.returncode == 0, err
    first, last = map(int, out.split())
    assert 0 < first < last  # it saw data, and saw the writer make progress


def test_map_size_is_configurable(path: Path) -> None:
    with LmdbStore(path, map_size=1 << 20) as s:
        big = [(b"%08d" % i, bytes(1000)) for i in range(2000)]
        with pytest.raises(lmdb.MapFullError):
            s.apply(lambda v: v.put_many(M, big))
        s.apply(lambda v: v.put(M, b"small", b"v"))  # the store still works
        assert s.scan_list(M, b"", END) == [(b"small", b"v")]


def test_bad_keys_are_value_errors(store: LmdbStore) -> None:
    with pytest.raises(ValueError, match="1 to 511 bytes"):
        store.apply(lambda v: v.put(M, b"", b"v"))
    with pytest.raises(ValueError, match="1 to 511 bytes"):
        store.apply(lambda v: v.put_many(M, [(b"k", b"v"), (b"x" * 512, b"v")]))
    assert store.get(M, b"") is None
    assert store.scan_list(M, b"", END) == []


@pytest.mark.slow
def test_acknowledged_writes_survive_kill_9(path: Path) -> None:
    child = run_python(
        f"""
        import os, sys, threading
        from tidings.store import LmdbStore
        s = LmdbStore({str(path)!r})
        lock = threading.Lock()
        def write(n):
            for i in range(1_000_000):
                key = b"%d-%07d" % (n, i)
                s.apply(lambda v: v.put("messages", key, b"v" * 100))
                with lock:
                    # One write() per line: a kill cannot leave half a key in the pipe.
                    os.write(1, key + b"\\n")
        for n in range(4):
            threading.Thread(target=write, args=(n,)).start()
        """
    )
    acknowledged: list[str] = []
    with child:
        assert child.stdout is not None and child.stderr is not None
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, child.stderr.read()
            acknowledged.append(line.strip())
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        # Printed after its commit, so durable too; text after the last newline is cut.
        acknowledged += child.stdout.read().split("\n")[:-1]
    assert len(acknowledged) > 100
    with LmdbStore(path) as s:
        stored = {k.decode() for k, _ in s.scan_list(M, b"", END)}
    assert not set(acknowledged) - stored

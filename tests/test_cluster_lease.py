"""The leader lease on PostgreSQL and the fence it puts on every store write."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from tests.conftest import fresh_database
from tidings.cluster.lease import FENCE_SQL, LeaderLease
from tidings.errors import LeaseLost, ServiceUnavailable
from tidings.store.backend import WriteView
from tidings.store.backends.postgres import PostgresStore


def _lease(
    url: str, name: str, seconds: float = 0.5, on_lost: Callable[[str], None] | None = None
) -> LeaderLease:
    lease = LeaderLease(
        url, instance_id=name, advertise_url=f"http://{name}", seconds=seconds, on_lost=on_lost
    )
    lease.prepare()
    return lease


def _put(key: bytes) -> Callable[[WriteView], None]:
    def put(view: WriteView) -> None:
        view.put("metadata", key, b"v")

    return put


def _held(
    store: PostgresStore, write: Callable[[WriteView], None]
) -> tuple[Future[None], threading.Event]:
    """Submit ``write`` and keep its group open after it, until the event is set."""
    inside = threading.Event()
    release = threading.Event()

    def held(view: WriteView) -> None:
        write(view)
        inside.set()
        release.wait(5)

    pending = store.submit(held)
    assert inside.wait(5)
    return pending, release


def test_one_holder_at_a_time_and_each_takeover_bumps_the_epoch(postgres_url: str) -> None:
    url = fresh_database(postgres_url)
    a, b = _lease(url, "a"), _lease(url, "b")
    assert a.acquire(wait=False) == 1
    with pytest.raises(ServiceUnavailable):
        b.acquire(wait=False)  # a's lease is live
    time.sleep(0.6)  # a never renews: its lease passes
    assert b.acquire(wait=False) == 2
    view = b.view()
    assert [(info.holder, info.epoch) for info in view.leases] == [("b", 2)]
    assert {info.id for info in view.instances} == {"a", "b"}


def test_the_store_refuses_writes_of_an_older_epoch(postgres_url: str) -> None:
    url = fresh_database(postgres_url)
    a, b = _lease(url, "a"), _lease(url, "b")
    old = PostgresStore(url)
    try:
        old.fence(FENCE_SQL, ("a", a.acquire(wait=False)), idle_timeout=0.25)
        old.apply(_put(b"k1"))
        time.sleep(0.6)
        b.acquire(wait=False)
        # a does not know it lost: the database refuses its write all the same.
        with pytest.raises(LeaseLost):
            old.apply(_put(b"k2"))
        assert old.get("metadata", b"k1") == b"v"
        assert old.get("metadata", b"k2") is None
    finally:
        old.close()


def test_a_takeover_waits_for_a_write_in_flight_and_fences_what_follows(
    postgres_url: str,
) -> None:
    url = fresh_database(postgres_url)
    a, b = _lease(url, "a"), _lease(url, "b")
    store = PostgresStore(url)
    try:
        store.fence(FENCE_SQL, ("a", a.acquire(wait=False)), idle_timeout=5)

        def write(view: WriteView) -> None:
            view.put("metadata", b"slow", b"v")
            # A scan sends the buffered write to PostgreSQL first: the transaction
            # opens there, with the fence's lock.
            assert list(view.scan("metadata", b"slow", b"slow\xff")) == [(b"slow", b"v")]

        pending, release = _held(store, write)
        time.sleep(0.6)  # a's lease has passed while its write is still open
        took: list[int] = []
        taker = threading.Thread(target=lambda: took.append(b.acquire(wait=False)))
        taker.start()
        time.sleep(0.3)
        assert not took, "the takeover must wait for the fenced write to end"
        release.set()
        pending.result(5)  # began under a's epoch, ended before b's: it stands
        taker.join(5)
        assert took == [2]
        with pytest.raises(LeaseLost):
            store.apply(_put(b"after"))
        assert store.get("metadata", b"slow") == b"v"
    finally:
        store.close()


def test_a_write_still_buffered_when_the_lease_passes_is_refused_without_delaying_the_takeover(
    postgres_url: str,
) -> None:
    # Until a group sends anything to PostgreSQL its transaction is not open and holds
    # no lock: the takeover goes ahead, and the fence refuses the group at its commit.
    url = fresh_database(postgres_url)
    a, b = _lease(url, "a"), _lease(url, "b")
    store = PostgresStore(url)
    try:
        store.fence(FENCE_SQL, ("a", a.acquire(wait=False)), idle_timeout=5)
        store.apply(_put(b"before"))

        def write(view: WriteView) -> None:
            view.put("metadata", b"slow", b"v")
            assert view.get("metadata", b"before") == b"v"

        pending, release = _held(store, write)
        time.sleep(0.6)  # a's lease has passed while its write function runs
        started = time.monotonic()
        assert b.acquire(wait=False) == 2
        assert time.monotonic() - started < 0.3
        release.set()
        with pytest.raises(LeaseLost):
            pending.result(5)
        assert store.get("metadata", b"slow") is None
        assert store.get("metadata", b"before") == b"v"
    finally:
        store.close()


def test_a_holder_that_cannot_renew_is_told(postgres_url: str) -> None:
    url = fresh_database(postgres_url)
    lost: list[str] = []
    a = _lease(url, "a", seconds=0.6, on_lost=lost.append)
    b = _lease(url, "b", seconds=0.6)
    a.acquire(wait=False)
    a.start_renewing()
    time.sleep(1.0)
    with pytest.raises(ServiceUnavailable):
        b.acquire(wait=False)  # renewed: still a's
    a._stop.set()  # a stalls (its renewals stop) ...
    time.sleep(0.8)
    b.acquire(wait=False)  # ... so b takes over
    a._stop.clear()
    a._thread = None
    a.start_renewing()  # a wakes up and tries to renew
    deadline = time.monotonic() + 3
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost == ["another instance took the leader lease"]
    assert not a.held
    a.release()  # does not touch b's lease
    assert b.view().leases[0].holder == "b"

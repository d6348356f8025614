"""Which write pointers the Message Table still names (for pruning the invalid list),
and the publish guard that keeps ended transactions from writing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.errors import TransactionTimedOut
from tidings.messaging import MessagingService
from tidings.store import MemoryStore

# One op: (kind, topic, write pointer) over a few topics and pointers.
ops = st.lists(
    st.tuples(
        st.sampled_from(["direct", "stored", "rolled-back", "plain", "delete-topic"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 12),
    ),
    max_size=25,
)


@pytest.fixture
def service() -> Iterator[MessagingService]:
    s = MessagingService(MemoryStore(), clock=FakeClock(1_700_000_000_000))
    try:
        yield s
    finally:
        s.close()


@settings(max_examples=60)
@given(steps=ops, chunk=st.integers(1, 7), candidates=st.sets(st.integers(1, 14)))
def test_referenced_pointers_are_exactly_those_with_live_entries(
    steps: list[tuple[str, str, int]], chunk: int, candidates: set[int]
) -> None:
    s = MessagingService(MemoryStore(), clock=FakeClock(1_700_000_000_000))
    named: dict[int, int] = {}  # pointer -> entries naming it, not rolled back
    try:
        for topic in ("a", "b", "c"):
            s.create_topic("ns", topic)
        for kind, topic, wp in steps:
            if kind == "direct":
                s.publish("ns", topic, [b"x", b"y"], write_pointer=wp)
                named[wp] = named.get(wp, 0) + 2
            elif kind == "stored":
                try:
                    s.store_payloads("ns", topic, wp, [b"s"])
                    s.publish("ns", topic, [], write_pointer=wp)
                except Exception:
                    continue  # already published under this pointer in this topic: sealed
                named[wp] = named.get(wp, 0) + 1
            elif kind == "rolled-back":
                info = s.publish("ns", topic, [b"r"], write_pointer=wp)
                assert info is not None
                s.rollback("ns", topic, info)
            elif kind == "plain":
                s.publish("ns", topic, [b"p"])
            else:
                # A deleted topic's entries stay until the cleaner drops them: still named.
                s.delete_topic("ns", topic)
                s.create_topic("ns", topic)
        expected = {wp for wp in candidates if named.get(wp)}
        assert s.referenced_pointers(candidates, chunk=chunk) == expected
    finally:
        s.close()


def test_a_cancelled_scan_names_every_candidate(service: MessagingService) -> None:
    service.create_topic("ns", "t")
    for i in range(30):
        service.publish("ns", "t", [b"p%d" % i])
    calls: list[int] = []

    def cancelled() -> bool:
        calls.append(1)
        return True

    assert service.referenced_pointers({5, 6}, chunk=10, cancelled=cancelled) == {5, 6}
    assert calls == [1]  # asked between chunks
    assert service.referenced_pointers({5, 6}, chunk=10) == set()


def test_a_guard_that_refuses_writes_nothing(service: MessagingService) -> None:
    service.create_topic("ns", "t")
    open_pointers = {7}

    def guard(wp: int) -> None:
        if wp not in open_pointers:
            raise TransactionTimedOut(f"{wp} has ended")

    service.guard_publishes(guard)
    service.publish("ns", "t", [b"ok"], write_pointer=7)
    with pytest.raises(TransactionTimedOut):
        service.publish("ns", "t", [b"late"], write_pointer=8)
    with pytest.raises(TransactionTimedOut):
        service.store_payloads("ns", "t", 8, [b"stored"])  # stores are guarded too
    service.store_payloads("ns", "t", 7, [b"stored"])
    open_pointers.clear()
    with pytest.raises(TransactionTimedOut):
        service.publish("ns", "t", [], write_pointer=7)  # ... and their publish
    with pytest.raises(TransactionTimedOut):
        service.publish_all_future("ns", [("t", [b"a"])], 9).result()
    service.publish("ns", "t", [b"plain"])  # no pointer: nothing to check
    assert [m.payload for m in service.fetch("ns", "t")] == [b"ok", b"plain"]
    service.barrier()  # returns once everything before it has committed

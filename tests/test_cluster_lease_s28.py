"""The lease poll of an instance standing by gives up on a database that does not
answer, rather than hold the instance (and its stop) until it does."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.conftest import fresh_database
from tidings.cluster.lease import FENCE_SQL, LeaderLease
from tidings.errors import ServiceUnavailable


def _lease(url: str, name: str, seconds: float) -> LeaderLease:
    lease = LeaderLease(url, instance_id=name, advertise_url=f"http://{name}", seconds=seconds)
    lease.prepare()
    return lease


def test_a_lease_poll_without_an_answer_gives_up_within_the_lease(postgres_url: str) -> None:
    url = fresh_database(postgres_url)
    a, b, c = _lease(url, "a", 0.5), _lease(url, "b", 1.0), _lease(url, "c", 0.5)
    a.acquire(wait=False)
    with psycopg.connect(url) as writer:
        # a's write in flight, fenced by its lease row, outlasts a's lease: b's
        # takeover waits for it, here 3 s, longer than b's lease.
        writer.execute(FENCE_SQL, ("a", a.epoch))
        ends = threading.Timer(3.0, writer.rollback)
        time.sleep(0.6)  # a's lease passes unrenewed
        ends.start()
        try:
            began = time.monotonic()
            with pytest.raises(ServiceUnavailable):
                b.acquire(wait=False)
            waited = time.monotonic() - began
        finally:
            ends.join()
    assert 0.9 < waited < 2.5, f"the poll waited {waited:.1f} s for an answer"
    # The poll left behind took the lease once the write ended, too late to lead
    # with: it has passed (it counts from the poll's start), and c may take it now.
    time.sleep(0.2)
    assert c.take()
    c.release()

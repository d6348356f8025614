"""Regression tests of several instances on one PostgreSQL store (found by the
failover model, tests/e2e/test_cluster_model_s30.py): what a standby and a deposed
leader answer when a request's fate is unknown, or when nothing was done.

Black box: real server processes, a real PostgreSQL, the real client.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness, wait_leading
from tidings import Client, RetryPolicy
from tidings.errors import OutcomeUnknown, ServiceUnavailable, TidingsError

pytestmark = pytest.mark.e2e

#: Long: a leader renews every third of it, and must not notice a takeover first.
LEASE = 30.0
#: Short: a leader stopped past it is taken over within a few seconds.
SHORT = 1.5
PATIENT = RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.3)


class Pair:
    """Two instances on one fresh database; the first started leads."""

    def __init__(self, root: Path, url: str, lease: float) -> None:
        self.url = url
        args = ["--store", url, "--lease-seconds", str(lease)]
        self.a = ServerProcess(root / "a", args)
        self.b = ServerProcess(root / "b", args)
        self.a.start()
        self.b.start()
        assert readiness(self.a) == "ready" and readiness(self.b) == "forwarding"

    def epoch(self) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT epoch FROM tidings_leases WHERE name = 'leader'").fetchone()
        return int(row[0]) if row else 0


@pytest.fixture
def make_pair(tmp_path: Path, postgres_url: str) -> Iterator[Callable[[float], Pair]]:
    made: list[Pair] = []

    def make(lease: float) -> Pair:
        made.append(Pair(tmp_path, fresh_database(postgres_url), lease))
        return made[-1]

    try:
        yield make
    finally:
        for node in (n for p in made for n in (p.a, p.b)):
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
            node.kill()


@pytest.fixture
def pair(make_pair: Callable[[float], Pair]) -> Pair:
    return make_pair(LEASE)


def test_a_standby_says_the_outcome_is_unknown_when_the_leaders_answer_is_lost(
    pair: Pair,
) -> None:
    """The leader dies while a request forwarded to it waits for its answer: the
    standby cannot know whether it was carried out, and says so as a 500 that is not
    a bug's (a client told only "ServerError" cannot tell it from one that changed
    nothing)."""
    a, b = pair.a, pair.b
    once = RetryPolicy(attempts=1)
    with Client(a.url) as client:
        client.create_topic("t")
    raised: list[BaseException] = []

    def wait_through_b() -> None:
        with Client(b.url, retry=once) as client:
            try:
                client.poll("t", wait=10.0)
            except TidingsError as exc:
                raised.append(exc)

    thread = threading.Thread(target=wait_through_b)
    thread.start()
    time.sleep(0.5)  # the long-poll waits at the leader
    a.kill()
    thread.join(20)
    assert raised and isinstance(raised[0], OutcomeUnknown), raised


def test_a_leader_whose_lease_was_taken_refuses_a_commit_as_not_done(pair: Pair) -> None:
    """A commit that reaches a leader whose lease another instance has taken, before
    its renewal noticed (it was paused, say), is refused by the database's fence:
    nothing was done, which a retriable 503 says (a 500 ``LogFailed`` said "a bug or
    a storage failure"); committed through the new leader, the transaction then shows
    whole."""
    a, b = pair.a, pair.b
    with Client(a.url, retry=RetryPolicy(attempts=1)) as client:
        client.create_topic("t")
        begun = client.begin(60)
        client.publish("t", [b"x", b"y"], write_pointer=begun.write_pointer)
        with psycopg.connect(pair.url, autocommit=True) as conn:
            # Another instance's takeover; a renews only every third of the lease.
            conn.execute(
                "UPDATE tidings_leases SET holder = 'another', epoch = epoch + 1 "
                "WHERE name = 'leader'"
            )
        with pytest.raises(ServiceUnavailable):
            client.commit(begun)
    with psycopg.connect(pair.url, autocommit=True) as conn:
        conn.execute("UPDATE tidings_leases SET expires_at = now() - interval '1 second'")
    wait_leading(b, 20.0)
    with Client(b.url, retry=PATIENT) as client:
        client.commit(begun)
        shown = client.poll("t", isolation="read_committed")
        assert [m.payload for m in shown] == [b"x", b"y"]


def test_a_leader_stopped_past_its_lease_answers_nothing_from_memory(
    make_pair: Callable[[float], Pair],
) -> None:
    """Requests that reached a leader while it was stopped (SIGSTOP) past its lease
    are read once it runs again, before its renewal learns another instance leads.
    They were answered from its memory: the transaction state and a read-committed
    poll as they were before the pause, without a transaction the new leader had
    committed, and acknowledged, before they were sent. Now they get a retriable 503."""
    pair = make_pair(SHORT)
    a, b = pair.a, pair.b
    assert a.proc is not None
    answers: list[object] = []
    with Client(a.url, timeout=20.0, retry=RetryPolicy(attempts=1)) as client:
        client.create_topic("t")
        client.transactions()  # the connection the requests below go over
        epoch = pair.epoch()
        a.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + SHORT * 2 + 10
            while pair.epoch() == epoch or readiness(b) != "ready":
                assert time.monotonic() < deadline, "no takeover"
                time.sleep(0.05)
            with Client(b.url, retry=PATIENT) as other:
                committed = other.publish_transaction({"t": [b"x"]}).write_pointer

            def ask() -> None:
                try:
                    state = client.transactions()
                    known = state.last_write_pointer >= committed
                    answers.append(not known or committed in state.in_progress)
                    shown = client.poll("t", isolation="read_committed")
                    answers.append([m.payload for m in shown] != [b"x"])
                except TidingsError as exc:
                    answers.append(exc)

            thread = threading.Thread(target=ask)
            thread.start()
            time.sleep(0.3)  # sent, and waiting to be read
        finally:
            a.proc.send_signal(signal.SIGCONT)
        thread.join(30)
    assert answers and True not in answers, f"out-of-date answers: {answers}"
    assert a.proc.wait(20) == 3

"""Every connection the lease opens notices a cut network path within about the lease,
and the leader's cluster view reuses one connection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import fresh_database
from tidings.cluster.lease import LeaderLease, tcp_options


class Opened:
    """A connection psycopg.connect opened, and its libpq options then."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.options = {
            o.keyword.decode(): o.val.decode() for o in conn.pgconn.info if o.val is not None
        }


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Opened]]:
    """Every connection psycopg.connect opens meanwhile."""
    connections: list[Opened] = []
    connect = psycopg.connect

    def counting(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect(*args, **kwargs)
        connections.append(Opened(conn))
        return conn

    monkeypatch.setattr(psycopg, "connect", counting)
    yield connections


def test_every_lease_connection_has_keepalives_bounded_by_the_lease(
    postgres_url: str, opened: list[Opened]
) -> None:
    url = fresh_database(postgres_url)
    opened.clear()  # fresh_database's own
    seconds = 6.0
    lease = LeaderLease(url, instance_id="a", advertise_url="http://a", seconds=seconds)
    lease.prepare()  # one connection
    lease.acquire(wait=False)  # the poll's
    lease.start_renewing()
    deadline = time.monotonic() + 10
    while len(opened) < 3 and time.monotonic() < deadline:  # the renewal's
        time.sleep(0.1)
    lease.view()
    lease.leader_url()
    lease.release()  # one more
    assert len(opened) >= 5
    for each in opened:
        options = each.options
        assert options["keepalives"] == "1"
        idle, interval, count = (
            int(options[k]) for k in ("keepalives_idle", "keepalives_interval", "keepalives_count")
        )
        assert idle + interval * count <= seconds
        assert 0 < int(options["tcp_user_timeout"]) <= seconds * 1000


def test_tcp_options_stay_within_long_and_short_leases() -> None:
    for seconds in (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 30.0, 300.0):
        options = tcp_options(seconds)
        assert options["keepalives_count"] >= 1
        dead_after = options["keepalives_idle"] + (
            options["keepalives_interval"] * options["keepalives_count"]
        )
        # libpq's shortest keepalive times are whole seconds: 1 s each.
        assert dead_after <= max(seconds, 2), seconds
        assert options["tcp_user_timeout"] == seconds * 1000


def test_options_in_the_store_url_win(postgres_url: str, opened: list[Opened]) -> None:
    url = fresh_database(postgres_url) + "?keepalives_idle=42"
    opened.clear()
    lease = LeaderLease(url, instance_id="a", advertise_url="http://a", seconds=3.0)
    lease.prepare()
    assert opened[0].options["keepalives_idle"] == "42"
    assert opened[0].options["tcp_user_timeout"] == "3000"


def test_the_cluster_view_reuses_one_connection(postgres_url: str, opened: list[Opened]) -> None:
    url = fresh_database(postgres_url)
    lease = LeaderLease(url, instance_id="a", advertise_url="http://a", seconds=5.0)
    lease.prepare()
    lease.acquire(wait=False)
    before = len(opened)
    for _ in range(5):
        assert [info.holder for info in lease.view().leases] == ["a"]
    assert len(opened) == before + 1
    # PostgreSQL ends that session (a restart, an idle connection dropped): the next
    # view opens another and answers all the same.
    pid = opened[-1].conn.info.backend_pid
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    time.sleep(0.2)
    assert [info.holder for info in lease.view().leases] == ["a"]
    assert len(opened) == before + 3  # the admin's, and the view's new one
    lease.release()
    assert opened[-1].conn.closed

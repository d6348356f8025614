"""The leader lease of instances sharing one PostgreSQL store.

Several ``tidings serve`` processes may run on one database. One of them, the
*leader*, holds the lease row ``tidings_leases.name = 'leader'`` and is the only one
that writes: it owns every topic, the transaction log, and the consumer groups and
queues. The others stand by and take over once the lease has passed unrenewed.

Each acquisition bumps the row's **epoch**. The store's writer checks, inside every
write transaction, that the row still names this instance and its epoch, taking a
``FOR SHARE`` lock on it (:data:`FENCE_SQL`). A takeover updates that row, so it waits
for a write in flight to end, and once it has committed no write of the old epoch can
commit: a paused or partitioned ex-leader is refused by the database itself, not by
its good manners. Its writer connection has ``idle_in_transaction_session_timeout``
set, so a process stopped in the middle of a write transaction cannot hold the row
locked past about half a lease.

Times are the database's (``now()``), so the instances' clocks need not agree. The
holder renews every third of the lease; a holder that has not renewed within the
lease by its own monotonic clock gives up (fail-stop: the server exits).

An instance standing by polls the lease row over one connection of its own, kept
open between polls (a new connection per poll cost PostgreSQL a backend start every
twentieth of the lease, per standby), and keeps what the last poll saw: who leads, at
which URL. Its forwarder asks that view, never the database, so a request is not held
up by a database that does not answer; a view older than the lease says nothing about
who leads now, and is treated as no leader at all (503).

Every connection of this module has TCP keepalives and ``tcp_user_timeout`` set from
the lease (:func:`tcp_options`): on a network path cut without a reset, a poll or a
renewal would otherwise wait, holding a thread and a socket, until the operating
system gave up, which takes many minutes; with them the connection fails within about
the lease, and the next poll or renewal opens another.
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tidings.errors import ServiceUnavailable

__all__ = [
    "FENCE_SQL",
    "LEADER",
    "ClusterView",
    "InstanceInfo",
    "LeaderLease",
    "LeaseInfo",
    "create_tables",
    "new_instance_id",
    "tcp_options",
]

_log = logging.getLogger("tidings.cluster")

T = TypeVar("T")

#: The lease every write of the store and of the transaction log is fenced by.
LEADER = "leader"

#: Run first in every write transaction of the leader, with (holder, epoch): no row
#: means the lease has passed to another instance, and the transaction must not commit.
FENCE_SQL = (
    "SELECT 1 FROM tidings_leases WHERE name = 'leader' AND holder = %s AND epoch = %s FOR SHARE"
)

_TABLES = (
    """CREATE TABLE IF NOT EXISTS tidings_leases (
        name text PRIMARY KEY,
        holder text NOT NULL,
        url text NOT NULL,
        epoch bigint NOT NULL,
        acquired_at timestamptz NOT NULL,
        renewed_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS tidings_instances (
        id text PRIMARY KEY,
        url text NOT NULL,
        started_at timestamptz NOT NULL,
        seen_at timestamptz NOT NULL)""",
)

# The lease goes to the caller only where nobody holds it, or its holder let it pass:
# the row lock ON CONFLICT takes waits for a fenced write of the old holder to end.
_ACQUIRE = """
INSERT INTO tidings_leases AS l (name, holder, url, epoch, acquired_at, renewed_at, expires_at)
VALUES (%(name)s, %(holder)s, %(url)s, 1, now(), now(), now() + %(lease)s * interval '1 second')
ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder, url = EXCLUDED.url, epoch = l.epoch + 1,
    acquired_at = now(), renewed_at = now(), expires_at = EXCLUDED.expires_at
WHERE l.expires_at < now()
RETURNING epoch
"""

_RENEW = """
UPDATE tidings_leases SET renewed_at = now(), expires_at = now() + %(lease)s * interval '1 second'
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
RETURNING epoch
"""

_RELEASE = """
UPDATE tidings_leases SET expires_at = now() - interval '1 second'
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
"""

# What a standing-by instance reads first: an exclusive lock on the lease row (the
# acquisition's) would wait for the leader's write in flight and hold up its next one.
_LOOK = """
SELECT holder, url, epoch, extract(epoch FROM expires_at - now()) FROM tidings_leases
WHERE name = %s
"""

_SEEN = """
INSERT INTO tidings_instances (id, url, started_at, seen_at) VALUES (%s, %s, now(), now())
ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, seen_at = now()
"""


#: Keepalive probes left unanswered before the connection counts as dead (fewer
#: where the lease is too short for three).
_KEEPALIVE_COUNT = 3


def tcp_options(seconds: float) -> dict[str, int]:
    """libpq connection options under which a connection whose network path is cut
    (no reset, no answer) fails within about ``seconds``: keepalives that probe an idle
    connection (from a third of the lease on, every ninth), and ``tcp_user_timeout``
    (ms) for data sent and never acknowledged. libpq counts keepalive times in whole
    seconds, at least 1: a lease under 2 s gets those shortest ones, and one probe."""
    idle = max(1, int(seconds / 3))
    interval = max(1, int(seconds / (3 * _KEEPALIVE_COUNT)))
    count = max(1, min(_KEEPALIVE_COUNT, int((seconds - idle) / interval)))
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": max(1, int(seconds * 1000)),
    }


def new_instance_id() -> str:
    """A name for this process, unique across restarts: host, pid and a random tail."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """Create the lease and instance tables where missing (idempotent)."""
    for statement in _TABLES:
        conn.execute(statement)


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A lease as the database shows it."""

    name: str
    holder: str
    url: str
    epoch: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    #: Seconds until it passes (negative: it has passed and may be taken).
    expires_in: float


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """An instance that has run on this database, with when it was last heard of."""

    id: str
    url: str
    started_at: datetime
    seen_at: datetime
    #: Seconds since ``seen_at``, by the database's clock.
    seen_ago: float


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Every lease and every instance seen within ``window`` seconds."""

    leases: list[LeaseInfo]
    instances: list[InstanceInfo]


class LeaderLease:
    """This instance's claim on the leader lease: wait for it, renew it, give it up.

    ``on_lost`` is called (once, from the renewing thread) when the lease could not be
    renewed in time or another instance holds it: whoever called :meth:`acquire` must
    stop serving writes; the store refuses them from then on anyway.
    """

    def __init__(
        self,
        url: str,
        *,
        instance_id: str,
        advertise_url: str,
        seconds: float = 5.0,
        on_lost: Callable[[str], None] | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        if seconds <= 0:
            raise ValueError("a lease lasts a positive number of seconds")
        #: Seconds a connection may take to open (whole ones, at least 2: psycopg's
        #: rounding); a ``connect_timeout`` in the URL wins. A poll waits 2 s at most.
        self.connect_timeout = max(1, math.ceil(connect_timeout))
        self.url = url
        self.instance_id = instance_id
        self.advertise_url = advertise_url
        self.seconds = seconds
        self.epoch = 0
        #: Called once, from the renewing thread, when the lease is lost.
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed = 0.0  # monotonic time of the last renewal the database confirmed
        self._lost = False
        # The connection a standing-by instance polls over (opened again where it
        # broke), and when it last said it was alive (tidings_instances.seen_at).
        self._poll_conn: list[psycopg.Connection[Any] | None] = [None]
        self._seen_sent = -math.inf
        #: (monotonic time of the last poll that got an answer, the live leader's URL
        #: then); None until a poll has answered.
        self._seen_leader: tuple[float, str | None] | None = None
        self._polling = False
        # The connection the leader's views (GET /v1/cluster) read over, kept between
        # calls (opened again where it broke), one caller at a time.
        self._view_conn: list[psycopg.Connection[Any] | None] = [None]
        self._view_lock = threading.Lock()
        # Closed with the lease where nobody released it (a standby's lease that
        # never led, a test's): not left to the collector, which warns.
        weakref.finalize(self, _close, self._view_conn)
        # Options of the URL win: an operator who set them meant them.
        try:
            given = conninfo_to_dict(url)
            tcp = {k: v for k, v in tcp_options(seconds).items() if k not in given}
            self._conninfo = make_conninfo(url, **tcp)
            if float(str(given.get("connect_timeout", 0))) > 0:
                self.connect_timeout = math.ceil(float(str(given["connect_timeout"])))
        except (psycopg.Error, ValueError):
            self._conninfo = url  # a malformed URL: the first connect says what is wrong

    @property
    def held(self) -> bool:
        """True between a successful :meth:`acquire` and the lease's loss or release."""
        return self.epoch > 0 and not self._lost and not self._stop.is_set()

    @property
    def current(self) -> bool:
        """True while no other instance can have taken the lease: it is held, and the
        last acquisition or renewal the database confirmed was sent less than a lease
        ago by this process's clock (the database counts the lease from later on). A
        leader paused past its lease (SIGSTOP, a VM frozen) is not current from the
        moment it runs again, before its renewal learns that another instance leads:
        what it would answer from memory meanwhile may be out of date."""
        return self.held and time.monotonic() - self._renewed < self.seconds

    def prepare(self) -> None:
        """Create the lease and instance tables where missing."""
        with self._connect() as conn:
            conn.execute("SELECT pg_advisory_lock(8471)")  # one creator at a time
            create_tables(conn)
            conn.execute("SELECT pg_advisory_unlock(8471)")

    def acquire(self, *, wait: bool = True, poll: float | None = None) -> int:
        """Take the lease, standing by while another instance holds it; returns the epoch.

        Polls every ``poll`` seconds (default a twentieth of the lease, at most 0.5 s),
        so a lease that passes is taken within that of its expiry. With ``wait=False``
        raises :class:`~tidings.errors.ServiceUnavailable` instead of waiting. Every poll
        goes over the same connection, and none waits for an answer longer than the
        lease: a database cut off without a reset must neither hold up a stop nor keep
        the instance from polling again once it is back.
        """
        interval = poll if poll is not None else min(self.seconds / 20, 0.5)
        announced = False
        self._polling = True
        try:
            while True:
                sent = time.monotonic()
                epoch, holder = self._poll()
                if epoch is not None:
                    self.epoch = epoch
                    # From when the poll began: the database counts the lease from its
                    # statement, which may have waited (for a fenced write) since.
                    self._renewed = sent
                    _log.info(
                        f"leading the cluster (epoch {epoch})",
                        extra={"event": "lease", "epoch": epoch, "instance": self.instance_id},
                    )
                    return epoch
                if not wait:
                    raise ServiceUnavailable("another instance holds the leader lease")
                if not announced and holder is not None:
                    _log.info(
                        f"standing by: {holder} leads the cluster",
                        extra={"event": "standby", "instance": self.instance_id},
                    )
                    announced = True
                if self._stop.wait(interval):
                    raise ServiceUnavailable("stopped while standing by")
        finally:
            self._polling = False
            # A leader has no more use for it; one that stands by again opens another.
            _close(self._poll_conn)
            self._poll_conn = [None]

    def take(self) -> bool:
        """Take the lease if it is free now; True if this instance leads."""
        try:
            self.acquire(wait=False)
        except ServiceUnavailable:
            return False
        return True

    def stop_waiting(self) -> None:
        """Make an :meth:`acquire` waiting in another thread give up (it raises
        ServiceUnavailable); touches no database, so a signal handler may call it."""
        self._stop.set()

    def start_renewing(self) -> None:
        """Renew the lease every third of its length until :meth:`release`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._renew_loop, name="tidings-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and let the lease pass at once (a clean shutdown hands over
        without waiting for expiry). Idempotent; safe to call while standing by."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self.epoch > 0 and not self._lost:
            try:
                with self._connect() as conn:
                    conn.execute(
                        _RELEASE,
                        {"name": LEADER, "holder": self.instance_id, "epoch": self.epoch},
                    )
            except psycopg.Error as exc:
                _log.warning(f"could not release the leader lease: {exc}")
        # Not waiting for a view under way: over a cut network path it could hold up
        # the stop for a lease; its connection then goes with the lease.
        if self._view_lock.acquire(blocking=False):
            try:
                _close(self._view_conn)
            finally:
                self._view_lock.release()

    def leader_url(self) -> str | None:
        """The URL the live leader advertises (None while nobody's lease is live).

        While :meth:`acquire` stands by, what its last poll saw, without asking the
        database: None once that is older than the lease (the database has not
        answered since, and whoever led then may have lost the lease). Otherwise read
        from the database."""
        seen = self._seen_leader
        if self._polling and seen is not None:
            at, url = seen
            return url if time.monotonic() - at <= self.seconds else None
        if self._polling:
            return None  # no poll has answered yet
        row = self._read(
            lambda conn: conn.execute(
                "SELECT url FROM tidings_leases WHERE name = %s AND expires_at > now()",
                (LEADER,),
            ).fetchone()
        )
        return None if row is None else str(row[0])

    def view(self, window: float = 3600.0) -> ClusterView:
        """The leases and the instances heard of within ``window`` seconds."""
        return self._read(lambda conn: read_view(conn, window))

    # -- internals -----------------------------------------------------------------------

    def _connect(self, connect_timeout: int | None = None) -> psycopg.Connection[Any]:
        timeout = self.connect_timeout
        if connect_timeout is not None:
            timeout = min(timeout, connect_timeout)
        return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=timeout)

    def _read(self, read: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``read`` over the connection kept for reads: a new connection per call cost
        PostgreSQL a backend start each time a console refreshes its cluster page."""
        with self._view_lock:
            conn = self._view_conn[0]
            if conn is not None and not conn.closed and not conn.broken:
                try:
                    return read(conn)
                except psycopg.OperationalError:
                    # It died while idle (PostgreSQL restarted, the path was cut):
                    # a read may go again, on a new connection.
                    _close(self._view_conn)
            conn = self._view_conn[0] = self._connect()
            try:
                return read(conn)
            except psycopg.Error:
                _close(self._view_conn)
                raise

    def _poll(self) -> tuple[int | None, str | None]:
        """One poll of the lease: (the epoch, where this instance took the lease; who
        holds it, where another instance does and the database answered)."""
        slot = self._poll_conn
        sent = time.monotonic()
        # A poll given up on that takes the lease after all leaves the cluster without
        # a leader only briefly: the lease counts from its statement's start, before
        # the poll was given up on, so it passes at most what the poll spent before
        # that statement (a connect, two reads) later.
        done, result, error = _bounded(
            functools.partial(self._poll_once, slot),
            self.seconds,
            on_late=functools.partial(_close, slot),
        )
        if not done:
            # Still in use by the poll left hanging, which closes it if it ever ends.
            self._poll_conn = [None]
            _log.warning(f"no answer from the store to a lease poll in {self.seconds} s")
            return None, None
        if error is not None:
            _close(slot)
            if isinstance(error, psycopg.Error):
                _log.warning(f"cannot reach the store to take the lease: {error}")
                return None, None
            raise error
        epoch, holder, url = cast(tuple[int | None, str | None, str | None], result)
        self._seen_leader = (sent, url)
        return epoch, holder

    def _poll_once(
        self, slot: list[psycopg.Connection[Any] | None]
    ) -> tuple[int | None, str | None, str | None]:
        """(epoch taken, holder, the live leader's URL), over ``slot[0]``."""
        conn = slot[0]
        if conn is None or conn.closed or conn.broken:
            conn = slot[0] = self._connect(connect_timeout=2)
        now = time.monotonic()
        if now - self._seen_sent >= self.seconds / 3:  # as often as a leader renews
            conn.execute(_SEEN, (self.instance_id, self.advertise_url))
            self._seen_sent = now
        row = conn.execute(_LOOK, (LEADER,)).fetchone()
        if row is not None and float(row[3]) > 0:
            return None, f"{row[0]} (epoch {row[2]})", str(row[1])
        taken = conn.execute(
            _ACQUIRE,
            {
                "name": LEADER,
                "holder": self.instance_id,
                "url": self.advertise_url,
                "lease": self.seconds,
            },
        ).fetchone()
        if taken is None:
            return None, "another instance", None
        return int(taken[0]), None, self.advertise_url

    def _renew_loop(self) -> None:
        conn: list[psycopg.Connection[Any] | None] = [None]
        every = self.seconds / 3
        try:
            while not self._stop.wait(every):
                sent = time.monotonic()
                # The wait for an answer is bounded by what is left of the lease (at
                # least a renewal period, for a holder that was paused past it and must
                # still learn whether another instance took over): a renewal that hangs
                # (PostgreSQL cut off without a reset, a lock) must not keep a holder
                # believing it leads after the database has let the lease pass.
                wait = max(self._renewed + self.seconds - sent, every)
                done, row, error = _bounded(
                    functools.partial(self._renew_once, conn),
                    wait,
                    on_late=functools.partial(_close, conn),
                )
                if not done:
                    # Still in use by the renewal left hanging, which closes it if it
                    # ever ends (closing it here, under the call, is not safe).
                    conn = [None]
                    self._lose("the leader lease could not be renewed in time")
                    return
                if error is not None:
                    _log.warning(f"cannot renew the leader lease: {error}")
                    if time.monotonic() - self._renewed >= self.seconds:
                        self._lose("the leader lease could not be renewed in time")
                        return
                    continue
                if row is None:
                    self._lose("another instance took the leader lease")
                    return
                # From when it was sent: the database counts the lease from then on.
                self._renewed = sent
        finally:
            if conn[0] is not None:
                conn[0].close()

    def _renew_once(self, conn: list[psycopg.Connection[Any] | None]) -> object:
        """One renewal over ``conn[0]`` (opened again where it broke): the row the
        renewal returned, None where the lease is no longer this instance's."""
        current = conn[0]
        if current is None or current.closed or current.broken:
            current = conn[0] = self._connect()
        current.execute(_SEEN, (self.instance_id, self.advertise_url))
        return current.execute(
            _RENEW,
            {
                "name": LEADER,
                "holder": self.instance_id,
                "epoch": self.epoch,
                "lease": self.seconds,
            },
        ).fetchone()

    def _lose(self, why: str) -> None:
        self._lost = True
        _log.error(
            f"lost the leader lease (epoch {self.epoch}): {why}",
            extra={"event": "lease_lost", "epoch": self.epoch, "instance": self.instance_id},
        )
        if self.on_lost is not None:
            self.on_lost(why)


def _close(conn: list[psycopg.Connection[Any] | None]) -> None:
    """Close the connection in the slot ``conn`` (if any) and empty the slot."""
    found, conn[0] = conn[0], None
    if found is not None:
        found.close()


def _bounded(
    call: Callable[[], object], timeout: float, *, on_late: Callable[[], None]
) -> tuple[bool, object, Exception | None]:
    """``call()`` in a thread of its own, waited for at most ``timeout`` seconds:
    (finished, its result, the error it raised). An unfinished call is left to itself
    (a daemon thread: what it waits for may never come), and ``on_late()`` (which may
    run twice) is called once it ends after all."""
    outcome: list[tuple[object, Exception | None]] = []
    finished = threading.Event()
    abandoned = threading.Event()

    def run() -> None:
        try:
            outcome.append((call(), None))
        except Exception as exc:
            outcome.append((None, exc))
        finally:
            finished.set()
            if abandoned.is_set():
                on_late()

    threading.Thread(target=run, name="tidings-lease-renewal", daemon=True).start()
    if not finished.wait(timeout):
        abandoned.set()
        if finished.is_set():  # it ended just now, perhaps before seeing abandoned
            on_late()
        return False, None, None
    if not outcome:  # ended by a BaseException, not an answer
        return True, None, RuntimeError("the renewal was interrupted")
    result, error = outcome[0]
    return True, result, error


def read_view(conn: psycopg.Connection[Any], window: float) -> ClusterView:
    """The leases and recent instances, read over ``conn``."""
    leases = [
        LeaseInfo(row[0], row[1], row[2], int(row[3]), row[4], row[5], row[6], float(row[7]))
        for row in conn.execute(
            "SELECT name, holder, url, epoch, acquired_at, renewed_at, expires_at, "
            "extract(epoch FROM expires_at - now()) FROM tidings_leases ORDER BY name"
        ).fetchall()
    ]
    instances = [
        InstanceInfo(row[0], row[1], row[2], row[3], float(row[4]))
        for row in conn.execute(
            "SELECT id, url, started_at, seen_at, extract(epoch FROM now() - seen_at) "
            "FROM tidings_instances WHERE seen_at > now() - %s * interval '1 second' "
            "ORDER BY started_at",
            (window,),
        ).fetchall()
    ]
    return ClusterView(leases, instances)

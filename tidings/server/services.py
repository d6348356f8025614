"""The services one ``tidings serve`` process runs, opened and closed per its role.

Data layout under ``data_dir``: ``store/`` is the LMDB environment (messaging),
``tx/`` the transaction log and snapshots (transactions). Each role opens only its
own directory, so a messaging process and a transactions process may share one
``data_dir``. Where one process runs both, the log's newest records may be carried by
store writes (``tx/TAIL-IN-STORE`` says so until a clean stop); a process running only
the transaction service then refuses to start until one with both has recovered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from tidings.consumers import GroupCoordinator, QueueCoordinator
from tidings.errors import ConfigError, LeaseLost, ServiceUnavailable
from tidings.messaging import MessagingConfig, MessagingService
from tidings.server.config import ServerConfig
from tidings.server.pruner import InvalidListPruner
from tidings.store.backend import Store
from tidings.store.backends.lmdb import LmdbStore
from tidings.tx import TransactionManager, TxConfig

if TYPE_CHECKING:
    from tidings.cluster.lease import LeaderLease

__all__ = ["Services"]

T = TypeVar("T")

# scheme://user:password@ (a password may hold anything but "@").
_PASSWORD = re.compile(r"^([^:/@]+://[^:/@]*):[^@]*@")

log = logging.getLogger("tidings.server")


@dataclass
class Services:
    """What the HTTP layer calls. ``messaging``/``tx`` are None when the role lacks them."""

    config: ServerConfig
    store: Store | None = None
    messaging: MessagingService | None = None
    tx: TransactionManager | None = None
    pruner: InvalidListPruner | None = None
    #: Consumer groups: where one process runs both services.
    groups: GroupCoordinator | None = None
    #: Queues: where one process runs both services.
    queues: QueueCoordinator | None = None
    #: With a PostgreSQL store: this instance's hold on the leader lease.
    lease: LeaderLease | None = None
    #: Why the lease was lost (the server then shuts down and exits non-zero).
    lease_lost: str | None = None
    #: With a PostgreSQL store: why the transaction log stopped (the server then
    #: shuts down, letting the lease pass, and exits non-zero).
    log_failed: str | None = None
    #: Runs the calls that block (transaction service, topic admin, stats).
    executor: ThreadPoolExecutor = field(init=False)
    serving: bool = False
    _stopping: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(
            self.config.blocking_threads, thread_name_prefix="tidings-blocking"
        )

    @classmethod
    def open(cls, config: ServerConfig, lease: LeaderLease | None = None) -> Services:
        """Open the store and start the services of ``config.role``; all or nothing."""
        services = cls(config)
        try:
            if config.runs_messaging:
                services.store = _open_store(config)
                if config.store is not None:
                    services.lease = services._lead(lease)
                services.messaging = MessagingService(
                    services.store,
                    MessagingConfig(
                        default_ttl=config.default_ttl,
                        fetch_default_limit=config.fetch_default_limit,
                        fetch_max_limit=config.fetch_max_limit,
                        fetch_max_bytes=config.fetch_max_bytes,
                        cleanup_interval=config.cleanup_interval,
                        cleanup_batch=config.cleanup_batch,
                        producer_expiry=config.producer_expiry,
                    ),
                )
                services.messaging.start()
            if config.runs_transactions:
                services.tx = TransactionManager(
                    None if services.lease is not None else config.tx_dir,
                    TxConfig(
                        default_timeout=config.tx_default_timeout,
                        max_timeout=config.tx_max_timeout,
                        sweep_interval=config.tx_sweep_interval,
                        snapshot_every=config.tx_snapshot_every,
                        sync=config.sync,
                        history_size=config.tx_history_size,
                        producer_expiry=config.tx_producer_expiry,
                        max_open=config.tx_max_open,
                    ),
                    store=services.store if services.lease is not None else None,
                    # Both services over LMDB: a one-request transaction's commit rides
                    # in the store write of its messages (TransactionManager.commit_in_write).
                    message_store=services.store if services.lease is None else None,
                )
                if services.lease is not None:
                    services.tx.on_log_failed(services._log_failed)
                services.tx.start()
            if services.messaging is not None and services.tx is not None:
                # Nothing is published under a transaction that has ended, which is
                # also what lets the pruner drop invalid pointers no entry names.
                services.messaging.guard_publishes(services.tx.check_writable)
                # Committed messages stay: a rollback naming a committed transaction
                # changes nothing (as a group's or a queue's rollback).
                services.messaging.guard_rollbacks(services.tx.has_committed)
                assert services.store is not None
                services.groups = GroupCoordinator(services.store, services.messaging, services.tx)
                services.queues = QueueCoordinator(services.store, services.messaging, services.tx)
                if config.tx_prune_interval > 0:
                    services.pruner = InvalidListPruner(
                        services.messaging,
                        services.tx,
                        config.tx_prune_interval,
                        groups=services.groups,
                        queues=services.queues,
                    )
                    services.pruner.start()
        except BaseException:
            services.close()
            raise
        services.serving = True
        return services

    @staticmethod
    def new_lease(config: ServerConfig) -> LeaderLease:
        """This instance's claim on the leader lease of ``config.store`` (not taken yet)."""
        from tidings.cluster.lease import LeaderLease, new_instance_id

        _check_store_url(config)
        if config.role != "all":
            raise ConfigError("a PostgreSQL store needs role `all` (one process per instance)")
        assert config.store is not None
        lease = LeaderLease(
            config.store,
            instance_id=new_instance_id(),
            advertise_url=config.advertise_url or _default_advertise_url(config),
            seconds=config.lease_seconds,
            connect_timeout=config.pg_connect_timeout,
        )
        _unreachable(lease.prepare)
        return lease

    def _lead(self, lease: LeaderLease | None) -> LeaderLease:
        """Stand by until this instance holds the leader lease (unless ``lease`` is held
        already), then fence every write of the store with its epoch (docs/storage.md,
        "Several instances")."""
        from tidings.cluster.lease import FENCE_SQL
        from tidings.store.backends.postgres import PostgresStore

        assert isinstance(self.store, PostgresStore)
        if lease is None:
            lease = self.new_lease(self.config)
        lease.on_lost = self._lease_lost
        if not lease.held:
            lease.acquire()
        # Renewed from now on: recovering the state below may take a while.
        lease.start_renewing()
        self.store.fence(
            FENCE_SQL, (lease.instance_id, lease.epoch), idle_timeout=lease.seconds / 2
        )
        return lease

    def _log_failed(self, error: BaseException) -> None:
        # A write of the transaction log failed (PostgreSQL restarted under it, say):
        # whether it committed is unknown, so the log refuses every later call until
        # it is recovered from the database (fail-stop). With a file log that is the
        # next start; here the instance must not go on leading with a dead
        # transaction service (and say it is ready): it stops, the lease passes at
        # once, and an instance (another, or this one restarted) recovers the log.
        if isinstance(error, LeaseLost):
            return  # the lease is lost: that stop is the lease's (exit code 3)
        why = f"the transaction log stopped after a failed write: {error}"
        log.error(
            f"{why}; stopping so that the transaction state is recovered from the database",
            extra={"event": "error"},
        )
        self.log_failed = why
        self._stop_at_once(why)

    def _lease_lost(self, why: str) -> None:
        # Fail-stop: every write is refused by the store from now on anyway; stop
        # answering as if this instance could still serve, and exit (a supervisor
        # restarts it, and it stands by).
        self.lease_lost = why
        self._stop_at_once(why)

    def _stop_at_once(self, why: str) -> None:
        if self._stopping:
            return  # once: the lease's loss and the log's failure may both come
        self._stopping = True
        self.serving = False
        # The stop waits for in-flight requests and then for the store's writer, which
        # may be waiting for an answer PostgreSQL will never send (the network to it
        # cut without a reset): past the time a stop allows, exit without closing.
        # Nothing acknowledged is lost: acknowledged means committed.
        limit = self.config.shutdown_timeout + self.config.lease_seconds
        code = 3 if self.lease_lost is not None else 1
        timer = threading.Timer(limit, _exit_unclosed, args=(why, limit, code))
        timer.daemon = True
        timer.start()
        os.kill(os.getpid(), signal.SIGTERM)

    @property
    def ready(self) -> bool:
        """True while every service of the role is open and serving: not once a
        transaction log write has failed, since every transaction call then fails until
        a restart."""
        tx = self.tx
        return self.serving and not (tx is not None and tx.failed)

    def close(self) -> None:
        """Finish pending writes, then close the services and the store. Idempotent."""
        self.serving = False
        if self.pruner is not None:
            self.pruner.stop()
        self.executor.shutdown(wait=True)
        # Each close is attempted even if an earlier one fails: the store must be closed.
        errors: list[BaseException] = []
        for close in (
            self.tx.close if self.tx is not None else None,
            self.messaging.close if self.messaging is not None else None,
            self.store.close if self.store is not None else None,
        ):
            if close is None:
                continue
            try:
                close()
            except Exception as exc:
                errors.append(exc)
        self.tx = self.messaging = self.store = None
        self.groups = None
        self.queues = None
        if self.lease is not None:
            # After the store: its last writes still ran under the lease. Letting it
            # pass now hands over at once instead of after it expires.
            self.lease.release()
            self.lease = None
        if errors:
            raise errors[0]


def _exit_unclosed(why: str, after: float, code: int) -> None:
    """End the process with ``code`` at once, the stop ``why`` having taken ``after``
    seconds without finishing."""
    log.error(
        f"stopped without closing ({why}): the stop did not finish within {after:g} s",
        extra={"event": "stop", "reason": "lease_lost" if code == 3 else "error"},
    )
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    os._exit(code)


def _default_advertise_url(config: ServerConfig) -> str:
    """``http://HOST:PORT``, an IPv6 address in brackets (``http://::1:8470`` is no
    URL: the other instances could not forward to it)."""
    host = config.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{config.port}"


#: How long a read waits for a connection of the PostgreSQL store's read pool (seconds;
#: docs/configuration.md, ``pg_readers``).
PG_READ_WAIT = 10.0


def _open_store(config: ServerConfig) -> Store:
    """PostgreSQL where ``store`` names a database, else LMDB in ``data_dir``."""
    if config.store is None:
        return LmdbStore(config.store_dir, map_size=config.map_size, sync=config.sync)
    _check_store_url(config)
    from tidings.store.backends.postgres import PostgresStore

    url = config.store
    # A connection whose network path was cut fails within about the lease, as the
    # lease's own connections do: the lease is lost by then anyway.
    return _unreachable(
        lambda: PostgresStore(
            url,
            readers=config.pg_readers,
            tcp_timeout=config.lease_seconds,
            connect_timeout=config.pg_connect_timeout,
            read_wait=PG_READ_WAIT,
        )
    )


def _check_store_url(config: ServerConfig) -> None:
    """A ``postgresql://`` URL, and psycopg to reach it; ConfigError otherwise."""
    assert config.store is not None
    if not config.store.startswith(("postgresql://", "postgres://")):
        shown = _without_password(config.store)
        raise ConfigError(f"store must be a postgresql:// URL, got {shown!r}")
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        raise ConfigError(
            "a PostgreSQL store needs psycopg: pip install 'tidings[postgres]'"
        ) from None


def _without_password(url: str) -> str:
    """``url`` with the password of its user part masked: the message goes to stdout
    and the log."""
    return _PASSWORD.sub(r"\1:***@", url, count=1)


def _unreachable(open_: Callable[[], T]) -> T:
    """``open_()``, with the database's connection errors as one clear Tidings error."""
    import psycopg

    try:
        return open_()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            # Reached, but a standby (or a URL whose first host is one): "cannot
            # reach" sent the operator looking at the network.
            raise ServiceUnavailable(
                "the PostgreSQL store takes no writes (a read-only server, a standby? "
                f"the URL must lead to the primary): {reason}"
            ) from None
        if isinstance(exc, psycopg.errors.ConnectionTimeout):
            # A database that never answered (a black-holed address, a firewall that
            # drops): say how long it was given, and which setting that is.
            reason = f"no answer within the connect timeout (pg_connect_timeout): {reason}"
        raise ServiceUnavailable(f"cannot reach the PostgreSQL store: {reason}") from None

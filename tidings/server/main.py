"""``tidings serve``: open the services, serve HTTP with uvicorn, shut down cleanly.

SIGTERM or SIGINT: stop accepting connections, release parked long-polls, let
in-flight requests finish (their writes become durable), close the services and the
store, exit 0. A second SIGINT skips the wait. Exit 1 if the server cannot start (2 for
a setting that is wrong), with one line for people on stdout, ``Error: ...``, as
``listening on ...`` is when it starts; the JSON log lines, for machines, go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import orjson
import uvicorn
import uvloop
from starlette.types import ASGIApp, Receive, Scope, Send

import tidings
from tidings.errors import ConfigError, LeaseLost, ServiceUnavailable, TidingsError
from tidings.server.alone import LoneRequest
from tidings.server.app import create_app
from tidings.server.auth import Authenticator
from tidings.server.config import ServerConfig
from tidings.server.handlers import Api, hosts_of
from tidings.server.inbox import LoopInbox
from tidings.server.logs import configure_logging
from tidings.server.longpoll import LongPolls
from tidings.server.memory import keep_large_buffers
from tidings.server.metrics import Metrics, Sources
from tidings.server.protocol import HttpProtocol
from tidings.server.services import Services

if TYPE_CHECKING:
    from tidings.cluster.lease import LeaderLease
    from tidings.server.forward import Forwarder

__all__ = ["run"]

log = logging.getLogger("tidings.server")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    """uvicorn's server with our signal handling and start-up line.

    uvicorn re-raises a captured signal once it has shut down, which would kill the
    process before the store is closed; here the signal only starts the shutdown and
    :func:`run` decides the exit code.
    """

    def __init__(
        self, config: uvicorn.Config, on_signal: Callable[[int], None], extra: dict[str, object]
    ) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._extra = extra
        self.received: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
        if self.received is None:
            self.received = sig
            self._on_signal(sig)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            ports = [s.getsockname()[1] for srv in self.servers for s in srv.sockets]
            log.info(
                "started",
                extra={"event": "start", "port": ports[0] if ports else None, **self._extra},
            )
            if ports:
                # For people: one line on stdout (the JSON logs, for machines, go to stderr).
                host = self.config.host
                shown = f"[{host}]" if ":" in host else host
                scheme = "https" if self.config.is_ssl else "http"
                print(f"listening on {scheme}://{shown}:{ports[0]}", flush=True)


def run(config: ServerConfig) -> int:
    """Serve until SIGTERM/SIGINT; the process exit code."""
    configure_logging(config.log_level, config.access_log)
    keep_large_buffers()
    about = {
        "version": tidings.__version__,
        "pid": os.getpid(),
        "host": config.host,
        "role": config.role,
        "data_dir": str(config.data_dir),
    }
    try:
        auth = _security(config)
    except ConfigError as exc:
        log.error(f"cannot start: {exc.message}", extra={"event": "error", **about})
        _tell(exc.message)
        return 2
    lease: LeaderLease | None = None
    services: Services | None = None
    try:
        if config.store is not None:
            # Several instances may share the database: lead now if nobody does, else
            # stand by (forwarding every request to the leader) until the lease passes.
            # (Refused for a role other than `all`: a transactions-only process would
            # otherwise keep its log in data_dir, the store unused.)
            lease = Services.new_lease(config)
        if lease is None or lease.take():
            services = Services.open(config, lease)
    except Exception as exc:
        # Expected failures (a data directory in use or out of reach) are one line
        # each, without a traceback; anything else keeps its traceback in the log.
        expected = isinstance(exc, TidingsError | OSError)
        reason = _reason(exc)
        log.error(
            f"cannot open the services: {reason}",
            exc_info=None if expected else exc,
            extra={"event": "error", **about},
        )
        _tell(f"cannot start: {reason}")
        return 2 if isinstance(exc, ConfigError) else 1  # a bad setting (a store URL)
    bind_errors = _LastError()
    logging.getLogger("uvicorn.error").addHandler(bind_errors)
    holder = _Holder(services, lease)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            started, received = runner.run(_serve(config, holder, about, auth))
    except BaseException as exc:
        log.error(f"server failed: {exc!r}", exc_info=exc, extra={"event": "error", **about})
        _tell(f"server failed: {_reason(exc)}")
        holder.close()
        return 1
    finally:
        logging.getLogger("uvicorn.error").removeHandler(bind_errors)
    services = holder.services
    try:
        holder.close()
    except Exception as exc:
        log.error(f"closing failed: {exc}", exc_info=exc, extra={"event": "error", **about})
        return 1
    if not started:
        log.error("server did not start", extra={"event": "error", **about})
        why = bind_errors.message or "see the log lines above"
        _tell(f"cannot listen on {config.host}:{config.port}: {why}")
        return 1
    if holder.failed is not None:
        _tell(holder.failed)
        return 1
    if services is not None and services.lease_lost is not None:
        log.error(
            f"stopped: lost the leader lease ({services.lease_lost})",
            extra={"event": "stop", "reason": "lease_lost", **about},
        )
        return 3
    if services is not None and services.log_failed is not None:
        log.error(
            f"stopped: {services.log_failed}",
            extra={"event": "stop", "reason": "log_failed", **about},
        )
        _tell(f"stopped: {services.log_failed}")
        return 1
    reason = signal.Signals(received).name if received is not None else "exit"
    log.info("stopped", extra={"event": "stop", "reason": reason, **about})
    return 0


def _tell(problem: str) -> None:
    """The one line for people (stdout, like ``listening on``) when the server stops."""
    print(f"Error: {problem}", flush=True)


def _reason(exc: BaseException) -> str:
    """What went wrong, in one line, without the exception's class when it says little."""
    if isinstance(exc, TidingsError):
        return exc.message
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return " ".join(str(exc).split()) or type(exc).__name__


class _LastError(logging.Handler):
    """Keeps uvicorn's last error line: why it could not bind (uvicorn only logs it)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = " ".join(record.getMessage().split())


def _security(config: ServerConfig) -> Authenticator | None:
    """The auth file's principals (None without one), after checking the TLS settings;
    warns when a non-loopback address is served without authentication."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls_cert and tls_key go together: set both or neither")
    if config.tls_cert is not None and config.tls_key is not None:
        # Loaded here, not first by uvicorn, so that a wrong file is one line.
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(config.tls_cert, config.tls_key)
        except OSError as exc:  # ssl.SSLError is one
            raise ConfigError(
                f"cannot load tls_cert {config.tls_cert} and tls_key {config.tls_key}: "
                f"{_reason(exc)}"
            ) from None
    auth = Authenticator(config.auth_file) if config.auth_file is not None else None
    if auth is None and not _loopback(config.host):
        log.warning(
            f"listening on {config.host} without an auth file: anyone who reaches the port "
            "may read, publish and administer everything (docs/security.md)",
            extra={"event": "security"},
        )
    return auth


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class _Holder:
    """The services (opened later by an instance that stands by at first) and the
    leader lease of a PostgreSQL store."""

    services: Services | None
    lease: LeaderLease | None
    #: Why taking over failed (the server then stops and exits 1).
    failed: str | None = None

    def close(self) -> None:
        if self.services is not None:
            self.services.close()
        elif self.lease is not None:
            self.lease.release()


class _Switch:
    """The ASGI app of an instance that may change from forwarding to leading."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


#: Answered about this process whatever its lease: liveness, readiness, its metrics.
_ABOUT_ME = frozenset({"/healthz", "/readyz", "/metrics"})


class _Leading:
    """The leader's app, serving only while its lease is current.

    A leader paused past its lease (SIGSTOP, a frozen VM) runs again with the requests
    that arrived meanwhile waiting to be read, and answers them before its renewal
    learns that another instance leads: writes are refused by the database's fence,
    but reads are answered from this process's memory (the transaction state, groups,
    queues), which misses what the new leader did meanwhile, so a client could be told
    a transaction it saw commit is still open. Those requests get a retriable 503
    ``LeaseLost`` instead; the clients retry, reaching the new leader."""

    def __init__(self, app: ASGIApp, lease: LeaderLease) -> None:
        self.app = app
        self._lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._lease.current and scope["path"] not in _ABOUT_ME:
            error = LeaseLost("this instance may no longer lead the cluster; retry")
            body = orjson.dumps(error.to_json())
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def _application(
    config: ServerConfig,
    services: Services,
    auth: Authenticator | None,
    loop: asyncio.AbstractEventLoop,
) -> tuple[ASGIApp, LongPolls]:
    """The server's application over opened ``services``, and its long-polls."""
    inbox = LoopInbox(loop)
    longpolls = LongPolls()
    longpolls.bind(inbox)
    messaging, tx, store = services.messaging, services.tx, services.store
    pruner = services.pruner
    sources = Sources(
        topic_counters=messaging.counters if messaging is not None else None,
        publish_latency=messaging.publish_latency if messaging is not None else None,
        producer_records=messaging.producer_records if messaging is not None else None,
        tx_state=tx.state if tx is not None else None,
        store_commits=(lambda: store.commits) if store is not None else None,
        tx_pruned=(lambda: pruner.pruned_total) if pruner is not None else None,
        group_lags=services.groups.lags if services.groups is not None else None,
        queue_stats=services.queues.stats if services.queues is not None else None,
    )
    api = Api(config, services, Metrics(sources=sources), longpolls, inbox, auth)
    if messaging is not None:
        messaging.add_listener(longpolls.on_commit)
    if services.queues is not None:  # a nack or close gives messages back: wake pops
        services.queues.add_listener(longpolls.on_commit)
    return create_app(api), longpolls


async def _serve(
    config: ServerConfig,
    holder: _Holder,
    about: dict[str, object],
    auth: Authenticator | None = None,
) -> tuple[bool, int | None]:
    loop = asyncio.get_running_loop()
    # Set once uvicorn has made it (a SIGHUP may come before).
    uv_config: uvicorn.Config | None = None

    def reload() -> None:
        # The certificate first, on the loop (the context is shared with handshakes
        # there); the principals' file is read on a worker thread.
        context = getattr(uv_config, "ssl", None)
        if isinstance(context, ssl.SSLContext):
            _reload_tls(context, config)
        if auth is not None:
            loop.run_in_executor(None, auth.reload)

    if threading.current_thread() is threading.main_thread():
        if auth is not None or config.tls_cert is not None:
            # SIGHUP reloads the principals and the TLS certificate; a file that does
            # not load changes nothing.
            loop.add_signal_handler(signal.SIGHUP, reload)
        else:
            # Nothing to reload; a service manager's "reload" must not stop the server
            # as a hangup would (without its shutdown: the next start recovers).
            loop.add_signal_handler(signal.SIGHUP, _nothing_to_reload)
    longpolls: list[LongPolls] = []
    forwarder: Forwarder | None = None
    takeover: asyncio.Task[None] | None = None
    app: ASGIApp
    if holder.services is not None:
        app, polls = _application(config, holder.services, auth, loop)
        longpolls.append(polls)
        if holder.lease is not None:
            app = _Switch(_Leading(app, holder.lease))
    else:
        assert holder.lease is not None
        forwarder = _forwarder(config, holder.lease, auth)
        switch = _Switch(forwarder)
        app = switch
        takeover = loop.create_task(_take_over(config, holder, auth, switch, longpolls))

    def on_signal(sig: int) -> None:
        if holder.services is not None:
            holder.services.serving = False  # /readyz answers 503 while draining
        elif holder.lease is not None:
            holder.lease.stop_waiting()
        for polls in longpolls:
            loop.call_soon_threadsafe(polls.close)

    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=HttpProtocol,
        lifespan="off",
        log_config=None,
        access_log=config.access_log,
        server_header=False,
        # No X-Forwarded-* rewriting: nothing uses the client address, and the
        # middleware is one more coroutine layer on every request.
        proxy_headers=False,
        timeout_graceful_shutdown=math.ceil(config.shutdown_timeout),
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
    )
    server = _Server(uv_config, on_signal, about)
    store = holder.services.store if holder.services is not None else None
    if store is not None:
        store.set_inline_check(LoneRequest(server.server_state.tasks, longpolls[0]))
    try:
        await server.serve()
    except SystemExit:
        # uvicorn exits this way when it cannot bind; it has logged why.
        return False, None
    finally:
        if store is not None:
            store.set_inline_check(None)
        if takeover is not None:
            if holder.lease is not None:
                holder.lease.stop_waiting()
            await asyncio.gather(takeover, return_exceptions=True)
        if forwarder is not None:
            await forwarder.aclose()
    return server.started, server.received


def _forwarder(config: ServerConfig, lease: LeaderLease, auth: Authenticator | None) -> Forwarder:
    from tidings.server.forward import Forwarder  # only instances on PostgreSQL need it

    # Forwarded long-polls wait up to max_wait_ms at the leader: allow that and more.
    return Forwarder(
        lease.leader_url,
        me=lease.advertise_url,
        max_body=config.max_body_bytes,
        timeout=config.max_wait_ms / 1000 + 30,
        verify=str(config.tls_cert) if config.tls_cert is not None else True,
        allowed_origins=config.allowed_origins,
        auth=auth,
        metrics_auth=config.metrics_auth,
        hosts=hosts_of(config),
    )


async def _take_over(
    config: ServerConfig,
    holder: _Holder,
    auth: Authenticator | None,
    switch: _Switch,
    longpolls: list[LongPolls],
) -> None:
    """Stand by until the lease is ours, then open the services and serve them."""
    lease = holder.lease
    assert lease is not None
    try:
        await asyncio.to_thread(lease.acquire)
    except ServiceUnavailable:
        return  # stopped while standing by
    try:
        services = await asyncio.to_thread(Services.open, config, lease)
    except Exception as exc:
        holder.failed = f"cannot take over: {_reason(exc)}"
        log.error(holder.failed, exc_info=exc, extra={"event": "error"})
        lease.release()
        os.kill(os.getpid(), signal.SIGTERM)
        return
    holder.services = services
    app, polls = _application(config, services, auth, asyncio.get_running_loop())
    longpolls.append(polls)
    switch.app = _Leading(app, lease)
    log.info("took over: this instance leads", extra={"event": "takeover", "epoch": lease.epoch})


def _reload_tls(context: ssl.SSLContext, config: ServerConfig) -> None:
    """Serve new connections with the certificate and key now in the files (renewed in
    place): checked on a fresh context first, so a pair that does not load, or does not
    match, leaves the one in use as it was."""
    assert config.tls_cert is not None and config.tls_key is not None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(config.tls_cert, config.tls_key)
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except OSError as exc:  # ssl.SSLError is one
        log.error(
            "TLS certificate not reloaded: cannot load tls_cert %s and tls_key %s: %s",
            config.tls_cert,
            config.tls_key,
            exc,
            extra={"event": "tls"},
        )
        return
    log.info("TLS certificate reloaded from %s", config.tls_cert, extra={"event": "tls"})


def _nothing_to_reload() -> None:
    log.info("SIGHUP: no auth file to reload, nothing changed", extra={"event": "reload"})

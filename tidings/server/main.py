"""``tidings serve``: open the services, serve HTTP with uvicorn, shut down cleanly.

SIGTERM or SIGINT: stop accepting connections, release parked long-polls, let
in-flight requests finish (their writes become durable), close the services and the
store, exit 0. A second SIGINT skips the wait. Exit 1 if the server cannot start.
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
import threading
from collections.abc import Callable, Generator
from types import FrameType

import uvicorn
import uvloop

import tidings
from tidings.errors import ConfigError, TidingsError
from tidings.server.app import create_app
from tidings.server.auth import Authenticator
from tidings.server.config import ServerConfig
from tidings.server.handlers import Api
from tidings.server.inbox import LoopInbox
from tidings.server.logs import configure_logging
from tidings.server.longpoll import LongPolls
from tidings.server.metrics import Metrics, Sources
from tidings.server.protocol import HttpProtocol
from tidings.server.services import Services

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
        print(f"Error: {exc.message}", flush=True)
        return 2
    try:
        services = Services.open(config)
    except TidingsError as exc:
        # Expected (a data directory in use, say): one line for people on stdout (as
        # "listening on" is), the JSON line on stderr, and no traceback in either.
        log.error(f"cannot open the services: {exc.message}", extra={"event": "error", **about})
        print(f"Error: {type(exc).__name__}: {exc.message}", flush=True)
        return 1
    except Exception as exc:
        log.error(
            f"cannot open the services: {exc}", exc_info=exc, extra={"event": "error", **about}
        )
        return 1
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            started, received = runner.run(_serve(config, services, about, auth))
    except BaseException as exc:
        log.error(f"server failed: {exc!r}", exc_info=exc, extra={"event": "error", **about})
        services.close()
        return 1
    try:
        services.close()
    except Exception as exc:
        log.error(f"closing failed: {exc}", exc_info=exc, extra={"event": "error", **about})
        return 1
    if not started:
        log.error("server did not start", extra={"event": "error", **about})
        return 1
    reason = signal.Signals(received).name if received is not None else "exit"
    log.info("stopped", extra={"event": "stop", "reason": reason, **about})
    return 0


def _security(config: ServerConfig) -> Authenticator | None:
    """The auth file's principals (None without one), after checking the TLS settings;
    warns when a non-loopback address is served without authentication."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls_cert and tls_key go together: set both or neither")
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


async def _serve(
    config: ServerConfig,
    services: Services,
    about: dict[str, object],
    auth: Authenticator | None = None,
) -> tuple[bool, int | None]:
    loop = asyncio.get_running_loop()
    inbox = LoopInbox(loop)
    longpolls = LongPolls()
    longpolls.bind(inbox)
    messaging, tx, store = services.messaging, services.tx, services.store
    pruner = services.pruner
    sources = Sources(
        topic_counters=messaging.counters if messaging is not None else None,
        tx_state=tx.state if tx is not None else None,
        store_commits=(lambda: store.commits) if store is not None else None,
        tx_pruned=(lambda: pruner.pruned_total) if pruner is not None else None,
        group_lags=services.groups.lags if services.groups is not None else None,
        queue_stats=services.queues.stats if services.queues is not None else None,
    )
    api = Api(config, services, Metrics(sources=sources), longpolls, inbox, auth)
    if auth is not None and threading.current_thread() is threading.main_thread():
        # SIGHUP reloads the principals; a file that does not load changes nothing.
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, auth.reload))
    if messaging is not None:
        messaging.add_listener(longpolls.on_commit)
    if services.queues is not None:  # a nack or close gives messages back: wake pops
        services.queues.add_listener(longpolls.on_commit)

    def on_signal(sig: int) -> None:
        services.serving = False  # /readyz answers 503 while draining
        loop.call_soon_threadsafe(longpolls.close)

    uv_config = uvicorn.Config(
        create_app(api),
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
    try:
        await server.serve()
    except SystemExit:
        # uvicorn exits this way when it cannot bind; it has logged why.
        return False, None
    return server.started, server.received

"""A TCP proxy to PostgreSQL that loses a commit's answer, cuts connections, or
black-holes new ones (tests of the PostgreSQL store's failures)."""

from __future__ import annotations

import socket
import threading
import time


class CommitCutProxy:
    """A TCP proxy to PostgreSQL on 127.0.0.1. Once armed, the first connection that
    sends a write of ``tidings_messages`` (a publish) and then a ``COMMIT`` is cut from
    the server's side (its socket closed): with ``forward`` the ``COMMIT`` goes on to
    PostgreSQL first and its answer is dropped, else it is kept back and PostgreSQL's
    session stays open inside the transaction. With ``blackhole``, from then on new
    connections are taken and never answered (until :meth:`restore`): a black-holed
    address, as a firewall that drops packets makes it."""

    def __init__(self, port: int) -> None:
        self._upstream = port
        self._lock = threading.Lock()
        self._armed: tuple[bool, bool] | None = None
        self.blackhole = threading.Event()
        self.cut = threading.Event()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, *, forward: bool, blackhole: bool = False) -> None:
        self.cut.clear()
        with self._lock:
            self._armed = (forward, blackhole)

    def restore(self) -> None:
        self.blackhole.clear()

    def cut_all(self) -> None:
        """Close every connection passed on so far, from the server's side."""
        for sock in list(self._socks):
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._socks.append(client)
            if self.blackhole.is_set():
                continue  # taken, never answered
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            self._socks.append(upstream)
            muted = threading.Event()
            for pipe, args in (
                (self._up, (client, upstream, muted)),
                (self._down, (upstream, client, muted)),
            ):
                threading.Thread(target=pipe, args=args, daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, muted: threading.Event) -> None:
        wrote = False
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                armed = self._armed
                if armed is not None:
                    wrote = wrote or b"tidings_messages" in data
                    if wrote and data.endswith(b"COMMIT\x00"):
                        self._armed = None
                    else:
                        armed = None
            if armed is not None:
                forward, blackhole = armed
                if blackhole:
                    self.blackhole.set()
                muted.set()  # nothing PostgreSQL answers reaches the server now
                if forward:
                    upstream.sendall(data)
                    time.sleep(0.2)  # PostgreSQL commits; its answer goes nowhere
                client.close()  # the upstream session stays, as after a lost network
                self.cut.set()
                return
            try:
                upstream.sendall(data)
            except OSError:
                return

    def _down(self, upstream: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        while True:
            try:
                data = upstream.recv(65536)
                if not data or muted.is_set():
                    return
                client.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._socks:
            sock.close()

"""An HTTP/1.1-aware TCP proxy that injects network faults between a client and a
server, request by request, on a schedule a test gives (tests of retries and
idempotent publishing under lost answers, cut connections and delays)."""

from __future__ import annotations

import contextlib
import enum
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable


class Fault(enum.Enum):
    """What the proxy does to one request."""

    #: Relay the request and its answer.
    PASS = "pass"
    #: Close the client's connection without forwarding: the server never sees it.
    DROP_BEFORE = "drop_before"
    #: Forward, wait for the whole answer, then close the client's connection: the
    #: server did the work, the client did not hear of it.
    DROP_AFTER = "drop_after"
    #: Forward and relay, each after a pause (``delay`` seconds): a slow network, or
    #: with a long pause, one the client's timeout gives up on.
    DELAY = "delay"
    #: Forward half the request, then close both connections: cut mid-request.
    CUT_REQUEST = "cut_request"
    #: Forward, then relay half the answer and close: cut mid-response.
    CUT_MID = "cut_mid"
    #: Forward, then relay the answer's head and half its body, and close.
    CUT_BODY = "cut_body"
    #: Relay the request and its answer, then close the connection: the client's
    #: next request on it finds it closed.
    CLOSE_AFTER = "close_after"


class FaultProxy:
    """A proxy on 127.0.0.1 to ``127.0.0.1:port``. Each request whose first line
    ``matches`` takes the next fault of the schedule (:meth:`load`); once that is used
    up, or for other requests, it passes. One request at a time per connection, as
    the clients send them (no pipelining).

    ``keep_alive`` (seconds) closes a client's connection idle that long since its
    last answer, as a server's idle timeout does: at once (``reset``: with a TCP
    reset rather than an orderly close), or, with ``close_on_arrival``, when its
    next request comes, which is then never forwarded (the server's idle timer fired
    just as the request arrived: the race a client reusing the connection loses).
    ``idle_closed`` counts the connections so closed."""

    def __init__(
        self,
        port: int,
        *,
        delay: float = 0.05,
        matches: Callable[[bytes], bool] = lambda line: True,
    ) -> None:
        self._upstream = port
        self.delay = delay
        self._matches = matches
        self._lock = threading.Lock()
        self._schedule: list[Fault] = []
        #: The faults applied so far, in order (what a failing test shrank to).
        self.applied: list[Fault] = []
        #: The first lines of the requests they were applied to.
        self.requests: list[str] = []
        self._closed = False
        self.keep_alive: float | None = None
        self.close_on_arrival = False
        self.reset = False
        self.idle_closed = 0
        self._busy = 0
        self._socks: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True, name="faultproxy").start()

    def load(self, faults: Iterable[Fault]) -> None:
        """Apply ``faults`` to the next matching requests, in order."""
        with self._lock:
            self._schedule = list(faults)
            self.applied = []
            self.requests = []

    def _next(self, line: bytes) -> Fault:
        if not self._matches(line):
            return Fault.PASS
        with self._lock:
            fault = self._schedule.pop(0) if self._schedule else Fault.PASS
            self.applied.append(fault)
            self.requests.append(line.decode("latin-1"))
            return fault

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no request is inside the proxy (a delayed one may still reach
        the server after its client gave up on it)."""
        deadline = time.monotonic() + timeout
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._busy:
            raise TimeoutError("a request stayed inside the proxy")

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in list(self._socks):
            _close(sock)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _idle_close(self, client: socket.socket) -> None:
        with self._lock:
            self.idle_closed += 1
        if self.reset:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._socks.discard(client)
            client.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        self._socks.add(client)
        try:
            upstream = socket.create_connection(("127.0.0.1", self._upstream), timeout=30)
            self._socks.add(upstream)
            client.settimeout(60)
            reader = _Reader(client)
            answers = _Reader(upstream)
            answered: float | None = None
            while not self._closed:
                keep_alive = self.keep_alive
                if keep_alive is not None and answered is not None and not self.close_on_arrival:
                    poller = select.poll()
                    poller.register(client, select.POLLIN)
                    if not poller.poll(keep_alive * 1000):
                        self._idle_close(client)
                        return
                request = reader.message(response=False)
                if request is None:
                    return
                if (
                    keep_alive is not None
                    and self.close_on_arrival
                    and answered is not None
                    and time.monotonic() - answered >= keep_alive
                ):
                    self._idle_close(client)
                    return
                fault = self._next(request.split(b"\r\n", 1)[0])
                if fault is Fault.DROP_BEFORE:
                    return
                with self._lock:
                    self._busy += 1
                try:
                    if fault is Fault.DELAY:
                        time.sleep(self.delay)
                    if fault is Fault.CUT_REQUEST:
                        upstream.sendall(request[: len(request) // 2])
                        return
                    upstream.sendall(request)
                    answer = answers.message(response=True)
                finally:
                    with self._lock:
                        self._busy -= 1
                if answer is None or fault is Fault.DROP_AFTER:
                    return
                if fault is Fault.DELAY:
                    time.sleep(self.delay)
                if fault is Fault.CUT_MID:
                    client.sendall(answer[: max(1, len(answer) // 2)])
                    return
                if fault is Fault.CUT_BODY:
                    head = answer.index(b"\r\n\r\n") + 4
                    client.sendall(answer[: head + (len(answer) - head) // 2])
                    return
                client.sendall(answer)
                answered = time.monotonic()
                if fault is Fault.CLOSE_AFTER:
                    return
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    self._socks.discard(sock)
                    _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class _Reader:
    """Whole HTTP/1.1 messages from a socket (Content-Length or chunked bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def _fill(self) -> bool:
        data = self._sock.recv(1 << 16)
        if not data:
            return False
        self._buf += data
        return True

    def _take(self, n: int) -> bytes | None:
        while len(self._buf) < n:
            if not self._fill():
                return None
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _line(self) -> bytes | None:
        while b"\r\n" not in self._buf:
            if not self._fill():
                return None
        i = self._buf.index(b"\r\n") + 2
        out, self._buf = self._buf[:i], self._buf[i:]
        return out

    def message(self, *, response: bool) -> bytes | None:
        while b"\r\n\r\n" not in self._buf:
            if not self._fill():
                return None
        end = self._buf.index(b"\r\n\r\n") + 4
        head, self._buf = self._buf[:end], self._buf[end:]
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if response and head.split(b" ", 2)[1:2] in ([b"204"], [b"304"]):
            return head
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            parts = [head]
            while True:
                size_line = self._line()
                if size_line is None:
                    return None
                parts.append(size_line)
                size = int(size_line.split(b";")[0].strip(), 16)
                chunk = self._take(size + 2)
                if chunk is None:
                    return None
                parts.append(chunk)
                if size == 0:
                    return b"".join(parts)
        body = self._take(int(headers.get(b"content-length", b"0")))
        return None if body is None else head + body

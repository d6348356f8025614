"""uvicorn's HTTP protocol with each response's head and body in one socket write.

uvicorn writes a response's status line and headers when the app sends
``http.response.start``, and the body when it sends ``http.response.body``, each with
its own ``transport.write``. uvloop writes at once whenever its buffer is empty, so
every response with a body cost two ``write`` system calls and went out as two TCP
segments, and the client often woke up twice for it. :class:`HttpProtocol` gives
uvicorn a transport that holds a response head until the next write (the body, in the
same loop turn) and hands both to uvloop together: one ``writev``, one segment. A head
that nothing follows in its loop turn (the answer to a HEAD request, ``100 Continue``,
a streamed response waiting for its first chunk) is written at the end of that turn.
Justified by BENCHMARKS.md, "Where the time goes", Latency (W3), "One write per
response" (W3 p99 lower in 7 of 10 interleaved pairs).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HttpProtocol"]

_HEAD = b"HTTP/1.1 "


class _JoinedWrites:
    """A transport that joins a response head with the write that follows it."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            # uvloop buffers both and sends them with one writev, without a copy.
            self._transport.writelines((held, data))
        elif data[:9] == _HEAD:
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write a held head now (the end of its loop turn, or before closing)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():  # the peer went away meanwhile
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, pause_reading, get_extra_info, ...) as is.
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing each response in one system call."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # (uvloop's transports are not asyncio.Transport subclasses, only alike.)
        joined = _JoinedWrites(transport, asyncio.get_running_loop())
        super().connection_made(joined)  # type: ignore[arg-type]

"""The server's HTTP protocol writes a response's head and body together, and loses
nothing: a head with no body after it in its loop turn still goes out."""

from __future__ import annotations

import asyncio
from typing import Any

from tidings.server.protocol import _JoinedWrites

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class FakeTransport:
    """Records what reaches the socket, one entry per system call."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.calls.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _run(body: Any) -> FakeTransport:
    async def main() -> FakeTransport:
        fake = FakeTransport()
        await body(fake, _JoinedWrites(fake, asyncio.get_running_loop()))  # type: ignore[arg-type]
        return fake

    return asyncio.run(main())


def test_head_and_body_go_out_in_one_write() -> None:
    async def body(fake: FakeTransport, joined: _JoinedWrites) -> None:
        joined.write(HEAD)
        assert fake.calls == []  # held for the body
        joined.write(b"hello")
        assert fake.calls == [HEAD + b"hello"]
        await asyncio.sleep(0)
        assert fake.calls == [HEAD + b"hello"]  # nothing left to flush

    _run(body)


def test_a_head_alone_goes_out_at_the_end_of_its_loop_turn() -> None:
    async def body(fake: FakeTransport, joined: _JoinedWrites) -> None:
        joined.write(HEAD)
        assert fake.calls == []
        await asyncio.sleep(0)
        assert fake.calls == [HEAD]

    _run(body)


def test_other_writes_are_not_held_and_keep_their_order() -> None:
    async def body(fake: FakeTransport, joined: _JoinedWrites) -> None:
        joined.write(b"chunk 1")
        assert fake.calls == [b"chunk 1"]
        joined.write(HEAD)
        joined.write(HEAD)  # e.g. 100 Continue, then the final head
        joined.write(b"hello")
        assert fake.calls == [b"chunk 1", HEAD + HEAD, b"hello"]

    _run(body)


def test_close_writes_a_held_head_first() -> None:
    async def body(fake: FakeTransport, joined: _JoinedWrites) -> None:
        joined.write(HEAD)
        joined.close()
        assert fake.calls == [HEAD] and fake.closed
        await asyncio.sleep(0)
        assert fake.calls == [HEAD]

    _run(body)


def test_a_held_head_is_dropped_if_the_peer_went_away() -> None:
    async def body(fake: FakeTransport, joined: _JoinedWrites) -> None:
        joined.write(HEAD)
        fake.closed = True  # connection lost before the turn ended
        await asyncio.sleep(0)
        assert fake.calls == []

    _run(body)


def test_everything_else_is_the_transports() -> None:
    async def body(fake: FakeTransport, joined: _JoinedWrites) -> None:
        assert joined.get_extra_info("peername") == "info:peername"
        assert joined.is_closing() is False

    _run(body)

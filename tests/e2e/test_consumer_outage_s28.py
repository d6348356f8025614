"""A following consumer whose server does not answer: it waits the outage out, and
the application hears of it through ``logging`` (plain consumers and group members
alike, at start and mid-stream)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import AsyncClient, Client
from tidings.structs import Message, Record

pytestmark = pytest.mark.e2e

LOGGER = "tidings.client.consumer"


@pytest.fixture
def down_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server with the topic ``t`` (one message), stopped: its port refuses."""
    proc = ServerProcess(tmp_path / "data", port=free_port()).start()
    try:
        with Client(proc.url) as client:
            client.create_topic("t")
            client.publish("t", [Record(b"first", b"k")])
        proc.stop()
        yield proc
    finally:
        proc.kill()


def _consume_in_thread(
    make: Callable[[], Iterator[Message]], got: list[bytes], errors: list[BaseException]
) -> threading.Thread:
    def run() -> None:
        try:
            for message in make():
                got.append(message.payload)
                if message.payload == b"second":
                    return
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("group", [None, "g"])
def test_a_following_consumer_started_while_the_server_is_down_warns_then_reads(
    down_server: ServerProcess, caplog: pytest.LogCaptureFixture, group: str | None
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    client = Client(down_server.url, timeout=5)
    got: list[bytes] = []
    errors: list[BaseException] = []

    def make() -> Iterator[Message]:
        if group is None:
            return iter(client.consume("t", wait=1.0))
        return iter(client.consume("t", group=group, wait=1.0, partitions=1))

    thread = _consume_in_thread(make, got, errors)
    try:
        _wait_for(lambda: any(r.levelno == logging.WARNING for r in caplog.records))
        warnings = [r for r in caplog.records if r.name == LOGGER]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        text = warnings[0].getMessage()
        assert "TidingsConnectionError" in text and "'t'" in text
        if group is not None:
            assert "'g'" in text
        assert not errors and got == []

        down_server.start()  # the same port and data: the outage ends
        with Client(down_server.url) as publisher:
            publisher.publish("t", [Record(b"second", b"k")])
        thread.join(30)
        assert not thread.is_alive() and not errors
        assert got == [b"first", b"second"]
        ended = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
        assert len(ended) == 1 and "answers again" in ended[0].getMessage()
        # One warning for the whole outage (reminders come a minute apart).
        assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1
    finally:
        client.close()


def test_a_following_group_member_warns_when_its_server_goes_away_mid_stream(
    down_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    down_server.start()
    client = Client(down_server.url, timeout=5)
    got: list[bytes] = []
    errors: list[BaseException] = []
    member = client.consume("t", group="mid", wait=0.5, partitions=1)
    thread = _consume_in_thread(lambda: iter(member), got, errors)
    try:
        _wait_for(lambda: got == [b"first"])
        assert not caplog.records
        down_server.stop()
        _wait_for(lambda: any(r.levelno == logging.WARNING for r in caplog.records))
        assert "'mid'" in caplog.records[0].getMessage()
        down_server.start()
        with Client(down_server.url) as publisher:
            publisher.publish("t", [Record(b"second", b"k")])
        thread.join(30)
        assert not thread.is_alive() and not errors
        # What was not committed comes again after the restart (at least once).
        assert got[0] == b"first" and got[-1] == b"second"
        assert any("answers again" in r.getMessage() for r in caplog.records)
    finally:
        client.close()


@pytest.mark.parametrize("group", [None, "ag"])
async def test_an_async_follower_started_while_the_server_is_down_warns_then_reads(
    down_server: ServerProcess, caplog: pytest.LogCaptureFixture, group: str | None
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with AsyncClient(down_server.url, timeout=5) as client:
        consumer = (
            client.consume("t", wait=1.0)
            if group is None
            else client.consume("t", group=group, wait=1.0, partitions=1)
        )
        first = asyncio.create_task(anext(aiter(consumer)))
        deadline = time.monotonic() + 20
        while not any(r.levelno == logging.WARNING for r in caplog.records):
            assert time.monotonic() < deadline and not first.done()
            await asyncio.sleep(0.05)
        await asyncio.to_thread(down_server.start)
        message = await asyncio.wait_for(first, 30)
        assert message.payload == b"first"
        assert [r.levelname for r in caplog.records if r.name == LOGGER] == ["WARNING", "INFO"]
        close = consumer.close()
        if close is not None:
            await close


def test_a_member_closed_while_its_server_is_down_logs_instead_of_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    proc = ServerProcess(tmp_path / "data", port=free_port()).start()
    try:
        with Client(proc.url, timeout=5) as client:
            client.create_topic("t")
            client.publish("t", [Record(b"first", b"k")])
            member = client.consume("t", group="g", follow=False, partitions=1)
            assert [m.payload for m in member.poll()] == [b"first"]
            proc.stop()
            member.close()  # the leave goes unanswered: logged, not raised
        assert any("could not leave" in r.getMessage() for r in caplog.records)
    finally:
        proc.kill()

"""Plain messaging, black-box, through the real server and clients: where the topic
ends ("latest", the newest id in stats) and what a consumer starting there gets; the
background publisher's retries of a batch whose answer was lost."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import Client, Record, RetryPolicy

pytestmark = pytest.mark.e2e


def payloads(messages: list) -> list[bytes]:  # type: ignore[type-arg]
    return [m.payload for m in messages]


def test_a_newest_message_past_its_own_ttl_is_not_the_end(
    server: ServerProcess, topic: str
) -> None:
    # The last entry of the topic expired (its own TTL) while older messages live: the
    # newest live message is the one before it, not none at all -- "none" made a
    # consumer starting at "latest" read the whole topic again.
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
        client.publish(topic, Record(b"short-lived", ttl=1))
        client.publish(topic, Record(b"short-lived too", key=b"k", ttl=1))
        time.sleep(1.2)
        live = list(client.consume(topic, follow=False))
        assert payloads(live) == [b"a", b"b"]
        assert client.end(topic).newest_id == live[-1].id
        stats = client.stats(topic)
        assert stats.newest_id == live[-1].id
        assert stats.newest_time == live[-1].id.publish_ts
        for transactional in (True, False):
            latest = client.consume(
                topic, "latest", transactional=transactional, follow=True, wait=0.2
            )
            assert latest.poll() == []
            client.publish(topic, b"new")
            assert payloads(latest.poll()) == [b"new"]
            latest.close()


def test_latest_on_a_messaging_only_server_waits_for_an_open_transaction(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # A server without the transaction service cannot tell the last stable position
    # (stableKnown false): a read-committed consumer starting at "latest" must still
    # not start past the first entry of a transaction open now, or that transaction's
    # messages are never delivered to it once it commits.
    messaging = start_server("--role", "messaging")
    transactions = start_server("--role", "transactions")
    with Client(messaging.url, transactions_url=transactions.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"old-1", b"old-2"])
        tx = client.begin()
        client.publish(topic, [b"tx-1", b"tx-2"], write_pointer=tx.write_pointer)
        client.publish(topic, b"after the transaction's entry")
        end = client.end(topic)
        assert not end.stable_known
        latest = client.consume(topic, "latest", follow=True, wait=0.2)
        assert latest.poll() == []
        client.commit(tx)
        seen = payloads(latest.poll())
        assert seen == [b"tx-1", b"tx-2", b"after the transaction's entry"]
        client.publish(topic, b"new")
        assert payloads(latest.poll()) == [b"new"]
        latest.close()
        # With nothing open, "latest" is after the newest message, as before.
        quiet = client.consume(topic, "latest", follow=True, wait=0.2)
        assert quiet.poll() == []
        client.publish(topic, b"newer")
        assert payloads(quiet.poll()) == [b"newer"]
        quiet.close()
        # A transaction open on another topic only: nothing of this one is read again.
        other = topic + "-other"
        client.create_topic(other)
        elsewhere = client.begin()
        client.publish(other, b"elsewhere", write_pointer=elsewhere.write_pointer)
        after_other = client.consume(topic, "latest", follow=True, wait=0.2)
        assert after_other.poll() == []
        client.publish(topic, b"newest")
        assert payloads(after_other.poll()) == [b"newest"]
        after_other.close()
        client.commit(elsewhere)


class LostAnswers:
    """A TCP proxy to a server that, once armed, passes one publish on but drops its
    answer (the connection is cut), then refuses every connection for ``outage``
    seconds: a publish that was written, answered by a network failure that outlasts
    the client's own retries."""

    def __init__(self, target: int, outage: float) -> None:
        self.target, self.outage = target, outage
        self.port = free_port()
        self.armed = False
        self._swallow = False
        self._down_until = 0.0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LostAnswers:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._down_until:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)

        async def upstream() -> None:
            while data := await reader.read(1 << 16):
                if self.armed and b"/publish" in data:
                    self.armed, self._swallow = False, True
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downstream() -> None:
            while data := await up_reader.read(1 << 16):
                if self._swallow:  # the publish was written: its answer is lost
                    self._swallow = False
                    self._down_until = time.monotonic() + self.outage
                    writer.transport.abort()
                    up_writer.close()
                    return
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        finally:
            # Closed here too when the proxy stops mid-exchange (its tasks cancelled):
            # a stream writer left open past its loop warns when it is collected, and
            # the warning then fails whichever test is running.
            writer.close()
            up_writer.close()


@pytest.fixture
def lost_answers(server: ServerProcess) -> Iterator[LostAnswers]:
    with LostAnswers(server.port, outage=0.6) as proxy:
        yield proxy


def test_the_publisher_retries_a_batch_whose_answer_was_lost_without_a_copy(
    server: ServerProcess, lost_answers: LostAnswers, topic: str
) -> None:
    # The client's own retries (a few, within ~0.2 s) meet refused connections; the
    # publisher retries the batch later, under the same producer sequence, so the
    # server answers it as written instead of storing a second copy.
    with Client(server.url) as direct:
        direct.create_topic(topic)
    with Client(lost_answers.url) as client:
        retry = RetryPolicy(attempts=10, initial_backoff=0.3, max_backoff=0.5)
        with client.publisher(retry=retry) as publisher:
            publisher.send(topic, b"first").result(timeout=10)
            lost_answers.armed = True
            assert publisher.send(topic, b"second").result(timeout=10) is None
            assert publisher.send(topic, b"third").result(timeout=10) is None
        assert (publisher.sent, publisher.failed) == (3, 0)
        messages = list(client.consume(topic, follow=False))
    assert payloads(messages) == [b"first", b"second", b"third"]


def test_more_consumers_than_connections_taken_in_turn_by_one_thread(
    server: ServerProcess, topic: str
) -> None:
    # Each consumer in the middle of a full page has its next poll sent ahead, its
    # answer read later: were every connection of the client so held, the next
    # consumer's poll could never be sent from this thread (it timed out, or with
    # follow=True waited for ever).
    topics = [f"{topic}-{i}" for i in range(12)]
    with Client(server.url, timeout=3.0, max_connections=10) as client:
        for name in topics:
            client.create_topic(name)
            client.publish(name, [b"%d" % i for i in range(250)])
        consumers = [client.consume(name, follow=False, batch_size=100) for name in topics]
        seen: dict[str, list[bytes]] = {name: [] for name in topics}
        for _ in range(4):
            for name, consumer in zip(topics, consumers, strict=True):
                seen[name] += payloads(consumer.poll())
        assert all(got == [b"%d" % i for i in range(250)] for got in seen.values())
        assert client.stats(topics[0]).message_count == 250
        for consumer in consumers:
            consumer.close()


def test_a_follower_from_latest_outlives_a_server_down_when_it_starts(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # Where "latest" is, is asked of the server at the first poll: a follower waits
    # out an outage there too, as it does for its polls (it raised at once). It then
    # starts where the topic ends once the server answers again.
    srv = start_server()
    stop = threading.Event()
    with Client(srv.url, timeout=2.0) as client:
        client.create_topic(topic)
        client.publish(topic, [b"before"])
        follower = client.consume(topic, "latest", wait=0.5)
        srv.kill()

        def restart() -> None:
            time.sleep(1.0)
            srv.start()
            with Client(srv.url) as other:
                n = 0
                while not stop.wait(0.2):
                    other.publish(topic, [b"after-%d" % n])
                    n += 1

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            first = next(follower).payload
            second = next(follower).payload
        finally:
            stop.set()
            thread.join()
            follower.close()
    assert first.startswith(b"after-")
    assert second == b"after-%d" % (int(first[6:]) + 1)

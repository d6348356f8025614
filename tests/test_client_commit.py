"""The commit of client transactions against fake clients: per-topic publishes run
concurrently and roll back exactly what they wrote; a transaction of the messaging
publisher alone is one request (``publish_transaction``) or falls back step by step."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from tidings.client import AsyncClient, AsyncTransactionContext, Client, TransactionContext
from tidings.client.base import as_record, to_records
from tidings.errors import (
    PayloadTooLarge,
    ProducerFenced,
    RequestTimeout,
    RoleUnavailable,
    ServiceUnavailable,
    StoreUnavailable,
    TooManyTransactions,
    TopicNotFound,
)
from tidings.structs import ProducerInfo, Record, RollbackInfo, Transaction

WP = 7000


class Participant:
    """A TransactionAware that does nothing: its presence forces the step-by-step way."""

    name = "db"

    def start(self, transaction: Transaction) -> None:
        pass

    def changes(self) -> Iterable[bytes]:
        return ()

    def commit(self) -> None:
        pass

    def post_commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass


class AsyncParticipant:
    """:class:`Participant` for async contexts."""

    name = "db"

    async def start(self, transaction: Transaction) -> None:
        pass

    async def changes(self) -> Iterable[bytes]:
        return ()

    async def commit(self) -> None:
        pass

    async def post_commit(self) -> None:
        pass

    async def rollback(self) -> None:
        pass


class FakeClient:
    """Records calls; ``fail`` maps a topic to the error its publish raises. Every publish
    waits at ``barrier`` (if set) until all of them have started: they must overlap."""

    def __init__(
        self, *, fail: Mapping[str, BaseException] | None = None, parties: int = 0
    ) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = dict(fail or {})
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(parties, timeout=5) if parties else None
        self.pool = ThreadPoolExecutor(4)
        self.one_request = False
        self.one_request_error: BaseException | None = None
        self.disabled = 0

    def _log(self, *call: Any) -> None:
        with self.lock:
            self.calls.append(call)

    def _commit_pool(self) -> ThreadPoolExecutor:
        return self.pool

    def _one_request_transactions(self) -> bool:
        return self.one_request

    def _no_one_request_transactions(self) -> None:
        self.disabled += 1
        self.one_request = False

    def publish_transaction(
        self, batches: Mapping[str, Any], *, timeout: float | None, **kw: Any
    ) -> Transaction:
        parts = {t: [as_record(r).payload for r in to_records(m)] for t, m in batches.items()}
        self._log("publish_transaction", parts, kw.get("transactional_id"))
        if self.one_request_error is not None:
            raise self.one_request_error
        return Transaction(WP - 1, WP)

    def begin(self, timeout: float | None, **kw: Any) -> Transaction:
        self._log("begin")
        return Transaction(WP - 1, WP)

    def store(self, topic: str, records: list[Record | bytes], *, write_pointer: int) -> None:
        self._log("store", topic)

    def publish(
        self, topic: str, records: Iterable[Record | bytes], *, write_pointer: int
    ) -> RollbackInfo:
        if self.barrier is not None:
            self.barrier.wait()
        self._log("publish", topic)
        error = self.fail.get(topic)
        if error is not None:
            raise error
        return RollbackInfo(write_pointer, len(topic), 0, len(topic), 0)

    def rollback(self, topic: str, info: RollbackInfo) -> int:
        assert info.start_ts == len(topic)  # exactly the info that topic's publish returned
        self._log("rollback", topic)
        return 1

    def commit(self, tx: Transaction, changes: Iterable[bytes], **kw: Any) -> None:
        self._log("commit")

    def abort(self, tx: Transaction, **kw: Any) -> None:
        self._log("abort")

    def invalidate(self, tx: Transaction) -> None:
        self._log("invalidate")

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def rolled_back(self) -> set[str]:
        return {c[1] for c in self.calls if c[0] == "rollback"}


def context(client: FakeClient, *participants: Any, **kw: Any) -> TransactionContext:
    return TransactionContext(cast(Client, client), *participants, **kw)


# --- concurrent publishes at commit (sync) ---


def test_sync_commit_publishes_the_topics_concurrently() -> None:
    client = FakeClient(parties=3)
    with context(client, Participant()) as tx:
        for topic in ("a", "bb", "ccc"):
            tx.publish(topic, b"x")
    assert tx.state == "committed"
    assert sorted(c[1] for c in client.calls if c[0] == "publish") == ["a", "bb", "ccc"]
    assert client.names()[-1] == "commit"


def test_sync_failed_publish_rolls_back_exactly_the_others_and_aborts() -> None:
    client = FakeClient(fail={"bb": TopicNotFound("no bb")}, parties=3)
    with pytest.raises(TopicNotFound), context(client, Participant()) as tx:
        for topic in ("a", "bb", "ccc"):
            tx.publish(topic, b"x")
    assert client.rolled_back() == {"a", "ccc"}
    assert client.names()[-1] == "abort" and "commit" not in client.names()
    assert tx.state == "aborted"


def test_sync_publish_without_answer_still_rolls_back_the_others_then_invalidates() -> None:
    client = FakeClient(fail={"a": RequestTimeout("lost")}, parties=2)
    with pytest.raises(RequestTimeout), context(client, Participant()) as tx:
        tx.publish("a", b"x")
        tx.publish("bb", b"y")
    assert client.rolled_back() == {"bb"}
    assert client.names()[-1] == "invalidate" and "abort" not in client.names()


def test_sync_two_failures_raise_the_first_with_the_other_noted() -> None:
    client = FakeClient(fail={"a": TopicNotFound("no a"), "bb": TopicNotFound("no bb")})
    with pytest.raises(TopicNotFound) as info, context(client, Participant()) as tx:
        tx.publish("a", b"x")
        tx.publish("bb", b"y")
        tx.publish("ccc", b"z")
    assert "no a" in str(info.value)
    assert any("no bb" in note for note in info.value.__notes__)
    assert client.rolled_back() == {"ccc"}


# --- concurrent publishes at commit (async) ---


class AsyncFake:
    """The async face of a FakeClient; publishes wait until all have started."""

    def __init__(self, inner: FakeClient, parties: int) -> None:
        self.inner = inner
        self.parties = parties
        self.started = 0
        self.all_started = asyncio.Event()

    async def publish(self, topic: str, records: Any, *, write_pointer: int) -> RollbackInfo:
        self.started += 1
        if self.started >= self.parties:
            self.all_started.set()
        await asyncio.wait_for(self.all_started.wait(), 5)
        return self.inner.publish(topic, records, write_pointer=write_pointer)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kw: Any) -> Any:
            await asyncio.sleep(0)
            return method(*args, **kw)

        return call


def test_async_commit_gathers_and_rolls_back_exactly_what_was_published() -> None:
    inner = FakeClient(fail={"bb": TopicNotFound("no bb")})
    client = AsyncFake(inner, parties=3)

    async def run() -> AsyncTransactionContext:
        ctx = AsyncTransactionContext(cast(AsyncClient, client), AsyncParticipant())
        with pytest.raises(TopicNotFound):
            async with ctx as tx:
                for topic in ("a", "bb", "ccc"):
                    await tx.publish(topic, b"x")
        return ctx

    ctx = asyncio.run(run())
    assert inner.rolled_back() == {"a", "ccc"}
    assert inner.names()[-1] == "abort"
    assert ctx.state == "aborted"


def test_async_commit_of_all_topics_succeeds_concurrently() -> None:
    inner = FakeClient()
    client = AsyncFake(inner, parties=2)

    async def run() -> None:
        async with AsyncTransactionContext(cast(AsyncClient, client), AsyncParticipant()) as tx:
            await tx.publish("a", b"x")
            await tx.publish("bb", b"y")

    asyncio.run(run())
    assert inner.names().count("publish") == 2 and inner.names()[-1] == "commit"


# --- one request ---


def test_publisher_alone_commits_in_one_request() -> None:
    client = FakeClient()
    client.one_request = True
    with context(client) as tx:
        tx.publish("a", [b"1", b"2"])
        tx.publish("b", b"3")
        tx.publish("a", b"4")
        assert tx.state == "active"
    assert client.calls == [("publish_transaction", {"a": [b"1", b"2", b"4"], "b": [b"3"]}, None)]
    assert tx.state == "committed" and tx.write_pointer == WP


def test_one_request_block_that_raises_sends_nothing() -> None:
    client = FakeClient()
    client.one_request = True
    with pytest.raises(KeyError), context(client) as tx:
        tx.publish("a", b"x")
        raise KeyError("boom")
    assert client.calls == [] and tx.state == "aborted"


def test_one_request_falls_back_step_by_step_on_503() -> None:
    client = FakeClient()
    client.one_request = True
    client.one_request_error = RoleUnavailable("no transaction service here")
    with context(client) as tx:
        tx.publish("a", b"x")
    assert client.names() == ["publish_transaction", "begin", "publish", "commit"]
    assert tx.state == "committed" and client.disabled == 1


@pytest.mark.parametrize(
    "error",
    [
        ServiceUnavailable("no leader yet"),
        StoreUnavailable("the store is out of reach"),
        TooManyTransactions("full"),
    ],
)
def test_a_passing_503_falls_back_once_without_disabling(error: Exception) -> None:
    # Only a process without the service says the same for a while: after any other
    # 503 the next transaction asks for one request again.
    client = FakeClient()
    client.one_request = True
    client.one_request_error = error
    with context(client) as tx:
        tx.publish("a", b"x")
    assert client.names() == ["publish_transaction", "begin", "publish", "commit"]
    assert tx.state == "committed" and client.disabled == 0


def test_one_request_too_large_falls_back_without_disabling() -> None:
    client = FakeClient()
    client.one_request = True
    client.one_request_error = PayloadTooLarge("body too large")
    with context(client) as tx:
        tx.publish("a", b"x")
    assert client.names() == ["publish_transaction", "begin", "publish", "commit"]
    assert client.disabled == 0


def test_one_request_error_answer_means_aborted() -> None:
    client = FakeClient()
    client.one_request = True
    client.one_request_error = TopicNotFound("no such topic")
    with pytest.raises(TopicNotFound), context(client) as tx:
        tx.publish("a", b"x")
    assert client.names() == ["publish_transaction"] and tx.state == "aborted"


def test_one_request_without_answer_is_unknown() -> None:
    client = FakeClient()
    client.one_request = True
    client.one_request_error = RequestTimeout("lost")
    with pytest.raises(RequestTimeout) as info, context(client) as tx:
        tx.publish("a", b"x")
    assert client.names() == ["publish_transaction"] and tx.state == "unknown"
    assert any("unknown" in note for note in info.value.__notes__)


def test_one_request_carries_the_producer_and_its_errors() -> None:
    client = FakeClient()
    client.one_request = True
    client.one_request_error = ProducerFenced("newer epoch")
    with pytest.raises(ProducerFenced), context(client, producer=ProducerInfo("app", 1, 2)):
        pass
    assert client.calls == [("publish_transaction", {}, "app")]


def test_one_request_past_the_payload_threshold_begins_and_streams() -> None:
    client = FakeClient()
    client.one_request = True
    with context(client, payload_threshold=4) as tx:
        tx.publish("a", b"12")  # fits: buffered, nothing sent
        assert client.calls == []
        tx.publish("a", b"345")  # past the threshold: begin now, store what is buffered
    assert client.names() == ["begin", "store", "publish", "commit"]


def test_asking_for_the_transaction_begins_it() -> None:
    client = FakeClient()
    client.one_request = True
    with context(client) as tx:
        tx.publish("a", b"x")
        assert tx.write_pointer == WP  # begun now: the step-by-step way from here
    assert client.names() == ["begin", "publish", "commit"]


def test_defer_begin_false_and_participants_begin_at_once() -> None:
    for kw, participants in (({"defer_begin": False}, ()), ({}, (Participant(),))):
        client = FakeClient()
        client.one_request = True
        with context(client, *participants, **kw) as tx:
            assert client.names() == ["begin"]
            tx.publish("a", b"x")
        assert client.names() == ["begin", "publish", "commit"]


def test_async_one_request_and_the_deferred_transaction() -> None:
    inner = FakeClient()
    inner.one_request = True

    class Async(AsyncFake):
        def _one_request_transactions(self) -> bool:
            return inner.one_request

    client = Async(inner, parties=1)

    async def run() -> AsyncTransactionContext:
        ctx = AsyncTransactionContext(cast(AsyncClient, client))
        async with ctx as tx:
            await tx.publish("a", b"x")
            with pytest.raises(RuntimeError, match="begins when it commits"):
                _ = tx.transaction
        return ctx

    ctx = asyncio.run(run())
    assert inner.names() == ["publish_transaction"] and ctx.write_pointer == WP

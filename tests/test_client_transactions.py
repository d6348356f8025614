"""Client transactions against a fake client: the order of steps and every failure path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from typing import Any, cast

import pytest

from tidings.client import AsyncClient, AsyncTransactionContext, Client, TransactionContext
from tidings.client.base import as_record
from tidings.client.txbuffer import TxBuffer
from tidings.errors import (
    RequestTimeout,
    TidingsError,
    TopicNotFound,
    TransactionCommitted,
    TransactionConflict,
    TransactionFailure,
)
from tidings.structs import Record, RollbackInfo, Transaction

WP = 1000


class _RunOnResult(Future[Any]):
    """A job that runs when its result is first asked for."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        super().__init__()
        self._job: tuple[Callable[..., Any], tuple[Any, ...]] | None = (fn, args)

    def result(self, timeout: float | None = None) -> Any:
        if self._job is not None:
            (fn, args), self._job = self._job, None
            try:
                self.set_result(fn(*args))
            except BaseException as exc:
                self.set_exception(exc)
        return super().result(timeout)


class _InPlanOrder(Executor):
    """Runs a transaction's per-topic publishes one after another, in plan order (the
    committing thread takes the first, then waits for the others in turn): what these
    tests record. The real client runs them concurrently."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kw: Any) -> Future[Any]:
        return _RunOnResult(lambda *a: fn(*a, **kw), args)


class FakeClient:
    """Records every call; ``fail`` maps a method name to the error it raises."""

    def __init__(self, **fail: BaseException) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail
        self.published = 0

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))
        error = self.fail.get(name)
        if error is not None:
            raise error

    def begin(self, timeout: float | None, **kw: Any) -> Transaction:
        self._call("begin", timeout, kw.get("transactional_id"))
        return Transaction(WP - 1, WP)

    # Step by step, one publish after another: what these tests record.
    def _one_request_transactions(self) -> bool:
        return False

    def _no_one_request_transactions(self) -> None:
        pass

    def _commit_pool(self) -> Executor:
        return _InPlanOrder()

    def store(self, topic: str, records: list[Record | bytes], *, write_pointer: int) -> None:
        self._call("store", topic, [as_record(r).payload for r in records], write_pointer)

    def publish(
        self, topic: str, records: Iterable[Record | bytes], *, write_pointer: int
    ) -> RollbackInfo:
        self._call("publish", topic, [as_record(r).payload for r in records], write_pointer)
        self.published += 1
        return RollbackInfo(write_pointer, self.published, 0, self.published, 0)

    def rollback(self, topic: str, info: RollbackInfo) -> int:
        self._call("rollback", topic, info.start_ts)
        return 1

    def commit(self, tx: Transaction, changes: Iterable[bytes], **kw: Any) -> None:
        self._call("commit", tx.write_pointer, sorted(changes))

    def abort(self, tx: Transaction, **kw: Any) -> None:
        self._call("abort", tx.write_pointer)

    def invalidate(self, tx: Transaction) -> None:
        self._call("invalidate", tx.write_pointer)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class Participant:
    """A TransactionAware that logs its steps into the fake client's call list."""

    def __init__(self, log: list[tuple[Any, ...]], name: str = "db", **fail: BaseException) -> None:
        self.log = log
        self.name = name
        self.fail = fail
        self.keys: list[bytes] = [b"row-1"]

    def _step(self, step: str) -> None:
        self.log.append((f"{self.name}.{step}",))
        error = self.fail.get(step)
        if error is not None:
            raise error

    def start(self, transaction: Transaction) -> None:
        self._step("start")

    def changes(self) -> Iterable[bytes]:
        self._step("changes")
        return self.keys

    def commit(self) -> None:
        self._step("commit")

    def post_commit(self) -> None:
        self._step("post_commit")

    def rollback(self) -> None:
        self._step("rollback")


def context(client: FakeClient, *participants: Participant, **kw: Any) -> TransactionContext:
    return TransactionContext(cast(Client, client), *participants, **kw)


# --- the buffer ---


def test_buffer_publishes_directly_below_the_threshold() -> None:
    buf = TxBuffer(payload_threshold=100)
    assert buf.add("a", [Record(b"x" * 10)]) == []
    assert buf.add("b", [Record(b"y")]) == []
    assert buf.commit_plan() == [("a", [Record(b"x" * 10)], False), ("b", [Record(b"y")], False)]


def test_buffer_streams_past_the_threshold_then_publishes_the_pointer() -> None:
    buf = TxBuffer(payload_threshold=10)
    assert buf.add("a", [Record(b"12345")]) == []
    assert buf.add("a", [Record(b"678901")]) == [("a", [Record(b"12345"), Record(b"678901")])]
    assert buf.add("b", [Record(b"z")]) == []
    assert buf.add("a", [Record(b"tail")]) == []
    # a: store the rest, then publish the write pointer alone; b: direct publish.
    assert buf.commit_plan() == [("a", [Record(b"tail")], True), ("b", [Record(b"z")], False)]


def test_streaming_cuts_big_stores_into_chunks() -> None:
    from tidings.client.txbuffer import STORE_CHUNK_BYTES

    buf = TxBuffer(payload_threshold=0)
    big = [b"x" * (STORE_CHUNK_BYTES // 3)] * 7
    out = buf.add("a", big)
    assert [len(chunk) for _, chunk in out] == [3, 3, 1]


# --- the context ---


def test_commit_persists_the_publisher_last_then_commits() -> None:
    client = FakeClient()
    db = Participant(client.calls)
    with context(client, db) as tx:
        tx.publish("orders", [b"o1", "o2"])
        tx.publish("audit", b"a1")
    assert tx.state == "committed"
    assert client.calls == [
        ("begin", None, None),
        ("db.start",),
        ("db.changes",),
        ("db.commit",),
        ("publish", "orders", [b"o1", b"o2"], WP),
        ("publish", "audit", [b"a1"], WP),
        ("commit", WP, [b"row-1"]),
        ("db.post_commit",),
    ]


def test_payload_path_stores_as_it_goes() -> None:
    client = FakeClient()
    with context(client, payload_threshold=3) as tx:
        tx.publish("t", [b"ab", b"cd"])
        tx.publish("t", [b"e"])
    assert client.calls[1:] == [
        ("store", "t", [b"ab", b"cd"], WP),
        ("store", "t", [b"e"], WP),
        ("publish", "t", [], WP),
        ("commit", WP, []),
    ]


def test_an_exception_in_the_block_rolls_back_and_aborts() -> None:
    client = FakeClient()
    db = Participant(client.calls)
    with pytest.raises(KeyError), context(client, db) as tx:
        tx.publish("t", b"x")
        raise KeyError("boom")
    assert tx.state == "aborted"
    assert client.names()[-2:] == ["db.rollback", "abort"]
    assert "publish" not in client.names()  # buffered only: nothing to undo


def test_participant_commit_failure_rolls_back_and_aborts() -> None:
    client = FakeClient()
    db = Participant(client.calls, commit=OSError("disk full"))
    ctx = context(client, db)
    with pytest.raises(TransactionFailure, match=r"db\.commit") as info, ctx:
        ctx.publish("t", b"x")
    assert isinstance(info.value.__cause__, OSError)
    assert client.names()[-3:] == ["db.commit", "db.rollback", "abort"]
    assert "publish" not in client.names() and "commit" not in client.names()


def test_conflict_rolls_back_published_entries_and_aborts() -> None:
    client = FakeClient(commit=TransactionConflict("row-1 changed"))
    db = Participant(client.calls)
    with pytest.raises(TransactionConflict), context(client, db) as tx:
        tx.publish("a", b"x")
        tx.publish("b", b"y")
    assert client.names()[-6:] == [
        "publish", "commit", "db.rollback", "rollback", "rollback", "abort"
    ]  # fmt: skip
    assert [c[1] for c in client.calls if c[0] == "rollback"] == ["a", "b"]
    assert tx.state == "aborted"


def test_failed_rollback_invalidates() -> None:
    client = FakeClient(commit=TransactionConflict("x"))
    db = Participant(client.calls, rollback=OSError("gone"))
    with pytest.raises(TransactionConflict) as info, context(client, db) as tx:
        tx.publish("a", b"x")
    assert client.names()[-3:] == ["db.rollback", "rollback", "invalidate"]
    assert "abort" not in client.names()
    assert any("rollback of db failed" in note for note in info.value.__notes__)


def test_publish_failure_during_persist_rolls_back_what_was_published() -> None:
    client = FakeClient()
    original = client.publish

    def publish(
        topic: str, records: Iterable[Record | bytes], *, write_pointer: int
    ) -> RollbackInfo:
        if topic == "missing":
            client.calls.append(("publish", topic))
            raise TopicNotFound("no such topic")
        return original(topic, records, write_pointer=write_pointer)

    client.publish = publish  # type: ignore[method-assign]
    with pytest.raises(TopicNotFound), context(client) as tx:
        tx.publish("a", b"x")
        tx.publish("missing", b"y")
    assert client.names()[-4:] == ["publish", "publish", "rollback", "abort"]


def test_publish_without_answer_makes_rollback_incomplete_so_it_invalidates() -> None:
    client = FakeClient(publish=RequestTimeout("no answer"))
    with pytest.raises(RequestTimeout), context(client) as tx:
        tx.publish("a", b"x")
    assert client.names()[-2:] == ["publish", "invalidate"]


def test_commit_without_answer_that_did_commit_is_a_success() -> None:
    client = FakeClient(commit=RequestTimeout("lost"), invalidate=TransactionCommitted("yes"))
    db = Participant(client.calls)
    with context(client, db) as tx:
        tx.publish("a", b"x")
    assert tx.state == "committed"
    assert client.names()[-3:] == ["commit", "invalidate", "db.post_commit"]


def test_commit_without_answer_that_did_not_commit_is_rolled_back() -> None:
    client = FakeClient(commit=RequestTimeout("lost"))
    db = Participant(client.calls)
    with pytest.raises(RequestTimeout), context(client, db) as tx:
        tx.publish("a", b"x")
    assert tx.state == "aborted"
    assert client.names()[-5:] == ["commit", "invalidate", "db.rollback", "rollback", "abort"]


def test_commit_outcome_unknown_when_the_server_stays_away() -> None:
    client = FakeClient(commit=RequestTimeout("lost"), invalidate=RequestTimeout("still"))
    db = Participant(client.calls)
    with pytest.raises(RequestTimeout) as info, context(client, db) as tx:
        tx.publish("a", b"x")
    assert tx.state == "unknown"
    assert "db.rollback" not in client.names()  # it may have committed
    assert any("unknown" in note for note in info.value.__notes__)


def test_post_commit_failure_says_the_transaction_committed() -> None:
    client = FakeClient()
    db = Participant(client.calls, post_commit=RuntimeError("cache"))
    with pytest.raises(TransactionFailure) as info, context(client, db):
        pass
    assert any("did commit" in note for note in info.value.__notes__)
    assert "abort" not in client.names()


def test_start_failure_aborts() -> None:
    client = FakeClient()
    db = Participant(client.calls, start=ValueError("no"))
    with pytest.raises(TransactionFailure), context(client, db):
        pytest.fail("the block must not run")
    assert client.names()[-1] == "abort"


def test_explicit_abort_then_exit_does_nothing_more() -> None:
    client = FakeClient()
    with context(client) as tx:
        tx.publish("a", b"x")
        tx.abort()
        with pytest.raises(RuntimeError):
            tx.publish("a", b"y")
    assert client.names() == ["begin", "abort"]


def test_a_context_runs_once() -> None:
    ctx = context(FakeClient())
    with ctx:
        pass
    with pytest.raises(RuntimeError):
        ctx.start()


def test_producer_ids_flow_to_begin_commit_and_abort() -> None:
    from tidings.structs import ProducerInfo

    client = FakeClient()
    with context(client, producer=ProducerInfo("app", 1, 4)):
        pass
    assert client.calls[0] == ("begin", None, "app")


# --- async ---


class AsyncFakeClient:
    def __init__(self, inner: FakeClient) -> None:
        self.inner = inner

    def _one_request_transactions(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kw: Any) -> Any:
            await asyncio.sleep(0)
            return method(*args, **kw)

        return call


class AsyncParticipant:
    def __init__(self, inner: Participant) -> None:
        self.inner = inner
        self.name = inner.name

    async def start(self, transaction: Transaction) -> None:
        self.inner.start(transaction)

    async def changes(self) -> Iterable[bytes]:
        return self.inner.changes()

    async def commit(self) -> None:
        self.inner.commit()

    async def post_commit(self) -> None:
        self.inner.post_commit()

    async def rollback(self) -> None:
        self.inner.rollback()


async def test_async_context_commits_and_rolls_back() -> None:
    client = FakeClient()
    db = AsyncParticipant(Participant(client.calls))
    async with AsyncTransactionContext(cast(AsyncClient, AsyncFakeClient(client)), db) as tx:
        await tx.publish("a", b"x")
    assert client.names() == [
        "begin", "db.start", "db.changes", "db.commit", "publish", "commit", "db.post_commit"
    ]  # fmt: skip

    failing = FakeClient(commit=TransactionConflict("x"))
    db = AsyncParticipant(Participant(failing.calls))
    with pytest.raises(TransactionConflict):
        async with AsyncTransactionContext(cast(AsyncClient, AsyncFakeClient(failing)), db) as tx:
            await tx.publish("a", b"x")
    assert failing.names()[-4:] == ["commit", "db.rollback", "rollback", "abort"]


def test_errors_keep_their_class() -> None:
    assert issubclass(TransactionFailure, TidingsError)

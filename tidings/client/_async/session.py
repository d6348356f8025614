"""What consumers, publishers and transaction contexts need from a client.

The client classes satisfy this protocol; the parts built on them (consumers,
publishers, transaction contexts) depend on the protocol only, never on the client
classes, so the client package has no import cycle (the layering httpx and Starlette's
``types.py`` use). Tests give these parts small stand-ins that implement it.

The underscored members are the package's own: a stand-in implements them, users do
not call them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar, overload

from tidings.client._async.concurrency import AsyncPending, AsyncWorker
from tidings.client.api import Call, PollPage, RestApi
from tidings.client.base import MessageLike, Outgoing, ProducerLane, RetryPolicy
from tidings.client.transports import Cancellation
from tidings.codec.admin import TransactionGroupCommit
from tidings.codec.queue_bodies import TransactionAck
from tidings.structs import (
    MessageId,
    PayloadRange,
    RollbackInfo,
    TopicEnd,
    TopicStats,
    Transaction,
    TransactionEnd,
)

# ---- sync only
# from concurrent.futures import Executor
# ---- end

__all__ = ["AsyncSession"]

T = TypeVar("T")


class AsyncSession(Protocol):
    """A client, as the parts built on it use it."""

    @property
    def server_snapshots(self) -> bool: ...

    async def stats(self, topic: str) -> TopicStats: ...

    async def end(self, topic: str) -> TopicEnd: ...

    async def snapshot(self) -> Transaction: ...

    async def poll_page(
        self,
        topic: str,
        start: MessageId | int | None,
        *,
        inclusive: bool,
        limit: int | None,
        transaction: Transaction | bytes | None,
        wait: float | None,
        isolation: str | None,
        max_bytes: int | None = None,
    ) -> PollPage: ...

    @overload
    async def publish(self, topic: str, messages: MessageLike | Iterable[MessageLike]) -> None: ...

    @overload
    async def publish(
        self, topic: str, messages: MessageLike | Iterable[MessageLike], *, write_pointer: int
    ) -> RollbackInfo: ...

    def _new_lane(self) -> ProducerLane | None: ...

    async def _publish_on(
        self,
        topic: str,
        records: list[Outgoing],
        lane: ProducerLane | None,
        policy: RetryPolicy | None = None,
        cancel: Cancellation | None = None,
    ) -> None: ...

    async def store(
        self, topic: str, messages: MessageLike | Iterable[MessageLike], *, write_pointer: int
    ) -> PayloadRange: ...

    async def rollback(self, topic: str, info: RollbackInfo) -> int: ...

    async def begin(
        self,
        timeout: float | None = None,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Transaction: ...

    async def commit(
        self,
        transaction: Transaction | int,
        changes: Iterable[bytes] = (),
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> None: ...

    async def abort(
        self,
        transaction: Transaction | int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> TransactionEnd: ...

    async def invalidate(self, transaction: Transaction | int) -> TransactionEnd: ...

    async def publish_transaction(
        self,
        batches: Mapping[str, MessageLike | Iterable[MessageLike]],
        *,
        timeout: float | None = None,
        transactional_id: str | None = None,
        epoch: int | None = None,
        acks: Sequence[TransactionAck] = (),
        group_commits: Sequence[TransactionGroupCommit] = (),
    ) -> Transaction: ...

    @property
    def _api(self) -> RestApi: ...

    async def _send(
        self, call: Call[T], policy: RetryPolicy | None = None, cancel: Cancellation | None = None
    ) -> T: ...

    def _begin(self, worker: AsyncWorker, call: Call[T]) -> AsyncPending[T]: ...

    def _one_request_transactions(self) -> bool: ...

    def _no_one_request_transactions(self) -> None: ...

    # ---- sync only
    # def _commit_pool(self) -> Executor: ...
    # ---- end

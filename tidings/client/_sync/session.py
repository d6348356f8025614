# Generated from tidings/client/_async/session.py by scripts/unasync.py; do not edit.

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
from concurrent.futures import Executor
from typing import Protocol, TypeVar, overload

from tidings.client._sync.concurrency import Pending, Worker
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

__all__ = ["Session"]

T = TypeVar("T")


class Session(Protocol):
    """A client, as the parts built on it use it."""

    @property
    def server_snapshots(self) -> bool: ...

    def stats(self, topic: str) -> TopicStats: ...

    def end(self, topic: str) -> TopicEnd: ...

    def snapshot(self) -> Transaction: ...

    def poll_page(
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
    def publish(self, topic: str, messages: MessageLike | Iterable[MessageLike]) -> None: ...

    @overload
    def publish(
        self, topic: str, messages: MessageLike | Iterable[MessageLike], *, write_pointer: int
    ) -> RollbackInfo: ...

    def _new_lane(self) -> ProducerLane | None: ...

    def _publish_on(
        self,
        topic: str,
        records: list[Outgoing],
        lane: ProducerLane | None,
        policy: RetryPolicy | None = None,
        cancel: Cancellation | None = None,
    ) -> None: ...

    def store(
        self, topic: str, messages: MessageLike | Iterable[MessageLike], *, write_pointer: int
    ) -> PayloadRange: ...

    def rollback(self, topic: str, info: RollbackInfo) -> int: ...

    def begin(
        self,
        timeout: float | None = None,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> Transaction: ...

    def commit(
        self,
        transaction: Transaction | int,
        changes: Iterable[bytes] = (),
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> None: ...

    def abort(
        self,
        transaction: Transaction | int,
        *,
        transactional_id: str | None = None,
        epoch: int | None = None,
    ) -> TransactionEnd: ...

    def invalidate(self, transaction: Transaction | int) -> TransactionEnd: ...

    def publish_transaction(
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

    def _send(
        self, call: Call[T], policy: RetryPolicy | None = None, cancel: Cancellation | None = None
    ) -> T: ...

    def _begin(self, worker: Worker, call: Call[T]) -> Pending[T]: ...

    def _one_request_transactions(self) -> bool: ...

    def _no_one_request_transactions(self) -> None: ...

    def _commit_pool(self) -> Executor: ...

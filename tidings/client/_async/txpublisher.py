"""The messaging system as a transaction participant (CDAP TMS transactional publishing).

:class:`TransactionalPublisher` buffers a transaction's messages client-side and
publishes them at commit (the direct path: consumers are blocked only between that
publish and the commit). Once the buffered bytes pass ``payload_threshold`` it streams
them with ``store`` instead (the payload path, for large or long transactions); at
commit each such topic gets one ``publish`` of the write pointer alone. Its rollback
inverts the published entries with the rollback info each publish returned; stored
payloads need none (no entry refers to them). If a publish got no answer, the entries it
may have written are unknown, so its rollback fails and the transaction is invalidated.

At commit the topics are published concurrently (the async publisher gathers them, the
sync one uses the client's commit threads), so a transaction over several topics costs
one round trip and its publishes share one group commit on the server. Every topic's
publish is waited for even when another fails, and each that succeeded is recorded, so
a rollback undoes exactly what was published.
"""

from __future__ import annotations

# ---- async only
import asyncio

# ---- end
from collections.abc import Iterable

from tidings.client._async.session import AsyncSession
from tidings.client.base import MessageLike, Outgoing
from tidings.client.txbuffer import (
    DEFAULT_PAYLOAD_THRESHOLD,
    TxPublisherState,
    raise_first,
    raise_rollback_errors,
)
from tidings.structs import Transaction

__all__ = ["AsyncTransactionalPublisher"]


class AsyncTransactionalPublisher(TxPublisherState):
    """The messaging system as an :class:`AsyncTransactionAware` for
    :class:`~tidings.AsyncClient`."""

    def __init__(
        self, client: AsyncSession, *, payload_threshold: int = DEFAULT_PAYLOAD_THRESHOLD
    ) -> None:
        super().__init__(payload_threshold)
        self._client = client

    async def start(self, transaction: Transaction) -> None:
        self._begin(transaction)

    async def publish(self, topic: str, messages: MessageLike | Iterable[MessageLike]) -> None:
        """Add messages to the transaction (buffered, or streamed past the threshold)."""
        wp = self.transaction.write_pointer
        for t, records in self._add(topic, messages):
            await self._client.store(t, records, write_pointer=wp)

    async def changes(self) -> Iterable[bytes]:
        return ()

    async def commit(self) -> None:
        wp = self.transaction.write_pointer
        plan = self._buffer.commit_plan()
        if len(plan) <= 1:
            for topic, records, streamed in plan:
                await self._commit_topic(wp, topic, records, streamed)
            return
        # Every publish runs to its end, even when another fails (or the caller is
        # cancelled meanwhile), so ``published`` is complete when this returns.
        errors: list[BaseException] = []
        # ---- async only
        results = await asyncio.gather(
            *(self._commit_topic(wp, *step) for step in plan), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        # ---- sync only
        # pool = self._client._commit_pool()
        # futures = [pool.submit(self._commit_topic, wp, *step) for step in plan[1:]]
        # try:
        #     self._commit_topic(wp, *plan[0])
        # except BaseException as exc:
        #     errors.append(exc)
        # for future in futures:
        #     try:
        #         future.result()
        #     except BaseException as exc:
        #         errors.append(exc)
        # ---- end
        raise_first(errors)

    async def _commit_topic(
        self, wp: int, topic: str, records: list[Outgoing], streamed: bool
    ) -> None:
        if streamed and records:
            await self._client.store(topic, records, write_pointer=wp)
        try:
            info = await self._client.publish(topic, () if streamed else records, write_pointer=wp)
        except BaseException as exc:
            self._note_publish_failure(exc)
            raise
        self._buffer.published.append((topic, info))

    async def post_commit(self) -> None:
        self._end()

    async def rollback(self) -> None:
        errors: list[BaseException] = []
        for topic, info in self._buffer.published:
            try:
                await self._client.rollback(topic, info)
            except Exception as exc:
                errors.append(exc)
        raise_rollback_errors(self._buffer, errors)
        self._end()

# Generated from tidings/client/_async/queue.py by scripts/unasync.py; do not edit.

"""A worker's handle on a queue (docs/client.md, "Queues").

Any number of handles, in any number of processes, pop from one queue (a named group
of a topic); each message goes to one handle at a time, under a lease. The handle acks
what it finished (``ack``, or ``ack(transaction=tx)`` to make it part of a
transaction), gives back what it will not do (``nack``), and ``close()`` gives back
the rest. A lease not acked within ``ack_timeout`` returns its messages to the queue;
each delivery carries its count in ``Message.delivery_count``.

There is no background thread: nothing renews a lease behind the application's back.

With ``prefetch``, a pop that came back full sends the next pop at once (Pulsar's
receiver queue, one batch deep), so the server leases the next batch while the
application works on this one; see :class:`Queue`.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Iterable, Sequence

from tidings.client._sync.concurrency import Pending, Worker, yield_turns
from tidings.client._sync.session import Session
from tidings.client._sync.transactions import TransactionContext
from tidings.client.api import Call, check_max_bytes
from tidings.codec.admin import START_ALIASES
from tidings.errors import QueueNotFound, TidingsError, TopicNotFound
from tidings.structs import Message, MessageId, QueueStats, Transaction

__all__ = ["Queue"]


class _QueueAck:
    """A queue's acks as a participant of a transaction: the server holds them under
    its write pointer, and they count once it commits; a rollback gives them back to
    the queue (the transaction then aborts, leaving nothing behind), or to this
    handle's leases where the server refused the transaction."""

    name = "queue"

    def __init__(self, queue: Queue, context: TransactionContext) -> None:
        self._queue = queue
        self._context = context
        self._write_pointer: int | None = None

    def start(self, transaction: Transaction) -> None:
        self._write_pointer = transaction.write_pointer

    def changes(self) -> Iterable[bytes]:
        return ()

    def commit(self) -> None:
        pass  # written when the application acked

    def post_commit(self) -> None:
        pass

    def rollback(self) -> None:
        if self._write_pointer is not None:
            queue, keep = self._queue, self._context.keeps_leases
            queue._client._send(
                queue._client._api.queue_rollback(
                    queue.topic, queue.group, self._write_pointer, keep
                )
            )


def _ids(messages: Iterable[Message | MessageId]) -> list[MessageId]:
    out = [m.id if isinstance(m, Message) else m for m in messages]
    if not all(isinstance(m, MessageId) for m in out):
        raise TypeError("ack and nack take messages (or their ids)")
    return out


class Queue:
    """Pops leased messages from group ``group`` of ``topic`` (see
    :meth:`Client.queue`).

    With ``prefetch=True``, each pop that answers ``max_messages`` messages sends the
    next pop (of as many, without waiting) before it returns; the next :meth:`pop`
    takes its answer. Those messages are leased to this handle from the moment the
    server answers, as Pulsar's receiver queue holds messages dispatched to a
    consumer: their ``ack_timeout`` runs while the application still works on the
    batch before. A batch fetched ahead that is not asked for within half the
    ``ack_timeout`` is given back (a nack: the delivery counted) and the pop asks
    afresh; :meth:`close` gives it back too.
    """

    def __init__(
        self,
        client: Session,
        topic: str,
        group: str,
        *,
        ack_timeout: float = 30.0,
        max_deliveries: int | None = None,
        dead_letter_topic: str | None = None,
        start: str = "earliest",
        prefetch: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        if not (ack_timeout > 0 and math.isfinite(ack_timeout)):
            # Infinity would pass and then fail each pop as it became milliseconds.
            raise ValueError(f"ack_timeout must be a positive number of seconds, got {ack_timeout}")
        start = START_ALIASES.get(start, start)
        if start not in ("earliest", "latest"):
            raise ValueError(
                "a queue starts at 'earliest' (or 'beginning') or 'latest' (or 'end') "
                "when it is created"
            )
        if max_deliveries is not None and max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        self._client = client
        self.topic = topic
        self.group = group
        self.ack_timeout = ack_timeout
        self._max_deliveries = max_deliveries
        self._dead_letter = dead_letter_topic
        self._start = start
        self._max_bytes = check_max_bytes(max_bytes)
        #: This handle's id on the server: the owner of its leases.
        self.consumer_id = uuid.uuid4().hex
        self._closed = False
        self.prefetch = prefetch
        #: Messages fetched ahead and not handed out yet, and when their pop was sent.
        self._fetched: list[Message] = []
        self._fetched_at = 0.0
        self._ahead: tuple[float, Pending[list[Message]]] | None = None
        self._worker = Worker("tidings-queue-prefetch")

    def pop(
        self,
        max_messages: int = 1,
        wait: float = 0.0,
        *,
        ack: Sequence[Message | MessageId] = (),
    ) -> list[Message]:
        """The oldest available messages, at most ``max_messages``, leased to this
        handle for ``ack_timeout`` seconds; waits up to ``wait`` seconds for some when
        none is available (then answers an empty list).

        ``ack``: messages this handle popped and finished, acked first in the same
        request (a worker's loop then makes one request per batch: ``batch = await
        q.pop(100, ack=batch)``). They are acked for good when ``pop`` returns; if
        they cannot be (:class:`~tidings.errors.AckConflict`,
        :class:`~tidings.errors.NotDelivered`, as :meth:`ack` raises), nothing is
        acked and nothing popped."""
        if self._closed:
            raise RuntimeError("the queue handle is closed")
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        ack_ids = _ids(ack)
        self._take_ahead()
        fetched = self._fetched
        if fetched and time.monotonic() - self._fetched_at > self.ack_timeout / 2:
            # Too near the end of its lease to hand out: back to the queue (messages
            # that passed to another worker since are skipped, the rest go back).
            self._fetched = []
            with contextlib.suppress(TidingsError):
                self.nack(fetched)
            fetched = []
        if fetched:
            if ack_ids:
                self.ack(ack_ids)
            popped, self._fetched = fetched[:max_messages], fetched[max_messages:]
        else:
            popped = self._client._send(self._pop_call(max_messages, wait, ack_ids))
        if self.prefetch and len(popped) == max_messages and not self._fetched:
            call = self._pop_call(max_messages, 0.0)
            self._ahead = (time.monotonic(), self._client._begin(self._worker, call))
            yield_turns()  # let the request go out
        return popped

    def _pop_call(
        self, max_messages: int, wait: float, ack_ids: Sequence[MessageId] = ()
    ) -> Call[list[Message]]:
        return self._client._api.queue_pop(
            self.topic,
            self.group,
            self.consumer_id,
            max_messages,
            wait,
            ack_timeout_ms=max(1, round(self.ack_timeout * 1000)),
            max_deliveries=self._max_deliveries,
            dead_letter_topic=self._dead_letter,
            start=self._start,
            ack_ids=ack_ids,
            max_bytes=self._max_bytes,
        )

    def _take_ahead(self) -> None:
        """The answer of the pop sent ahead, if any, into the fetched messages. A
        failed one is dropped: whatever it leased comes back after ``ack_timeout``."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        sent, pending = ahead
        try:
            messages = pending.result()
        except TidingsError:
            return
        if messages:
            self._fetched, self._fetched_at = messages, sent

    def ack(
        self,
        messages: Sequence[Message | MessageId],
        *,
        transaction: TransactionContext | None = None,
    ) -> None:
        """Done with ``messages``: never delivered to this group again. With
        ``transaction``, done if and only if it commits (after an abort they are
        delivered again).

        :class:`~tidings.errors.AckConflict` if a lease passed to another worker (the
        transaction is invalidated then); :class:`~tidings.errors.NotDelivered` for
        messages this handle never popped."""
        ids = _ids(messages)
        if not ids:
            return
        api = self._client._api
        if transaction is None:
            self._client._send(api.queue_ack(self.topic, self.group, self.consumer_id, ids))
            return
        if transaction.defer_acks(self.topic, self.group, self.consumer_id, ids):
            return  # they go with the transaction's one request
        tx = transaction.enlist(_QueueAck(self, transaction))
        self._client._send(
            api.queue_ack(self.topic, self.group, self.consumer_id, ids, tx.write_pointer)
        )

    def nack(self, messages: Sequence[Message | MessageId]) -> list[MessageId]:
        """Give ``messages`` back to the queue at once: they are delivered again, ahead
        of newer ones. Returns the ids of those it skipped because this handle no
        longer held them (their lease ran out and another worker took or acked them,
        they were dead-lettered or acked, or never popped by this handle); the rest
        were given back all the same."""
        ids = _ids(messages)
        if not ids:
            return []
        return self._client._send(
            self._client._api.queue_nack(self.topic, self.group, self.consumer_id, ids)
        )

    def extend(
        self, messages: Sequence[Message | MessageId], ack_timeout: float | None = None
    ) -> list[MessageId]:
        """Keep ``messages`` leased to this handle for ``ack_timeout`` seconds from now
        (default the handle's ``ack_timeout``): a worker on a long job calls it before
        its lease runs out, so no other worker gets the job meanwhile. Not a delivery
        (counts stay). Returns the ids it skipped because this handle no longer held
        them (as :meth:`nack`); a message whose lease ran out is still held while no
        other worker took it."""
        ids = _ids(messages)
        if not ids:
            return []
        seconds = self.ack_timeout if ack_timeout is None else ack_timeout
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"ack_timeout must be a positive number of seconds, got {seconds}")
        return self._client._send(
            self._client._api.queue_extend(
                self.topic, self.group, self.consumer_id, ids, max(1, round(seconds * 1000))
            )
        )

    def stats(self) -> QueueStats:
        """The queue's state and counters (:class:`~tidings.structs.QueueStats`)."""
        return self._client._send(self._client._api.queue_describe(self.topic, self.group))

    def close(self) -> None:
        """Give back every message this handle holds, at once. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # A pop sent ahead is answered first: released after it, its leases go too.
        self._take_ahead()
        self._fetched = []
        self._worker.close()
        # Never popped, or deleted meanwhile (deleting the topic deletes its queues):
        # nothing is leased then, and a `with` block's own error must not be replaced.
        with contextlib.suppress(QueueNotFound, TopicNotFound):
            self._client._send(
                self._client._api.queue_release(self.topic, self.group, self.consumer_id)
            )

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None:
            self.close()
            return
        # The block's own error is what the caller must see: a release that fails too
        # (the server is down, likely the same cause) is attached to it, not raised
        # in its place.
        try:
            self.close()
        except Exception as release_error:
            exc.add_note(
                f"and giving back this queue handle's messages failed too: "
                f"{type(release_error).__name__}: {release_error}"
            )

"""Everything the sync and async clients share that is not the REST API itself.

Configuration (:class:`BaseClient`), the retry policy, what a message and a start
position may be, and read-only snapshots. The requests and the decoding of answers are
:mod:`tidings.client.api`; :class:`~tidings.Client` and :class:`~tidings.AsyncClient`
only send calls, wait between retries and sleep, so the two cannot drift (httpx's
``BaseClient``).
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias

from tidings.client.api import Call, RestApi
from tidings.codec.transaction import encode_transaction
from tidings.codec.wire import AVRO_EXT, Media
from tidings.errors import InvalidMessageId, TidingsError
from tidings.names import DEFAULT_URL, INT64_MAX
from tidings.structs import MessageId, Record, Transaction, TransactionState

__all__ = [
    "DEFAULT_MEDIA",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TIMEOUT",
    "NO_RETRY",
    "READ_ONLY_WRITE_POINTER",
    "BaseClient",
    "bearer_token",
    "LanePool",
    "ProducerLane",
    "MessageLike",
    "Outgoing",
    "RetryPolicy",
    "StartPosition",
    "as_record",
    "concrete_start",
    "encoded_transaction",
    "read_only_snapshot",
    "resolve_start",
    "to_record",
    "to_records",
]

DEFAULT_NAMESPACE = "default"
#: Seconds to wait for an answer; a long poll waits its ``wait`` on top of this.
DEFAULT_TIMEOUT = 30.0
#: Measured in benchmarks/http_clients.py (docs/client.md): per 500-message body the
#: Avro extension costs less CPU than base64-in-JSON to publish (encode + decode) and to
#: poll, and is 25-40% smaller on the wire.
DEFAULT_MEDIA = AVRO_EXT

#: What ``publish`` accepts for one message: bytes, text (sent as UTF-8) or a Record.
MessageLike: TypeAlias = bytes | bytearray | memoryview | str | Record
#: Where consumption starts: "earliest"/"latest", a MessageId, its 40-char hex form,
#: a timestamp in ms (int or digit string), an ISO-8601 time or a datetime.
StartPosition: TypeAlias = str | int | MessageId | datetime | None


#: A message as the client sends it: a plain payload, or a Record with extras. Plain
#: payloads stay bytes, so a batch takes the wire codec's fast path.
Outgoing: TypeAlias = Record | bytes


def bearer_token(token: str | None) -> str | None:
    """``token`` as it goes in the ``Authorization`` header: space around it (a token
    file's final line break) dropped, as the server drops it. ValueError for a token
    with a line break or another control character inside, which would end the header
    line early and send what follows as headers of its own; the message never shows
    the token."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"a bearer token is a str, got {type(token).__name__}")
    token = token.strip()
    if any(c < " " or c == "\x7f" for c in token):
        raise ValueError(
            "a bearer token is one line of printable characters; this one holds a line "
            "break or another control character"
        )
    return token


def to_record(message: MessageLike) -> Outgoing:
    """The form ``message`` is sent in: text encoded as UTF-8, bytes-likes as bytes."""
    if type(message) is bytes or isinstance(message, Record):
        return message
    if isinstance(message, str):
        return message.encode()
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message)
    raise TypeError(f"a message is bytes, str or Record, not {type(message).__name__}")


#: The types a message is sent as (to_record): a list of only these is sent as it is.
_SENDABLE = frozenset({bytes, Record})


def to_records(messages: MessageLike | Iterable[MessageLike]) -> list[Outgoing]:
    """What to send for one message or an iterable of them."""
    if isinstance(messages, bytes | bytearray | memoryview | str | Record):
        return [to_record(messages)]
    if type(messages) is list and set(map(type, messages)) <= _SENDABLE:
        # Already in the form they are sent in (a copier's records, a transaction's
        # buffer passed on): the types found in C, no call per message.
        return messages.copy()
    return [to_record(m) for m in messages]


def as_record(message: Outgoing) -> Record:
    """``message`` as a :class:`Record` (for callbacks and errors)."""
    return message if isinstance(message, Record) else Record(message)


_AGO = re.compile(r"-(\d{1,9})(s|m|h|d)")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def resolve_start(start: StartPosition) -> MessageId | int | Literal["latest"] | None:
    """Normalise a start position: a message id, a timestamp in ms, "latest" or None.

    None means the oldest live message. A naive ``datetime`` is taken as local time.
    Strings: ``earliest``/``beginning``, ``latest``/``end``, a 40-hex message id, ms
    since the epoch, an ISO-8601 time, or a time before now such as ``-10m`` (``s``,
    ``m``, ``h``, ``d``).
    """
    if start is None or isinstance(start, MessageId):
        return start
    if isinstance(start, datetime):
        return int(start.timestamp() * 1000)
    if isinstance(start, bool):
        raise InvalidMessageId(f"not a start position: {start!r}")
    if isinstance(start, int):
        return _timestamp(start)
    if isinstance(start, str):
        text = start.strip()
        lowered = text.lower()
        if lowered in ("earliest", "beginning", "oldest"):
            return None
        if lowered in ("latest", "end", "newest"):
            return "latest"
        if len(text) == 40 and all(c in "0123456789abcdefABCDEF" for c in text):
            return MessageId.from_hex(text)
        if text.isdigit():
            return _timestamp(int(text))
        ago = _AGO.fullmatch(lowered)
        if ago is not None:  # "-10m": that long before now
            seconds = int(ago.group(1)) * _UNIT_SECONDS[ago.group(2)]
            return max(0, int((time.time() - seconds) * 1000))
        try:
            return int(datetime.fromisoformat(text).timestamp() * 1000)
        except ValueError:
            pass
    raise InvalidMessageId(
        "start must be earliest, latest, a message id (40 hex), "
        f"a timestamp in ms or an ISO-8601 time: {start!r}"
    )


def _timestamp(ms: int) -> int:
    """``ms`` as a start time, which the server takes only in 0..2**63-1: anything
    else is refused here, with the other bad starts, rather than sent."""
    if not 0 <= ms <= INT64_MAX:
        raise InvalidMessageId(f"a start timestamp must be from 0 to {INT64_MAX} ms: {ms}")
    return ms


def concrete_start(start: StartPosition) -> MessageId | int | None:
    """:func:`resolve_start` for one poll, which needs a concrete start: "latest" is
    :class:`InvalidMessageId` (a consumer resolves it from the topic's statistics)."""
    position = resolve_start(start)
    if position == "latest":
        raise InvalidMessageId("poll needs a concrete start; consume() resolves 'latest'")
    return position


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to resend a request whose failure is retriable.

    ``attempts`` counts every try, the first included. The n-th wait is
    ``initial_backoff * multiplier**(n-1)`` capped at ``max_backoff``, each spread by
    ``±jitter`` (a fraction) so that many clients do not retry in step.
    """

    attempts: int = 3
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must not be negative and multiplier at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction in [0, 1]")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """True if try number ``attempt`` (from 1) failed with ``error`` and may be resent."""
        return attempt < self.attempts and isinstance(error, TidingsError) and error.retriable

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed try number ``attempt`` (from 1)."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return max(0.0, base * (1 + self.jitter * (2 * rand() - 1)))


#: Send once; for operations that must not be repeated blindly.
NO_RETRY = RetryPolicy(attempts=1)


#: Seconds before a client asks again for one-request transactions after a 503.
ONE_REQUEST_RETRY_AFTER = 60.0

#: The write pointer of a read-only snapshot. Pointers are ``ms x 1,000,000``, so the
#: service would hand this one out in the year 2262: no entry can ever carry it, and the
#: "own writes are visible" rule of the snapshot never applies.
READ_ONLY_WRITE_POINTER = INT64_MAX


def read_only_snapshot(state: TransactionState) -> Transaction:
    """A snapshot for reading committed data, built from the service's state.

    It sees what a transaction begun at the same moment would see: everything committed
    up to the read pointer except invalid and in-progress pointers; entries of newer
    transactions block. Unlike begin + abort, it costs one read of in-memory state: no
    write pointer, no log write, nothing left open if the reader dies.
    """
    return Transaction(
        read_pointer=state.read_pointer,
        write_pointer=READ_ONLY_WRITE_POINTER,
        invalid=tuple(state.invalid),
        in_progress=tuple(state.in_progress),
    )


def encoded_transaction(transaction: Transaction | bytes | None) -> bytes | None:
    """The poll request's ``transaction`` field for a snapshot or its encoded form."""
    if transaction is None or isinstance(transaction, bytes):
        return transaction
    return encode_transaction(transaction)


class ProducerLane:
    """One idempotent producer: an id and, per topic, the next sequence number. A lane
    has one publish in flight at a time, so its sequence reaches the server in order
    however many publishes the client sends at once (each on a lane of its own)."""

    def __init__(self) -> None:
        self.producer_id = uuid.uuid4().hex
        self._next: dict[str, int] = {}

    def renew(self) -> None:
        """Go on as a new producer (a new id, every sequence from 0)."""
        self.producer_id = uuid.uuid4().hex
        self._next.clear()

    def sequence(self, topic: str) -> int:
        """The sequence number of this lane's next publish to ``topic``."""
        return self._next.get(topic, 0)

    def advance(self, topic: str) -> None:
        """That publish is durable: the next one is one further."""
        self._next[topic] = self._next.get(topic, 0) + 1


class LanePool:
    """Free producer lanes; a publish takes one, or a new one when none is free."""

    def __init__(self) -> None:
        self._free: list[ProducerLane] = []

    def acquire(self) -> ProducerLane:
        try:
            return self._free.pop()  # atomic: threads may share the pool
        except IndexError:
            return ProducerLane()

    def release(self, lane: ProducerLane) -> None:
        """The lane's publish ended and its sequence is known: reuse it."""
        self._free.append(lane)


class BaseClient:
    """Configuration and non-I/O logic common to :class:`~tidings.Client` and
    :class:`~tidings.AsyncClient`."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        media: Media = DEFAULT_MEDIA,
        retry: RetryPolicy | None = None,
        transactions_url: str | None = None,
        idempotent: bool = True,
    ) -> None:
        if not isinstance(media, Media):
            raise TypeError(f"media must be a tidings.codec.wire.Media, not {media!r}")
        self._api = RestApi(
            url, namespace, timeout=timeout, media=media, transactions_url=transactions_url
        )
        self._retry = retry if retry is not None else RetryPolicy()
        self._server_snapshots = self._api.transactions_local
        self._one_request_retry_at = 0.0
        #: Idempotent publishing (Kafka 3's default): None when turned off.
        self._lanes = LanePool() if idempotent else None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._api.url

    @property
    def namespace(self) -> str:
        """The namespace every topic operation addresses."""
        return self._api.namespace

    @property
    def media(self) -> Media:
        """The body encoding of publish, store and poll."""
        return self._api.media

    @property
    def server_snapshots(self) -> bool:
        """True if read-committed consumers let the server take their snapshots
        (``isolation=read_committed``): the transactions are addressed at the same
        server as the messages. Set False to always take them client-side."""
        return self._server_snapshots

    @server_snapshots.setter
    def server_snapshots(self, value: bool) -> None:
        self._server_snapshots = bool(value)

    @property
    def timeout(self) -> float | None:
        """Seconds to wait for an answer (a long poll adds its wait)."""
        return self._api.timeout

    def _one_request_transactions(self) -> bool:
        """True if a transaction of the messaging publisher alone may be sent as one
        request (``publish_transaction``): the transactions live on the messaging
        server, and it did not lately answer that it cannot (503)."""
        return self._api.transactions_local and time.monotonic() >= self._one_request_retry_at

    def _no_one_request_transactions(self) -> None:
        """The server cannot (503): use the step-by-step way for a while."""
        self._one_request_retry_at = time.monotonic() + ONE_REQUEST_RETRY_AFTER

    def _policy_for(self, call: Call[Any]) -> RetryPolicy:
        return self._retry if call.request.idempotent or call.retry_on else NO_RETRY

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, namespace={self.namespace!r})"

"""The REST API of docs/api.md as calls: each operation a finished request plus the
decoder of its answer.

Each method of :class:`RestApi` returns a :class:`Call`: the
:class:`~tidings.client.transports.Request` to send and the function that turns the
:class:`~tidings.client.transports.Response` into a value, or raises the server's error
as its Tidings class. Both clients send the same calls, so they cannot drift.
"""

from __future__ import annotations

import math
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

import orjson

from tidings.client.transports import Request, Response
from tidings.codec import admin, payload_frames, queue_bodies, tx_publish, wire
from tidings.codec.wire import AVRO, AVRO_EXT, COLUMNS, JSON, ConsumeRequest, Media
from tidings.errors import (
    BadRequest,
    EmptyPublish,
    InvalidProperties,
    ServerError,
    ServiceUnavailable,
    TidingsError,
    TimeoutTooLarge,
    error_for,
)
from tidings.names import INT64_MAX, INT64_MIN, check_name
from tidings.structs import (
    GroupAssignment,
    GroupInfo,
    Message,
    MessageId,
    PayloadRange,
    ProducerInfo,
    QueueStats,
    Record,
    RollbackInfo,
    TopicEnd,
    TopicMetadata,
    TopicStats,
    Transaction,
    TransactionEnd,
    TransactionState,
)

__all__ = [
    "ISOLATION_LEVELS",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "Call",
    "IdsPage",
    "PollPage",
    "RestApi",
    "error_from_response",
]

#: The poll's ``isolation`` values (docs/api.md).
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)

T = TypeVar("T")
_BYTES = frozenset((bytes,))


def _plain(records: Sequence[Record | bytes]) -> bool:
    return _BYTES.issuperset(map(type, records))


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """A request and the decoder of its successful response."""

    request: Request
    decode: Callable[[Response], T]
    #: Errors never retried for this call, whatever the retry policy says.
    final: tuple[type[BaseException], ...] = ()
    #: For a request that is not idempotent: the errors that say it was not carried
    #: out, retried per the client's retry policy all the same (any other failure is
    #: not retried: it may have been carried out).
    retry_on: tuple[type[BaseException], ...] = ()
    #: The call to send instead if the server does not take this request's medium
    #: (415): a server older than the payloads medium gets the same request in Avro.
    fallback: Callable[[], Call[T]] | None = None

    def result(self, response: Response) -> T:
        """The decoded value, or the server's error raised as its Tidings class."""
        if response.status >= 300:
            raise error_from_response(response)
        with _answer():
            return self.decode(response)


@dataclass(frozen=True, slots=True)
class PollPage:
    """A poll response not decoded yet, with the page's extent from its headers.

    ``count`` and ``last_id`` come from ``Tidings-Count`` and ``Tidings-Last-Id``
    (docs/api.md); ``count`` is None if the server sent no (or a malformed) count.
    ``more``: the page reached its byte bound (``Tidings-More``), so more may follow
    however few messages it holds. ``generation``: the generation of the topic the page
    was read from (``Tidings-Topic-Generation``; None from a server that does not say).
    """

    body: bytes
    media: Media
    count: int | None
    last_id: MessageId | None
    more: bool = False
    generation: int | None = None

    def messages(self) -> list[Message]:
        """Decode the page (the costly part, which the consumer overlaps with I/O)."""
        if not self.body:
            return []
        with _answer("poll"):
            return wire.decode_messages(self.body, self.media)

    def iterate(self) -> wire.PageRows:
        """The page's messages, made as they are read where the medium allows
        (:func:`~tidings.codec.wire.iterate_messages`)."""
        if not self.body:
            return wire.no_rows()
        with _answer("poll"):
            return wire.iterate_messages(self.body, self.media)


def check_max_bytes(max_bytes: int | None) -> int | None:
    """``max_bytes`` if it is None or a positive integer of 64 bits; ValueError
    otherwise (a larger one the server refused as "not a positive integer")."""
    if max_bytes is not None and (
        isinstance(max_bytes, bool)
        or not isinstance(max_bytes, int)
        or not 1 <= max_bytes <= INT64_MAX
    ):
        raise ValueError(
            f"max_bytes must be a positive integer of at most {INT64_MAX}, got {max_bytes!r}"
        )
    return max_bytes


@contextmanager
def _answer(what: str = "") -> Iterator[None]:
    """Decoding a server's answer: the codecs, shared with the server, raise
    BadRequest (or a bare decoding error) for a malformed body, which here means the
    server broke its contract, not that the caller erred."""
    try:
        yield
    except (BadRequest, ValueError, IndexError, KeyError, TypeError, struct.error) as exc:
        kind = f"{what} " if what else ""
        raise ServerError(f"malformed {kind}answer from the server: {exc}") from None


def _ids(response: Response, media: Media) -> list[MessageId]:
    """The ids of an ids-only poll's answer (``?fields=id``)."""
    with _answer("poll"):
        return wire.decode_message_ids(response.body, _response_media(response, media))


def _out_of_range(value: object, path: str) -> tuple[str, int] | None:
    """Where in a request body an integer lies outside 64 bits (JSON's and the
    server's range), and how many bits it has; None if none does."""
    if isinstance(value, int) and not isinstance(value, bool):
        if INT64_MIN <= value <= INT64_MAX:
            return None
        return path, value.bit_length()
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, object]] = (
            (f"{path}.{k}" if path else str(k), v) for k, v in value.items()
        )
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _out_of_range(item, where)
        if found is not None:
            return found
    return None


def dumps_request(body: object, invalid: type[BadRequest] = BadRequest) -> bytes:
    """``body`` as JSON. An integer past 64 bits failed in orjson with a bare TypeError;
    it is refused as ``invalid`` (what the server answers for a value out of its range),
    naming the field, before anything is sent."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        found = _out_of_range(body, "")
        if found is None:
            raise
        where, bits = found
        raise invalid(
            f"{where or 'the value'} is out of range: an integer of {bits} bits, "
            f"where the server takes integers from {INT64_MIN} to {INT64_MAX}"
        ) from None


def _check_ttls(records: Sequence[Record | bytes]) -> None:
    """A message's ``ttl`` is whole seconds, at least 1, of 64 bits: the Avro body would
    carry a larger one (and JSON fail on it with a bare TypeError), for the server to
    refuse. BadRequest, as the server answers, before anything is sent."""
    for record in records:
        if type(record) is bytes:
            continue
        ttl = getattr(record, "ttl", None)
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= INT64_MAX
        ):
            raise BadRequest(
                f"a message's ttl must be whole seconds from 1 to {INT64_MAX}, got {ttl!r:.40}"
            )


def _check_limit(limit: int | None) -> int | None:
    """A poll's ``limit``, which the Avro body would write whatever its size and JSON
    cannot carry past 64 bits: BadRequest, as the server answers, before sending."""
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INT64_MAX
    ):
        raise BadRequest(f"limit must be an integer from 1 to {INT64_MAX}, got {limit!r:.40}")
    return limit


def check_timeout(timeout: float | None) -> float | None:
    """``timeout`` (seconds of a transaction) if it is None or a finite number;
    ValueError otherwise. JSON has no NaN or infinity (the encoder would send null,
    which the server reads as "its default timeout"), so such a timeout is refused here,
    whatever the medium, rather than begin a transaction with another timeout. Its range
    is the server's to check (400 ``TimeoutTooLarge``); an integer past 64 bits, which
    JSON cannot carry, goes as a float (and one past a float's range is refused here)."""
    if isinstance(timeout, int) and not isinstance(timeout, bool):
        if INT64_MIN <= timeout <= INT64_MAX:
            return timeout
        try:
            return float(timeout)
        except OverflowError:
            raise TimeoutTooLarge(
                f"timeout is not in the server's range: an integer of {timeout.bit_length()} bits"
            ) from None
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
    ):
        raise ValueError(f"timeout must be a finite number of seconds, got {timeout!r}")
    return timeout


def _write_pointer_arg(value: object, name: str, low: int = 1) -> int:
    """``value`` as a write pointer argument (an int in ``[low, 2**63 - 1]``); ValueError
    otherwise (a larger number cannot even be written in the JSON body)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
        raise ValueError(f"{name} must be an integer in [{low}, {INT64_MAX}], got {value!r}")
    return value


#: The longest ``waitMs`` sent (about 11.6 days). The server caps a wait at its
#: ``max_wait_ms`` anyway; a longer one would not fit the request's socket timeout.
MAX_WAIT_MS = 10**9


def _wait_ms(wait: float | None) -> int:
    """``wait`` seconds (None: none) as the whole milliseconds of ``waitMs``
    (negative: 0; at most :data:`MAX_WAIT_MS`); ValueError for a wait that is not a
    finite number."""
    if not wait:
        return 0
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
        raise ValueError(f"wait must be a finite number of seconds, got {wait!r}")
    return min(MAX_WAIT_MS, max(0, round(wait * 1000)))


def _wait_and_bytes(wait_ms: int, max_bytes: int | None) -> str:
    """The query string of a group poll or a pop: ``waitMs`` and ``maxBytes`` where
    set."""
    query = [f"waitMs={wait_ms}"] if wait_ms else []
    if check_max_bytes(max_bytes) is not None:
        query.append(f"maxBytes={max_bytes}")
    return "?" + "&".join(query) if query else ""


def _poll_page(response: Response, sent: Media) -> PollPage:
    headers = response.headers
    count: int | None = None
    last: MessageId | None = None
    try:
        raw_count = headers.get("tidings-count")
        if raw_count is not None:
            count = int(raw_count)
            raw_last = headers.get("tidings-last-id")
            if raw_last is not None:
                last = MessageId.from_hex(raw_last)
            elif count:
                count = None  # a non-empty page without its last id: no extent
    except (ValueError, TidingsError):
        count, last = None, None
    more = last is not None and headers.get("tidings-more") == "true"
    return PollPage(
        response.body, _response_media(response, sent), count, last, more, _generation(response)
    )


def _generation(response: Response) -> int | None:
    """A poll answer's ``Tidings-Topic-Generation``, or None (absent or malformed)."""
    raw = response.headers.get("tidings-topic-generation")
    if raw is None or not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        return None
    return int(raw)


@dataclass(frozen=True, slots=True)
class IdsPage:
    """An ids-only poll's answer: the ids, and the generation of the topic they were read
    from (``Tidings-Topic-Generation``; None from a server that does not say)."""

    ids: list[MessageId]
    generation: int | None


@dataclass(frozen=True, slots=True)
class GroupPage:
    """A group poll's answer: the page (not decoded yet) and the member's assignment as
    of this poll (from the ``Tidings-Generation``/``-Partitions`` headers)."""

    page: PollPage
    generation: int | None
    partitions: tuple[int, ...] | None
    partition_count: int | None
    #: ``Tidings-Owned-Since``: per partition, since which generation the member holds it
    #: (empty from a server that does not say).
    owned_since: tuple[int, ...] = ()


def _group_page(response: Response, sent: Media) -> GroupPage:
    headers = response.headers
    generation = partitions = count = None
    since: tuple[int, ...] = ()
    try:
        if "tidings-generation" in headers:
            generation = int(headers["tidings-generation"])
            raw = headers.get("tidings-partitions", "")
            partitions = tuple(int(p) for p in raw.split(",") if p)
            count = int(headers["tidings-partition-count"])
            raw_since = headers.get("tidings-owned-since", "")
            since = tuple(int(g) for g in raw_since.split(",") if g)
            if len(since) != len(partitions):
                since = ()
    except (ValueError, KeyError):
        generation = partitions = count = None
        since = ()
    return GroupPage(_poll_page(response, sent), generation, partitions, count, since)


def _popped(response: Response, sent: Media) -> list[Message]:
    """The messages of a pop answer, each with its delivery count."""
    messages = _poll_page(response, sent).messages()
    with _answer("pop"):
        counts = queue_bodies.read_delivery_counts(
            response.headers.get(queue_bodies.DELIVERY_COUNTS_HEADER.lower()), len(messages)
        )
    # Built whole rather than with _replace (a Python-level call per message).
    new, cls = tuple.__new__, Message
    return [
        new(cls, (m[0], m[1], m[2], m[3], m[4], n)) for m, n in zip(messages, counts, strict=True)
    ]


def error_from_response(response: Response) -> TidingsError:
    """The exception an error response stands for (``{"error", "type"}``, docs/api.md)."""
    try:
        body = orjson.loads(response.body) if response.body else None
    except orjson.JSONDecodeError:
        body = None
    if body is None:
        text = response.body[:200].decode("utf-8", "replace").strip()
        body = {"error": text or f"HTTP {response.status}"}
    return error_for(response.status, body)


def _json(response: Response) -> Any:
    try:
        return orjson.loads(response.body) if response.body else None
    except orjson.JSONDecodeError:
        raise ServerError(f"malformed JSON from the server: {response.body[:80]!r}") from None


def _response_media(response: Response, sent: Media) -> Media:
    if response.content_type is None:
        return sent
    try:
        return wire.response_media_for(response.content_type)
    except TidingsError:
        return sent


def _done(response: Response) -> None:
    """The answer of a call that returns nothing: an empty body (a publish) or a JSON
    object (``{}``). Anything else is no answer the server gives: whatever sent it,
    the request cannot be taken as carried out."""
    if response.body.strip() and not isinstance(_json(response), dict):
        raise ServerError(f"unexpected answer from the server: {response.body[:80]!r}")


def _topic(namespace: str) -> Callable[[Response], TopicMetadata]:
    def decode(response: Response) -> TopicMetadata:
        return admin.read_topic(_json(response), namespace)

    return decode


def _topic_names(response: Response) -> list[str]:
    return admin.read_topic_list(_json(response))


def _stats(response: Response) -> TopicStats:
    return admin.read_stats(_json(response))


def _begun(response: Response) -> Transaction:
    return admin.read_snapshot(_json(response))


def _state(response: Response) -> TransactionState:
    return admin.read_state(_json(response))


def _cluster(response: Response) -> dict[str, Any]:
    value = _json(response)
    if not isinstance(value, dict):
        raise ServerError(f"malformed cluster answer from the server: {value!r:.80}")
    return value


def _producer(response: Response) -> ProducerInfo:
    return admin.read_producer(_json(response))


def _ended(response: Response, verb: str) -> TransactionEnd:
    """How an abort or invalidate left the transaction. The answer must say so
    (``{"outcome", "already"}``): an empty or other answer is no proof the transaction
    ended, so it is a ServerError rather than read as done."""
    obj = _json(response)
    if not isinstance(obj, dict) or "outcome" not in obj:
        raise ServerError(f"the server's answer to {verb} says no outcome: {obj!r:.80}")
    return admin.read_ended(obj, verb)


def _aborted(response: Response) -> TransactionEnd:
    return _ended(response, "abort")


def _invalidated(response: Response) -> TransactionEnd:
    return _ended(response, "invalidate")


def _pruned(response: Response) -> list[int]:
    return admin.read_pruned(_json(response))


def _payload_range(response: Response) -> PayloadRange:
    raw = response.headers.get("tidings-payload-range")
    if raw is None:
        raise ServerError("the server sent no Tidings-Payload-Range with the store's answer")
    try:
        return wire.parse_payload_range(raw)
    except ValueError as exc:
        raise ServerError(str(exc)) from None


def _end(response: Response) -> TopicEnd:
    return admin.read_end(_json(response))


def _assignment(response: Response) -> GroupAssignment:
    return admin.read_assignment(_json(response))


def _changes(response: Response) -> list[bytes]:
    return admin.read_changes(_json(response))


def _group(response: Response) -> GroupInfo:
    return admin.read_group(_json(response))


def _queue(response: Response) -> QueueStats:
    return queue_bodies.read_queue(_json(response))


def _queue_names(response: Response) -> list[tuple[str, str]]:
    return queue_bodies.read_queue_names(_json(response))


def _released(response: Response) -> int:
    return queue_bodies.read_count(_json(response), "released")


def _nacked(response: Response) -> list[MessageId]:
    return queue_bodies.read_nack(_json(response))


def _returned(response: Response) -> int:
    return queue_bodies.read_count(_json(response), "returned")


def _purged(response: Response) -> int:
    return queue_bodies.read_count(_json(response), "purged")


def _rolled_back(response: Response) -> int:
    return admin.read_rolled_back(_json(response))


def _json_batch(topic: str, records: Sequence[Record | bytes]) -> dict[str, Any]:
    """One topic's part of a transactional publish: a JSON PublishRequest plus ``topic``."""
    check_name(topic)
    payloads = [r for r in records if type(r) is bytes]
    b64 = wire.b64encode
    if len(payloads) == len(records):  # the common case: no keys, headers or ttl
        return {"topic": topic, "messages": [b64(p) for p in payloads]}
    keyed = [r for r in records if isinstance(r, Record) and not r.headers and r.ttl is None]
    if len(keyed) == len(records):
        # Keys at most (a copier's records): the extras written directly.
        return {
            "topic": topic,
            "messages": [b64(r.payload) for r in keyed],
            "extras": [None if r.key is None else {"key": b64(r.key)} for r in keyed],
        }
    _check_ttls(records)
    part: dict[str, Any] = orjson.loads(wire.encode_publish_request(None, records, JSON))
    part.pop("transactionWritePointer", None)
    part["topic"] = topic
    return part


def _transaction_body(
    batches: Sequence[tuple[str, Sequence[Record | bytes]]],
    timeout: float | None,
    transactional_id: str | None,
    epoch: int | None,
    acks: Sequence[queue_bodies.TransactionAck],
    group_commits: Sequence[admin.TransactionGroupCommit],
    *,
    frames: bool = False,
) -> bytes | None:
    """A one-request transaction's Avro body: each topic's messages as a publish body,
    or with ``frames`` as a payloads body (None if a message has headers or a TTL, which
    only Avro carries)."""
    bodies = []
    for topic, records in batches:
        check_name(topic)
        _check_ttls(records)
        if not frames:
            bodies.append((topic, wire.encode_publish_request(None, records, AVRO_EXT)))
            continue
        try:
            bodies.append((topic, payload_frames.write_frames(None, records)))
        except ValueError:
            return None
    return tx_publish.write_transaction_publish(
        bodies,
        None if timeout is None else float(timeout),
        transactional_id,
        epoch,
        acks,
        group_commits,
    )


def check_url(url: str, what: str = "url") -> str:
    """``url`` if it is an http(s) URL a request can go to; ValueError otherwise, at
    construction rather than at the first request (where a host no DNS name can be
    failed with the IDNA codec's UnicodeError). Credentials in it (``user:pass@``) are
    refused: the server takes bearer tokens only (``token=``), and they would have
    gone out in the ``Host`` header, which the server refuses."""
    if not isinstance(url, str):
        raise ValueError(f"{what} must be a str, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracketed host that is no IPv6 address
        raise ValueError(f"{what} is not an http(s) URL: {url!r}") from None
    # Before any message quotes the URL: it must not show a password.
    if "@" in parts.netloc:
        raise ValueError(
            f"{what} holds credentials (user:password@), which the server does not "
            "take: pass a bearer token as token= instead (docs/security.md)"
        )
    try:
        parts.port  # noqa: B018  (ValueError for a port that is no number in 0..65535)
    except ValueError:
        raise ValueError(f"{what} is not an http(s) URL with a valid port: {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} is not an http(s) URL: {url!r}")
    try:
        parts.hostname.encode("idna")
    except UnicodeError:
        raise ValueError(f"{what} names a host no DNS name can be: {url!r}") from None
    if any(c <= " " or c == "\x7f" for c in parts.netloc):
        raise ValueError(f"{what} holds a space or a control character in its host: {url!r}")
    return url


class RestApi:
    """docs/api.md as :class:`Call` builders for one server and namespace."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        timeout: float | None,
        media: Media,
        transactions_url: str | None = None,
    ) -> None:
        check_url(url, "url")
        if transactions_url is not None:
            check_url(transactions_url, "transactions_url")
        self.url = url.rstrip("/")
        self.namespace = check_name(namespace, "namespace")
        self.timeout = timeout
        self.media = media
        #: Messages without headers or TTL go in the payloads medium (docs/api.md),
        #: unless the client speaks JSON or a server refused that medium once.
        self.payload_frames = media is not JSON
        self._ns_url = f"{self.url}/v1/namespaces/{namespace}"
        self._tx_url = f"{(transactions_url or url).rstrip('/')}/v1/transactions"
        #: True if the transaction service is addressed at the messaging server itself,
        #: so the server's own snapshots (``isolation=read_committed``) are the ones the
        #: transactions of this client are in.
        self.transactions_local = transactions_url is None or (
            transactions_url.rstrip("/") == self.url
        )

    # --- helpers ---

    def _topic_url(self, topic: str, suffix: str = "") -> str:
        return f"{self._ns_url}/topics/{check_name(topic)}{suffix}"

    def _json_call(
        self,
        method: str,
        url: str,
        decode: Callable[[Response], T],
        body: object = None,
        *,
        idempotent: bool = False,
        invalid: type[BadRequest] = BadRequest,
    ) -> Call[T]:
        raw = b"" if body is None else dumps_request(body, invalid)
        return Call(
            Request(
                method,
                url,
                raw,
                JSON.value if raw else None,
                self.timeout,
                idempotent=idempotent,
            ),
            decode,
        )

    # --- topics ---

    def create_topic(
        self, topic: str, ttl: int | None, properties: Mapping[str, object] | None
    ) -> Call[TopicMetadata]:
        props = admin.topic_request(ttl, properties)
        return self._json_call(
            "PUT",
            self._topic_url(topic),
            _topic(self.namespace),
            props or None,
            invalid=InvalidProperties,
        )

    def update_topic(
        self, topic: str, ttl: int | None, properties: Mapping[str, object] | None
    ) -> Call[TopicMetadata]:
        return self._json_call(
            "PUT",
            self._topic_url(topic, "/properties"),
            _topic(self.namespace),
            admin.topic_request(ttl, properties),
            idempotent=True,
            invalid=InvalidProperties,
        )

    def get_topic(self, topic: str) -> Call[TopicMetadata]:
        return self._json_call(
            "GET", self._topic_url(topic), _topic(self.namespace), idempotent=True
        )

    def list_topics(self) -> Call[list[str]]:
        return self._json_call("GET", f"{self._ns_url}/topics", _topic_names, idempotent=True)

    def delete_topic(self, topic: str) -> Call[None]:
        return self._json_call("DELETE", self._topic_url(topic), _done)

    def stats(self, topic: str) -> Call[TopicStats]:
        return self._json_call("GET", self._topic_url(topic, "/stats"), _stats, idempotent=True)

    # --- publishing ---

    def _publish_body(
        self, write_pointer: int | None, records: Sequence[Record | bytes]
    ) -> tuple[bytes, str]:
        """A publish or store body and its Content-Type: the payloads medium for
        payloads and keys (its positions up front spare the server a walk), else (with
        headers or a TTL) the client's."""
        # CDAP TMS's own Avro carries no keys: such a client sends records as before.
        if self.payload_frames and records and (self.media is not AVRO or _plain(records)):
            try:
                body = payload_frames.write_frames(write_pointer, records)
            except ValueError:
                pass  # headers or a TTL, which only the client's medium carries
            else:
                return body, payload_frames.CONTENT_TYPE
        if self.media is not AVRO and not _plain(records):
            _check_ttls(records)  # (plain Avro refuses any ttl, as ValueError)
        return wire.encode_publish_request(write_pointer, records, self.media), self.media.value

    def _unless_refused(
        self, content_type: str, again: Callable[[], Call[T]]
    ) -> Callable[[], Call[T]] | None:
        """For a body in the payloads medium, what to send if the server answers 415:
        ``again()`` with that medium off for this client from then on."""
        if content_type != payload_frames.CONTENT_TYPE:
            return None

        def refused() -> Call[T]:
            self.payload_frames = False
            return again()

        return refused

    def publish(
        self,
        topic: str,
        records: Sequence[Record | bytes],
        producer: tuple[str, int] | None = None,
    ) -> Call[None]:
        """A non-transactional publish; with ``producer`` (id in hex, sequence number) an
        idempotent one, which is safe to send again: the server writes it once."""
        if not records:
            raise EmptyPublish("a publish without a write pointer needs at least one message")
        headers: tuple[tuple[str, str], ...] = ()
        if producer is not None:
            headers = (("Tidings-Producer-Id", producer[0]), ("Tidings-Sequence", str(producer[1])))
        body, content_type = self._publish_body(None, records)
        return Call(
            Request(
                "POST",
                self._topic_url(topic, "/publish"),
                body,
                content_type,
                self.timeout,
                idempotent=producer is not None,
                headers=headers,
            ),
            _done,
            # Refused, nothing was written: the same producer sequence again is right.
            fallback=self._unless_refused(
                content_type, lambda: self.publish(topic, records, producer)
            ),
        )

    def publish_transactional(
        self,
        topic: str,
        records: Sequence[Record | bytes],
        write_pointer: int,
        payload_ranges: Sequence[PayloadRange] | None = None,
    ) -> Call[RollbackInfo]:
        # Before encoding: Avro's writer fails on a float or a pointer past 64 bits
        # with a bare struct.error, and took True for transaction 1.
        write_pointer = _write_pointer_arg(write_pointer, "write_pointer")
        media = self.media
        if payload_ranges is None:
            body, content_type = self._publish_body(write_pointer, records)
        else:
            # payloadRanges exist in the JSON body only (docs/api.md), so a publish
            # naming ranges is sent as JSON whatever the client's media.
            media = JSON
            obj: dict[str, Any] = orjson.loads(
                wire.encode_publish_request(write_pointer, records, JSON)
            )
            obj["payloadRanges"] = wire.payload_ranges_json(payload_ranges)
            body, content_type = orjson.dumps(obj), JSON.value

        def decode(response: Response) -> RollbackInfo:
            # A payloads body is answered in JSON, which the answer's Content-Type says.
            with _answer("publish"):
                return wire.decode_rollback_info(response.body, _response_media(response, media))

        return Call(
            Request("POST", self._topic_url(topic, "/publish"), body, content_type, self.timeout),
            decode,
            fallback=self._unless_refused(
                content_type,
                lambda: self.publish_transactional(topic, records, write_pointer, payload_ranges),
            ),
        )

    def store(
        self, topic: str, records: Sequence[Record | bytes], write_pointer: int
    ) -> Call[PayloadRange]:
        write_pointer = _write_pointer_arg(write_pointer, "write_pointer")
        body, content_type = self._publish_body(write_pointer, records)
        return Call(
            Request("POST", self._topic_url(topic, "/store"), body, content_type, self.timeout),
            _payload_range,
            fallback=self._unless_refused(
                content_type, lambda: self.store(topic, records, write_pointer)
            ),
        )

    def store_encoded(self, topic: str, body: bytes, write_pointer: int) -> Call[PayloadRange]:
        # The body is the caller's, already in the client's medium (checked there).
        del write_pointer  # it is inside the body
        return Call(
            Request("POST", self._topic_url(topic, "/store"), body, self.media.value, self.timeout),
            _payload_range,
        )

    def rollback(self, topic: str, info: RollbackInfo) -> Call[int]:
        # Always JSON: only JSON answers with the number of entries rolled back.
        return Call(
            Request(
                "POST",
                self._topic_url(topic, "/rollback"),
                wire.encode_rollback_info(info, JSON),
                JSON.value,
                self.timeout,
            ),
            _rolled_back,
        )

    # --- consuming ---

    def poll(
        self,
        topic: str,
        start: MessageId | int | None,
        *,
        inclusive: bool,
        limit: int | None,
        transaction: bytes | None,
        wait: float | None,
        isolation: str | None = None,
        max_bytes: int | None = None,
    ) -> Call[list[Message]]:
        media = self.media
        request, final = self._poll_request(
            topic, start, inclusive, limit, transaction, wait, isolation, max_bytes=max_bytes
        )

        def decode(response: Response) -> list[Message]:
            if not response.body:
                return []
            with _answer("poll"):
                return wire.decode_messages(response.body, _response_media(response, media))

        return Call(request, decode, final)

    def poll_page(
        self,
        topic: str,
        start: MessageId | int | None,
        *,
        inclusive: bool,
        limit: int | None,
        transaction: bytes | None,
        wait: float | None,
        isolation: str | None = None,
        max_bytes: int | None = None,
    ) -> Call[PollPage]:
        """:meth:`poll`, answered undecoded (:class:`PollPage`) with the page's extent."""
        media = self.media
        request, final = self._poll_request(
            topic, start, inclusive, limit, transaction, wait, isolation, max_bytes=max_bytes
        )
        return Call(request, lambda response: _poll_page(response, media), final)

    def poll_ids(
        self,
        topic: str,
        start: MessageId | int | None,
        *,
        inclusive: bool,
        limit: int | None,
        transaction: bytes | None,
        wait: float | None,
        isolation: str | None = None,
    ) -> Call[list[MessageId]]:
        """:meth:`poll` answering only the messages' ids (``?fields=id``)."""
        media = self.media
        request, final = self._poll_request(
            topic, start, inclusive, limit, transaction, wait, isolation, ids_only=True
        )

        return Call(request, lambda response: _ids(response, media), final)

    def poll_ids_page(
        self,
        topic: str,
        start: MessageId | int | None,
        *,
        inclusive: bool,
        limit: int | None,
        transaction: bytes | None,
    ) -> Call[IdsPage]:
        """:meth:`poll_ids`, with the generation of the topic the ids were read from."""
        media = self.media
        request, final = self._poll_request(
            topic, start, inclusive, limit, transaction, None, None, ids_only=True
        )

        return Call(
            request, lambda response: IdsPage(_ids(response, media), _generation(response)), final
        )

    def _poll_request(
        self,
        topic: str,
        start: MessageId | int | None,
        inclusive: bool,
        limit: int | None,
        transaction: bytes | None,
        wait: float | None,
        isolation: str | None,
        *,
        ids_only: bool = False,
        max_bytes: int | None = None,
    ) -> tuple[Request, tuple[type[BaseException], ...]]:
        url = self._topic_url(topic, "/poll")
        timeout = self.timeout
        query = ["fields=id"] if ids_only else []
        if check_max_bytes(max_bytes) is not None:
            query.append(f"maxBytes={max_bytes}")
        waiting = _wait_ms(wait)
        if waiting:
            query.append(f"waitMs={waiting}")
            timeout = None if timeout is None else timeout + waiting / 1000
        if isolation is not None:
            query.append("isolation=" + quote(str(isolation), safe=""))
        if query:
            url += "?" + "&".join(query)
        media = self.media
        body = wire.encode_consume_request(
            ConsumeRequest(start, inclusive, _check_limit(limit), transaction), media
        )

        # A 503 to an isolation poll means "no transaction service here": final, so a
        # consumer falls back at once instead of after the retries.
        final: tuple[type[BaseException], ...] = (
            (ServiceUnavailable,) if isolation == READ_COMMITTED else ()
        )
        # Messages come back in the columnar medium, which decodes in bulk; a client
        # that speaks JSON asked for JSON, and a server that does not know the medium
        # answers in the request's own (the answer's Content-Type says which).
        accept = None if ids_only or media is JSON else f"{COLUMNS.value}, {media.value}"
        request = Request("POST", url, body, media.value, timeout, idempotent=True, accept=accept)
        return request, final

    # --- transactions ---

    def publish_transaction(
        self,
        batches: Sequence[tuple[str, Sequence[Record | bytes]]],
        timeout: float | None,
        transactional_id: str | None,
        epoch: int | None,
        acks: Sequence[queue_bodies.TransactionAck] = (),
        group_commits: Sequence[admin.TransactionGroupCommit] = (),
    ) -> Call[Transaction]:
        """Begin, (ack, commit group positions,) publish every ``(topic, records)``
        batch, commit: one request (Avro unless the client speaks JSON)."""
        url = f"{self._ns_url}/transactions/publish"
        check_timeout(timeout)
        if self.media is not JSON:
            # The JSON body's checks of the producer fields: the Avro writer has none.
            admin.begin_request(None, transactional_id, epoch)
            args = (batches, timeout, transactional_id, epoch, acks, group_commits)
            raw = None
            if self.payload_frames and batches:
                raw = _transaction_body(*args, frames=True)
            content_type = payload_frames.CONTENT_TYPE
            if raw is None:
                raw, content_type = _transaction_body(*args), AVRO_EXT.value
            assert raw is not None  # Avro carries every record
            request = Request("POST", url, raw, content_type, self.timeout, idempotent=False)
            # Refused before anything began: the same transaction again, in Avro.
            return Call(
                request,
                _begun,
                fallback=self._unless_refused(
                    content_type, lambda: self.publish_transaction(*args)
                ),
            )
        body = admin.begin_request(check_timeout(timeout), transactional_id, epoch)
        body["topics"] = [_json_batch(topic, records) for topic, records in batches]
        if acks:
            body["acks"] = queue_bodies.transaction_acks_json(acks)
        if group_commits:
            body["groupCommits"] = admin.transaction_group_commits_json(group_commits)
        return self._json_call("POST", url, _begun, body, idempotent=False)

    def begin(
        self,
        timeout: float | None,
        transactional_id: str | None,
        epoch: int | None,
        begin_id: str | None = None,
    ) -> Call[Transaction]:
        """A begin under ``begin_id`` (a fresh random one if None): the server answers
        the same transaction to the same id while it is open, so the request is safe
        to send again when its answer was lost."""
        if begin_id is None:
            begin_id = secrets.token_hex(16)
        body = admin.begin_request(check_timeout(timeout), transactional_id, epoch, begin_id)
        return self._json_call("POST", self._tx_url, _begun, body, idempotent=True)

    def commit(
        self,
        write_pointer: int,
        changes: Iterable[bytes],
        transactional_id: str | None,
        epoch: int | None,
    ) -> Call[None]:
        wp = _write_pointer_arg(write_pointer, "write_pointer")
        body = admin.commit_request(changes, transactional_id, epoch)
        return self._json_call("POST", f"{self._tx_url}/{wp}/commit", _done, body)

    def abort(
        self, write_pointer: int, transactional_id: str | None, epoch: int | None
    ) -> Call[TransactionEnd]:
        wp = _write_pointer_arg(write_pointer, "write_pointer")
        body = admin.abort_request(transactional_id, epoch)
        return self._json_call("POST", f"{self._tx_url}/{wp}/abort", _aborted, body)

    def invalidate(self, write_pointer: int) -> Call[TransactionEnd]:
        wp = _write_pointer_arg(write_pointer, "write_pointer")
        return self._json_call("POST", f"{self._tx_url}/{wp}/invalidate", _invalidated)

    def cluster(self) -> Call[dict[str, Any]]:
        return self._json_call("GET", f"{self.url}/v1/cluster", _cluster, idempotent=True)

    def transactions(self) -> Call[TransactionState]:
        return self._json_call("GET", self._tx_url, _state, idempotent=True)

    def register_producer(self, transactional_id: str) -> Call[ProducerInfo]:
        return self._json_call(
            "POST",
            f"{self._tx_url}/producers",
            _producer,
            admin.producer_request(transactional_id),
        )

    def prune(self, below: int | None, ids: Iterable[int] | None) -> Call[list[int]]:
        if below is not None:
            _write_pointer_arg(below, "below", low=0)
        if ids is not None:
            ids = [_write_pointer_arg(wp, "ids") for wp in ids]
        body = admin.prune_request(below, ids)
        return self._json_call("POST", f"{self._tx_url}/prune", _pruned, body)

    # --- consumer groups ---

    def _group_url(self, topic: str, group: str, suffix: str = "") -> str:
        return self._topic_url(topic, f"/groups/{check_name(group, 'group')}{suffix}")

    def topic_end(self, topic: str) -> Call[TopicEnd]:
        """Where a topic ends: newest message and last stable position."""
        return self._json_call("GET", self._topic_url(topic, "/end"), _end, idempotent=True)

    def group_join(
        self,
        topic: str,
        group: str,
        member_id: str | None,
        session_timeout_ms: int,
        partitions: int | None,
        start: str,
    ) -> Call[GroupAssignment]:
        body = admin.join_request(member_id, session_timeout_ms, partitions, start)
        url = self._group_url(topic, group, "/join")
        return self._json_call("POST", url, _assignment, body, idempotent=member_id is not None)

    def group_heartbeat(self, topic: str, group: str, member_id: str) -> Call[GroupAssignment]:
        body = admin.member_request(member_id)
        url = self._group_url(topic, group, "/heartbeat")
        return self._json_call("POST", url, _assignment, body, idempotent=True)

    def group_leave(self, topic: str, group: str, member_id: str) -> Call[None]:
        body = admin.member_request(member_id)
        return self._json_call("POST", self._group_url(topic, group, "/leave"), _done, body)

    def group_poll(
        self,
        topic: str,
        group: str,
        member_id: str,
        limit: int,
        wait: float | None,
        max_bytes: int | None = None,
    ) -> Call[GroupPage]:
        """A member's poll: its messages, answered in the client's medium."""
        media = self.media
        waiting = _wait_ms(wait)
        url = self._group_url(topic, group, "/poll") + _wait_and_bytes(waiting, max_bytes)
        timeout = None if self.timeout is None else self.timeout + waiting / 1000
        body = dumps_request(admin.member_request(member_id, limit))
        # The columnar medium first, as for a poll (and the client's own medium, which
        # a server that does not know it answers in).
        accept = media.value if media is JSON else f"{COLUMNS.value}, {media.value}"
        request = Request("POST", url, body, JSON.value, timeout, accept=accept)
        # Not resent: the server moved the member's cursors when it answered.
        return Call(request, lambda response: _group_page(response, media))

    def group_commit(
        self,
        topic: str,
        group: str,
        member_id: str,
        positions: Mapping[int, MessageId],
        write_pointer: int | None,
        generation: int | None = None,
        generations: Mapping[int, int] | None = None,
    ) -> Call[list[bytes]]:
        body = admin.group_commit_request(
            member_id, positions, write_pointer, generation, generations
        )
        url = self._group_url(topic, group, "/commit")
        return self._json_call("POST", url, _changes, body)

    def group_rollback(
        self, topic: str, group: str, write_pointer: int | None, member_id: str | None = None
    ) -> Call[None]:
        body: dict[str, Any] = {}
        if write_pointer is not None:
            body["transactionWritePointer"] = int(write_pointer)
        if member_id is not None:
            body["memberId"] = member_id
        url = self._group_url(topic, group, "/rollback")
        return self._json_call("POST", url, _done, body, idempotent=True)

    def group_describe(self, topic: str, group: str) -> Call[GroupInfo]:
        url = self._group_url(topic, group)
        return self._json_call("GET", url, _group, idempotent=True)

    def group_list(self, topic: str) -> Call[list[str]]:
        url = self._topic_url(topic, "/groups")
        return self._json_call("GET", url, _topic_names, idempotent=True)

    def group_reset(self, topic: str, group: str, to: str | MessageId | int) -> Call[None]:
        body = admin.reset_request(to)
        return self._json_call("POST", self._group_url(topic, group, "/reset"), _done, body)

    def group_delete(self, topic: str, group: str) -> Call[None]:
        return self._json_call("DELETE", self._group_url(topic, group), _done)

    # --- queues ---

    def _queue_url(self, topic: str, queue: str, suffix: str = "") -> str:
        return self._topic_url(topic, f"/queues/{check_name(queue, 'queue')}{suffix}")

    def queue_pop(
        self,
        topic: str,
        queue: str,
        consumer: str,
        max_messages: int,
        wait: float | None,
        ack_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        dead_letter_topic: str | None = None,
        start: str | None = None,
        ack_ids: Sequence[MessageId] = (),
        max_bytes: int | None = None,
    ) -> Call[list[Message]]:
        """Lease messages of a queue, answered in the client's medium, after acking
        ``ack_ids`` (this consumer's) in the same request."""
        media = self.media
        waiting = _wait_ms(wait)
        url = self._queue_url(topic, queue, "/pop") + _wait_and_bytes(waiting, max_bytes)
        timeout = None if self.timeout is None else self.timeout + waiting / 1000
        body = queue_bodies.pop_request(
            consumer,
            max_messages,
            ack_timeout_ms,
            max_deliveries,
            dead_letter_topic,
            start,
            ack_ids,
        )
        request = Request("POST", url, dumps_request(body), JSON.value, timeout, accept=media.value)
        # Not resent after a lost answer: the server leased what it answered. A 503
        # leased nothing that stays leased (docs/client.md, "Queues"), so it goes
        # again, acks and all: the server pops only once the acks are durable, and
        # answers acks it applied already as done.
        retry_on = (ServiceUnavailable,)
        return Call(request, lambda response: _popped(response, media), retry_on=retry_on)

    def queue_ack(
        self,
        topic: str,
        queue: str,
        consumer: str,
        ids: Sequence[MessageId],
        write_pointer: int | None = None,
    ) -> Call[None]:
        body = queue_bodies.ack_request(consumer, ids, write_pointer)
        url = self._queue_url(topic, queue, "/ack")
        # Safe to resend: an ack the server applied already is answered as done.
        return self._json_call("POST", url, _done, body, idempotent=True)

    def queue_nack(
        self, topic: str, queue: str, consumer: str, ids: Sequence[MessageId]
    ) -> Call[list[MessageId]]:
        """Give messages back; answers those the consumer no longer held (skipped)."""
        body = queue_bodies.ack_request(consumer, ids)
        return self._json_call("POST", self._queue_url(topic, queue, "/nack"), _nacked, body)

    def queue_extend(
        self,
        topic: str,
        queue: str,
        consumer: str,
        ids: Sequence[MessageId],
        ack_timeout_ms: int | None = None,
    ) -> Call[list[MessageId]]:
        """Lease messages again from now; answers those the consumer no longer held."""
        body = queue_bodies.extend_request(consumer, ids, ack_timeout_ms)
        url = self._queue_url(topic, queue, "/extend")
        # Safe to resend: a second extend moves the deadline as the first did.
        return self._json_call("POST", url, _nacked, body, idempotent=True)

    def queue_rollback(
        self, topic: str, queue: str, write_pointer: int, keep_leases: bool = False
    ) -> Call[int]:
        body = queue_bodies.rollback_request(write_pointer, keep_leases)
        url = self._queue_url(topic, queue, "/rollback")
        return self._json_call("POST", url, _returned, body, idempotent=True)

    def queue_release(self, topic: str, queue: str, consumer: str) -> Call[int]:
        body = queue_bodies.consumer_request(consumer)
        url = self._queue_url(topic, queue, "/release")
        return self._json_call("POST", url, _released, body, idempotent=True)

    def queue_describe(self, topic: str, queue: str) -> Call[QueueStats]:
        return self._json_call("GET", self._queue_url(topic, queue), _queue, idempotent=True)

    def queue_list(self, topic: str) -> Call[list[str]]:
        url = self._topic_url(topic, "/queues")
        return self._json_call("GET", url, _topic_names, idempotent=True)

    def queue_list_all(self) -> Call[list[tuple[str, str]]]:
        return self._json_call("GET", f"{self._ns_url}/queues", _queue_names, idempotent=True)

    def queue_purge(self, topic: str, queue: str) -> Call[int]:
        return self._json_call("POST", self._queue_url(topic, queue, "/purge"), _purged)

    def queue_delete(self, topic: str, queue: str) -> Call[None]:
        return self._json_call("DELETE", self._queue_url(topic, queue), _done)

"""The write side: encode a batch, then assign its keys inside the store's write.

Encoding (:func:`encode_batch`) is pure and runs on the caller's thread, before the
write is queued, so the store's single writer does as little as possible per message:
build keys, hand them to ``put_many``, store the topic's new last position. Key
assignment happens in that same write function, after reading the topic's last
position in the same transaction, so keys become visible in the order they are assigned
(invariant 1 of docs/design.md).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from operator import itemgetter

from tidings.clock import Clock
from tidings.codec import keys, values
from tidings.codec.payload_frames import POSITIONS_AT, PayloadFrames
from tidings.codec.stored_publish import StoredBatch
from tidings.codec.values import TopicState
from tidings.errors import BadRequest, OutOfOrderSequence, PayloadsAlreadyPublished
from tidings.messaging import accounting
from tidings.messaging.sequencing import assign
from tidings.messaging.topics import Topics
from tidings.names import INT64_MAX
from tidings.store.backend import WriteView
from tidings.structs import PayloadRange, Record, RollbackInfo

__all__ = [
    "MAX_PAYLOAD_RANGES",
    "EncodedBatch",
    "Messages",
    "check_payload_ranges",
    "check_rollback_info",
    "check_write_pointer",
    "encode_batch",
    "publish_fn",
    "rollback_fn",
    "store_fn",
]

#: What a publish or a store takes: messages, or a body read straight into stored
#: values or into payload positions.
Messages = Sequence[Record | bytes] | StoredBatch | PayloadFrames

_META = "metadata"
_MESSAGES = "messages"
_PAYLOADS = "payloads"
#: Most ranges one pointer publish may name: each becomes a Message Table entry written
#: in the store's single write transaction, so this bounds that transaction's size.
MAX_PAYLOAD_RANGES = 10_000


class EncodedBatch:
    """A batch's stored values (in order), which of them expire early, and its size.

    A batch of plain payloads without a write pointer keeps the payloads themselves
    (``plain``: a list of them, or a payloads body, whose messages may also all have a
    key): a batch entry stores them as they are, and their stored values are made only
    if something asks for them (a publish that stays rows of its own). A payloads body
    published in a transaction is kept so too, with its ``write_pointer``.
    """

    __slots__ = ("_values", "expiries", "plain", "size", "write_pointer")

    def __init__(
        self,
        values: list[bytes] | None,
        expiries: list[tuple[int, int]],
        size: int,
        plain: list[bytes] | PayloadFrames | None = None,
        write_pointer: int | None = None,
    ) -> None:
        if values is None and plain is None:
            raise ValueError("an encoded batch needs its values or its plain payloads")
        self._values = values
        self.expiries = expiries  # (index in values, expires_at ms)
        self.size = size
        self.plain = plain
        self.write_pointer = write_pointer  # of a kept payloads body's stored values

    @property
    def values(self) -> list[bytes]:
        """Every message's stored value, in order."""
        if self._values is None:
            plain = self.plain
            if isinstance(plain, PayloadFrames) and plain.key_positions is not None:
                self._values = encode_batch(plain.records(), self.write_pointer, 0).values
                return self._values
            payloads = plain.payloads() if isinstance(plain, PayloadFrames) else plain
            assert payloads is not None
            header = values.payload_header(self.write_pointer)
            self._values = [header + p for p in payloads]
        return self._values

    def __len__(self) -> int:
        return len(self.plain) if self.plain is not None else len(self.values)


def check_write_pointer(write_pointer: object) -> int:
    """A write pointer must be a positive int64: negative ones mean "rolled back"."""
    if (
        isinstance(write_pointer, bool)
        or not isinstance(write_pointer, int)
        or not 0 < write_pointer <= INT64_MAX
    ):
        raise BadRequest(f"a write pointer is a positive 64-bit integer, got {write_pointer!r}")
    return write_pointer


def check_payload_ranges(ranges: object) -> list[PayloadRange]:
    """The ranges of a pointer publish in ascending order; BadRequest unless each is
    well-formed with first <= last, they do not overlap, and there are 1 to
    :data:`MAX_PAYLOAD_RANGES` of them."""
    if isinstance(ranges, str | bytes) or not isinstance(ranges, Sequence):
        raise BadRequest(f"payload ranges must be a list, got {type(ranges).__name__}")
    if not ranges:
        # An empty list would otherwise publish nothing yet seal the pointer; a caller
        # meaning "every row" omits the ranges instead.
        raise BadRequest("payload ranges, if given, must name at least one range")
    if len(ranges) > MAX_PAYLOAD_RANGES:
        raise BadRequest(
            f"at most {MAX_PAYLOAD_RANGES} payload ranges per publish, got {len(ranges)}"
        )
    checked: list[PayloadRange] = []
    for i, item in enumerate(ranges):
        if not isinstance(item, tuple) or len(item) != 4:
            raise BadRequest(f"payload range {i} must be a PayloadRange, got {item!r:.80}")
        for name, value, hi in zip(
            PayloadRange._fields, item, (INT64_MAX, keys.MAX_SEQ) * 2, strict=True
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
                raise BadRequest(f"payload range {i}: {name} must be 0-{hi}, got {value!r:.40}")
        rng = PayloadRange._make(item)
        if rng.first > rng.last:
            raise BadRequest(f"payload range {i} starts after it ends: {tuple(rng)}")
        checked.append(rng)
    checked.sort()
    for before, after in pairwise(checked):
        if after.first <= before.last:
            raise BadRequest(f"payload ranges overlap: {tuple(before)} and {tuple(after)}")
    return checked


#: The one-byte varint of each key length below 128.
_KEY_LENGTHS = [bytes([n]) for n in range(0x80)]


def encode_batch(messages: Messages, write_pointer: int | None, now: int) -> EncodedBatch:
    """Encode every message's stored value; BadRequest for anything malformed.

    ``now`` (ms) anchors per-message TTLs: an expiry is absolute, measured on the wall
    clock from when the message was accepted. A :class:`StoredBatch` (a body read
    straight into stored values) is taken as it is, and so is a payloads body without
    a write pointer (its batch entry copies the body's payloads as one block).
    """
    if isinstance(messages, PayloadFrames):
        if messages.key_positions is None or messages.all_keyed:
            return EncodedBatch(None, [], messages.size, messages, write_pointer)
        messages = messages.records()
    if isinstance(messages, StoredBatch):
        if messages.stored_pointer != write_pointer:
            raise ValueError(
                f"values stored under {messages.stored_pointer}, written under {write_pointer}"
            )
        return EncodedBatch(messages.values, [], messages.size)
    header = values.payload_header(write_pointer)
    if _BYTES_ONLY.issuperset(map(type, messages)):
        # The common case, plain payloads: kept as they are without a write pointer
        # (a batch entry stores them so), else one concatenation per message.
        size = sum(map(len, messages))
        if write_pointer is None:
            return EncodedBatch(None, [], size, list(messages))  # type: ignore[arg-type]
        return EncodedBatch([header + m for m in messages], [], size)  # type: ignore[operator]
    encoded = []
    expiries: list[tuple[int, int]] = []
    size = 0
    encode = values.encode_value
    keyed, lengths = values.keyed_header(write_pointer), _KEY_LENGTHS
    for i, message in enumerate(messages):
        if isinstance(message, bytes | bytearray | memoryview):
            payload = bytes(message)
            encoded.append(header + payload)
        elif isinstance(message, Record):
            payload, key, headers, ttl = message
            if (
                ttl is None
                and not headers
                and type(key) is bytes
                and len(key) < 0x80
                and type(payload) is bytes
            ):
                # A key alone (the common keyed shape): one concatenation.
                encoded.append(keyed + lengths[len(key)] + key + payload)
                size += len(payload)
                continue
            payload = _bytes(payload, "payload")
            expires_at = None
            if ttl is not None:
                if isinstance(ttl, bool) or not isinstance(ttl, int):
                    raise BadRequest(f"message ttl must be an integer, got {ttl!r}")
                if ttl <= 0:
                    raise BadRequest(f"message ttl must be positive, got {ttl}")
                expires_at = min(now + ttl * 1000, INT64_MAX)
                expiries.append((i, expires_at))
            encoded.append(
                encode(
                    payload,
                    write_pointer,
                    None if key is None else _bytes(key, "key"),
                    _headers(headers),
                    expires_at,
                )
            )
        else:
            raise BadRequest(f"a message is bytes or a Record, got {type(message).__name__}")
        size += len(payload)
    return EncodedBatch(encoded, expiries, size)


def _bytes(value: object, what: str) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise BadRequest(f"message {what} must be bytes, got {type(value).__name__}")


def _headers(headers: object) -> Mapping[str, bytes]:
    # The common case, decoded from a body: a dict of str to bytes, used as it is.
    if type(headers) is dict and all(
        type(k) is str and type(v) is bytes for k, v in headers.items()
    ):
        return headers
    if not isinstance(headers, Mapping):
        raise BadRequest(f"message headers must be a mapping, got {type(headers).__name__}")
    out: dict[str, bytes] = {}
    for name, value in headers.items():
        if not isinstance(name, str):
            raise BadRequest(f"header names must be strings, got {name!r}")
        out[name] = _bytes(value, f"header {name!r}")
    return out


def publish_fn(
    topics: Topics,
    clock: Clock,
    namespace: str,
    topic: str,
    batch: EncodedBatch,
    write_pointer: int | None,
    payload_ranges: Sequence[PayloadRange] | None = None,
    guard: Callable[[int], None] | None = None,
    producer: tuple[bytes, int] | None = None,
    retried: Callable[[], None] | None = None,
) -> Callable[[WriteView], RollbackInfo | None]:
    """The write function of a publish: direct messages, or (no messages and a write
    pointer) one pointer entry standing for the Payload Table rows of that pointer --
    or, with ``payload_ranges`` (checked and sorted by :func:`check_payload_ranges`),
    one pointer entry per range, in ascending order, each standing for only its rows.
    ``guard(write_pointer)`` runs inside the write transaction, before the entries are
    written; if it raises, the write function fails and nothing of it is kept.
    ``retried()`` is called when ``producer`` (an idempotent publish) names a batch
    written already, so that nothing is written."""
    direct = len(batch)  # messages written here (none: a pointer publish)
    rows: list[bytes] | None = None  # the entries of a publish that is not batch entries
    if not direct:
        assert write_pointer is not None
        if payload_ranges is None:
            rows = [values.encode_value(None, write_pointer)]
        else:
            # Ascending ranges under ascending keys: ids stay in the order read.
            rows = [values.encode_pointer(write_pointer, r) for r in payload_ranges]
    else:
        assert payload_ranges is None
    # The batch entries' values do not depend on the positions the write assigns: made
    # here, on the caller's thread, so the store's writer only keys them.
    entries = _batch_entries(batch, write_pointer) if direct else None
    if entries is None and direct:
        batch.values  # noqa: B018 - the stored values made here too, not in the write

    def publish(view: WriteView) -> RollbackInfo | None:
        ref = topics.resolve(view, namespace, topic)
        state = ref.state
        if producer is not None and not _next_in_sequence(
            view, ref.topic_id, state.generation, producer, clock.now_ms()
        ):
            if retried is not None:
                retried()
            return None  # a retry of a batch already written: its outcome, not a copy
        if not direct:
            _check_unsealed(view, ref.topic_id, state.generation, write_pointer, topic)
        if guard is not None and write_pointer is not None:
            # After the seal check: a second publish of stored payloads says so (409).
            guard(write_pointer)
        n = direct or len(rows or ())
        start_ts, start_seq, end_ts, end_seq = assign(
            state.last_ts, state.last_seq, clock.now_ms(), n
        )
        if entries is not None and start_ts == end_ts:
            # One row per batch entry (docs/design.md, "Batch entries"): the messages
            # keep the ids they would have had as rows of their own.
            prefix = (ref.topic_id, state.generation, start_ts)
            keyed = [(keys.message_key(*prefix, start_seq + at), value) for at, value in entries]
            view.put_many(_MESSAGES, keyed, append=True)
        else:
            row_keys = keys.message_keys(ref.topic_id, state.generation, start_ts, start_seq, n)
            view.put_many(_MESSAGES, zip(row_keys, rows or batch.values, strict=True), append=True)
            for index, expires_at in batch.expiries:
                view.put(_META, keys.expiry_key(expires_at, _MESSAGES, row_keys[index]), b"")
        added, size = n, batch.size
        if not direct:
            assert write_pointer is not None
            added, size = _seal(
                view, ref.topic_id, state.generation, write_pointer, payload_ranges, end_ts
            )
        count, total = state.message_count, state.payload_bytes
        if count >= 0:  # UNKNOWN stays so until stats() counts the topic once
            count, total = count + added, total + size
        # Built field by field: half the cost of _replace(), once per publish.
        new_state = TopicState(
            state.generation,
            state.ttl,
            end_ts,
            end_seq,
            state.last_write_ts,
            state.last_p_seq,
            count,
            total,
        )
        view.put(_META, keys.state_key(ref.topic_id), values.encode_state(new_state))
        if write_pointer is None:
            return None
        # The transaction's first entry here, for the last stable position (one point
        # read; the marker goes once the transaction has ended, see MessagingService.end).
        marker = keys.open_key(ref.topic_id, state.generation, write_pointer)
        if view.get(_META, marker) is None:
            view.put(_META, marker, keys.ts_seq(start_ts, start_seq))
        return RollbackInfo(write_pointer, start_ts, start_seq, end_ts, end_seq)

    return publish


#: Most payload bytes in one batch entry: a publish larger than this becomes several
#: entries, so that no row is much larger than a page of a consumer's poll.
BATCH_ENTRY_BYTES = 1 << 20
_first_byte = itemgetter(0)


def _batchable(batch: EncodedBatch) -> bool | None:
    """Whether the batch's messages can share batch entries, and how: False for plain
    messages, True for messages that each have a short key and nothing else, None if
    they cannot (fewer than two, or another shape among them)."""
    if len(batch) < 2 or batch.expiries:
        return None
    plain = batch.plain
    if plain is not None:  # kept as they are: no stored value to look at
        # Keyed ones all have a key; one too long for an entry shows when it is made.
        return isinstance(plain, PayloadFrames) and plain.key_positions is not None
    rows = batch.values
    shapes = set(map(_first_byte, rows))
    if shapes in (_PLAIN_ONLY, _TX_PLAIN_ONLY):
        return False
    if shapes == _KEYED_ONLY and max(map(_second_byte, rows)) < 0x80:
        return True
    if shapes == _TX_KEYED_ONLY and max(map(_tx_key_length, rows)) < 0x80:
        return True
    return None


def _batch_entries(
    batch: EncodedBatch, write_pointer: int | None = None
) -> list[tuple[int, bytes]] | None:
    """The batch entries of ``batch``, each as the index of its first message and its
    value, at most :data:`BATCH_ENTRY_BYTES` of stored values each (a single message
    left over is a row of its own); None if the batch is not :func:`_batchable`. With
    ``write_pointer``, a transaction's entries, whose values carry it."""
    keyed = _batchable(batch)
    if keyed is None:
        return None
    plain = batch.plain
    if write_pointer is not None:
        # Stored values of a transaction's messages add ten bytes each at most.
        if (
            isinstance(plain, PayloadFrames)
            and len(plain.body) + 11 * len(plain) <= BATCH_ENTRY_BYTES
        ):
            made = values.encode_batch_in(
                plain.body, plain.positions, plain.key_positions, write_pointer
            )
            return None if made is None else [(0, made)]  # None: a long key
        return _chunked(batch.values, keyed, write_pointer)
    if isinstance(plain, PayloadFrames) and len(plain.body) + 2 * len(plain) <= BATCH_ENTRY_BYTES:
        # The body bounds its stored values: keyed ones add two bytes each.
        if not keyed:
            return [(0, values.encode_plain_batch_in(plain.body, POSITIONS_AT, len(plain)))]
        assert plain.key_positions is not None
        made = values.encode_batch_in(plain.body, plain.positions, plain.key_positions, None)
        return None if made is None else [(0, made)]  # None: a long key, rows of their own
    if isinstance(plain, list) and batch.size + len(plain) <= BATCH_ENTRY_BYTES:
        return [(0, values.encode_plain_batch(plain))]
    return _chunked(batch.values, keyed, None)


def _chunked(rows: list[bytes], keyed: bool, write_pointer: int | None) -> list[tuple[int, bytes]]:
    """Stored values ``rows`` as batch entries of at most :data:`BATCH_ENTRY_BYTES`."""
    if sum(map(len, rows)) <= BATCH_ENTRY_BYTES:
        return [(0, values.encode_batch(rows, keyed, write_pointer))]
    out: list[tuple[int, bytes]] = []
    start, size = 0, 0
    for i, row in enumerate(rows):
        if size and size + len(row) > BATCH_ENTRY_BYTES:
            out.append((start, _entry(rows[start:i], keyed, write_pointer)))
            start, size = i, 0
        size += len(row)
    out.append((start, _entry(rows[start:], keyed, write_pointer)))
    return out


def _entry(rows: list[bytes], keyed: bool, write_pointer: int | None) -> bytes:
    return values.encode_batch(rows, keyed, write_pointer) if len(rows) > 1 else rows[0]


_PLAIN_ONLY = {values.PLAIN}
_BYTES_ONLY = frozenset((bytes,))
_KEYED_ONLY = {values.KEYED}
_TX_PLAIN_ONLY = {values.TX_PLAIN}
_TX_KEYED_ONLY = {values.TX_KEYED}
_tx_key_length = itemgetter(9)  # a TX_KEYED value's key length byte, after ``t``
_second_byte = itemgetter(1)
_PRODUCER_STATE = struct.Struct(">qq")  # last sequence, last publish (ms)


def _next_in_sequence(
    view: WriteView, topic_id: int, generation: int, producer: tuple[bytes, int], now: int
) -> bool:
    """Check an idempotent publish's sequence number against the producer's last one on
    the topic, and record it: True to write the batch, False for a batch written
    already (a retry), :class:`OutOfOrderSequence` for a gap. A producer the topic has
    no record of (new, or expired) may start anywhere."""
    producer_id, sequence = producer
    key = keys.producer_key(topic_id, generation, producer_id)
    raw = view.get(_META, key)
    if raw is not None:
        last, _ = _PRODUCER_STATE.unpack(raw)
        if sequence <= last:
            return False
        if sequence > last + 1:
            raise OutOfOrderSequence(
                f"producer {producer_id.hex()} sent sequence {sequence} to this topic: "
                f"the last one written was {last}"
            )
    view.put(_META, key, _PRODUCER_STATE.pack(sequence, now))
    return True


def publish_all_fn(
    fns: Sequence[Callable[[WriteView], RollbackInfo | None]],
) -> Callable[[WriteView], list[RollbackInfo | None]]:
    """One write function for several publishes (``publish_fn``'s), run in order in the
    same write transaction: all of them take effect, or none (if one raises)."""

    def publish_all(view: WriteView) -> list[RollbackInfo | None]:
        return [fn(view) for fn in fns]

    return publish_all


def store_fn(
    topics: Topics,
    clock: Clock,
    namespace: str,
    topic: str,
    batch: EncodedBatch,
    write_pointer: int,
    guard: Callable[[int], None] | None = None,
) -> Callable[[WriteView], PayloadRange]:
    """The write function of a store: Payload Table rows under ``write_pointer``, their
    ``(write_ts, p_seq)`` assigned by the same monotonic rule as publish keys. Returns
    the positions assigned: one contiguous range holding exactly this store's rows.
    ``guard`` is the publishes' (:meth:`MessagingService.guard_publishes`)."""
    batch.values  # noqa: B018 - made here, on the caller's thread, not in the write

    def store(view: WriteView) -> PayloadRange:
        ref = topics.resolve(view, namespace, topic)
        state = ref.state
        if view.get(_META, keys.sealed_key(ref.topic_id, state.generation, write_pointer)):
            raise _already_published(write_pointer, topic)
        if guard is not None:
            # Rows stored under an ended transaction could never be published (the
            # pointer publish is refused), so they would only take room until expiry.
            guard(write_pointer)
        count = len(batch)
        start_ts, start_seq, end_ts, end_seq = assign(
            state.last_write_ts, state.last_p_seq, clock.now_ms(), count
        )
        row_keys = keys.payload_keys(
            ref.topic_id, state.generation, write_pointer, start_ts, start_seq, count
        )
        view.put_many(_PAYLOADS, zip(row_keys, batch.values, strict=True), append=True)
        for index, expires_at in batch.expiries:
            view.put(_META, keys.expiry_key(expires_at, _PAYLOADS, row_keys[index]), b"")
        new_state = state._replace(last_write_ts=end_ts, last_p_seq=end_seq)
        view.put(_META, keys.state_key(ref.topic_id), values.encode_state(new_state))
        positions = PayloadRange(start_ts, start_seq, end_ts, end_seq)
        # Not counted yet (nothing is visible): the pointer publish adds the tallies.
        accounting.record_store(
            view, ref.topic_id, state.generation, write_pointer, positions, (count, batch.size)
        )
        return positions

    return store


def _already_published(write_pointer: int, topic: str) -> PayloadsAlreadyPublished:
    return PayloadsAlreadyPublished(
        f"the payloads of write pointer {write_pointer} were already published on topic "
        f"{topic}; storing or publishing them again would change what consumers read"
    )


def _check_unsealed(
    view: WriteView,
    topic_id: int,
    generation: int,
    write_pointer: int | None,
    topic: str,
) -> None:
    # A pointer entry exposes every Payload Table row under its write pointer, in place.
    # Rows stored after that (a zombie executor) or a second pointer entry would insert
    # messages behind ones consumers already read: refuse both (invariant 1). Ranged
    # entries are sealed the same way: late rows would fall outside their ranges, but a
    # second publish could name the same rows again (duplicates), and one rule for both
    # kinds keeps the guarantee simple. The publish then writes the marker (its seal()),
    # holding the entries' time so the cleaner can drop it with the topic's TTL.
    assert write_pointer is not None
    if view.get(_META, keys.sealed_key(topic_id, generation, write_pointer)) is not None:
        raise _already_published(write_pointer, topic)


def _seal(
    view: WriteView,
    topic_id: int,
    generation: int,
    write_pointer: int,
    payload_ranges: Sequence[PayloadRange] | None,
    published: int,
) -> accounting.Counts:
    """Write the seal marker of a pointer publish whose last entry has time
    ``published``; returns what its entries add to the topic's counts. The marker
    records that too (and the ranges), so the cleaner can take it off again."""
    counts = accounting.take_tallies(view, topic_id, generation, write_pointer, payload_ranges)
    ranges = None if payload_ranges is None else tuple(payload_ranges)
    marker = values.encode_seal(values.Seal(published, *counts, ranges))
    view.put(_META, keys.sealed_key(topic_id, generation, write_pointer), marker)
    return counts


def check_rollback_info(info: RollbackInfo) -> None:
    """BadRequest unless ``info`` could have come from a transactional publish."""
    check_write_pointer(info.write_pointer)
    for name in ("start_ts", "end_ts"):
        ts = getattr(info, name)
        if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= INT64_MAX:
            raise BadRequest(f"rollback {name} must be a non-negative int64, got {ts!r}")
    for name in ("start_seq", "end_seq"):
        seq = getattr(info, name)
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= keys.MAX_SEQ:
            raise BadRequest(f"rollback {name} must be 0-{keys.MAX_SEQ}, got {seq!r}")
    if (info.start_ts, info.start_seq) > (info.end_ts, info.end_seq):
        raise BadRequest("rollback start is after its end")


def rollback_fn(
    topics: Topics,
    namespace: str,
    topic: str,
    info: RollbackInfo,
    committed: Callable[[int], bool] | None = None,
) -> Callable[[WriteView], int]:
    """The write function of a rollback: ``t -> -t`` on exactly the entries in the range
    whose ``t`` is the write pointer (the Payload Table is left alone); nothing (0) if
    ``committed(write_pointer)`` says its transaction committed."""
    write_pointer = info.write_pointer
    flipped = -write_pointer

    def rollback(view: WriteView) -> int:
        ref = topics.resolve(view, namespace, topic)
        if committed is not None and committed(write_pointer):
            return 0
        generation = ref.state.generation
        start = keys.message_key(ref.topic_id, generation, info.start_ts, info.start_seq)
        # Keys are fixed-width, so key + b"\0" is the first possible key after it.
        stop = keys.message_key(ref.topic_id, generation, info.end_ts, info.end_seq) + b"\0"
        changed = [
            (key, values.with_write_pointer(value, flipped))
            for key, value in view.scan(_MESSAGES, start, stop)
            if values.read_write_pointer(value) == write_pointer
        ]
        if changed:
            view.put_many(_MESSAGES, changed)
        # Entries, a batch entry counting its messages: as many as rows of their own.
        return sum(values.batch_count(v) if v[0] in values.BATCH_FLAGS else 1 for _, v in changed)

    return rollback

"""A topic's message count and payload bytes, kept in the store instead of counted.

``stats`` reports how many messages, and payload bytes, a non-transactional reader of a
topic's live generation would get. Counting that by reading the topic costs time in
proportion to its size, so the numbers are kept in the topic's state record
(:class:`~tidings.codec.values.TopicState`) and changed by the writes that change what
is there, in the same write transaction (docs/design.md, "Topic statistics without a
scan"):

* a direct publish adds its messages (in :func:`tidings.messaging.publishing.publish_fn`,
  with the state write it does anyway);
* a ``store`` leaves a *tally* (count and bytes of its rows) under its write pointer;
  the pointer publish adds the tallies of the rows it exposes (all, or those inside its
  ranges), deletes them, and records what it added in the seal marker;
* the cleaner subtracts what it deletes: direct entries, Payload Table rows a seal
  marker counts (from the marker too), rows of unpublished stores (from their tally),
  and a seal marker's remainder when the marker goes (its entries are past the TTL).

Rollback changes nothing: rolled-back entries stay visible to non-transactional readers.
A row counts until the cleaner deletes it, even once fetch hides it (past the TTL or its
own expiry): at most ``cleanup_interval`` longer. Counts never go below zero.

States written before counts were kept say :data:`~tidings.codec.values.UNKNOWN`; every
update leaves that as it is, and :func:`migrate_fn` counts such a topic once.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby

from tidings.codec import keys, values
from tidings.codec.values import BATCH_FLAGS, FLAG_P, PLAIN, TX_PLAIN, Seal, Tally
from tidings.messaging.topics import Topics
from tidings.store.backend import ReadView, WriteView
from tidings.structs import PayloadRange

__all__ = [
    "Counts",
    "direct_counts",
    "drop_seals",
    "entry_counts",
    "forget_rows",
    "migrate_fn",
    "payload_size",
    "record_store",
    "take_tallies",
]

_META = "metadata"
_MESSAGES = "messages"
_PAYLOADS = "payloads"
#: Bytes of ``topic_id | generation`` and of the Payload Table's per-pointer prefix.
_TOPIC_GEN = 8
_POINTER = 16
_POSITION = slice(16, 26)  # write_ts | p_seq in a Payload Table key

Counts = tuple[int, int]
"""``(messages, payload bytes)``."""


def payload_size(value: bytes) -> int:
    """Payload bytes of a Message Table or Payload Table value (0 for a pointer entry)."""
    flags = value[0]
    # The common shapes are header + payload: no decode.
    if flags == PLAIN:
        return len(value) - 1
    if flags == TX_PLAIN:
        return len(value) - 9
    payload = values.decode_value(value).payload
    return 0 if payload is None else len(payload)


def entry_counts(value: bytes) -> Counts:
    """The messages a Message Table entry holds itself and their payload bytes: one for
    a message, several for a batch entry, none for a pointer entry (whose messages
    count through their seal marker)."""
    if value[0] in BATCH_FLAGS:
        return values.batch_counts(value)
    if value[0] & FLAG_P:
        return 1, payload_size(value)
    return 0, 0


def direct_counts(rows: Iterable[tuple[bytes, bytes]]) -> Counts:
    """The messages the direct entries among Message Table ``rows`` hold, and their
    payload bytes (pointer entries count through their seal markers instead)."""
    messages = size = 0
    for _, value in rows:
        n, b = entry_counts(value)
        messages += n
        size += b
    return messages, size


# --- publish and store ------------------------------------------------------------


def record_store(
    view: WriteView,
    topic_id: int,
    generation: int,
    write_pointer: int,
    positions: PayloadRange,
    counts: Counts,
) -> None:
    """Leave the tally of one store: its positions and ``counts``."""
    key = keys.tally_key(topic_id, generation, write_pointer, *positions.first)
    view.put(_META, key, values.encode_tally(Tally(*positions.last, *counts)))


def take_tallies(
    view: WriteView,
    topic_id: int,
    generation: int,
    write_pointer: int,
    ranges: Sequence[PayloadRange] | None,
) -> Counts:
    """What a pointer publish exposes: the rows of ``write_pointer``'s tallies, all of
    them or (``ranges``: sorted, not overlapping) those inside the ranges. Deletes the
    tallies: from now on the seal marker stands for these rows."""
    start, stop = keys.tally_range(topic_id, generation, write_pointer)
    tallies = [(key[-10:], values.decode_tally(raw)) for key, raw in view.scan(_META, start, stop)]
    if tallies:
        view.delete_range(_META, start, stop)
    if ranges is None:
        return (
            sum(t.message_count for _, t in tallies),
            sum(t.payload_bytes for _, t in tallies),
        )
    prefix = keys.write_pointer_prefix(topic_id, generation, write_pointer)
    return _inside_ranges(view, prefix, tallies, _bounds(ranges))


def _inside_ranges(
    view: ReadView,
    prefix: bytes,
    tallies: list[tuple[bytes, Tally]],
    bounds: tuple[list[bytes], list[bytes]],
) -> Counts:
    # Both lists ascend and neither overlaps itself: one merge. A tally inside one range
    # counts whole; one a range cuts is counted row by row, over the cut part only.
    firsts, lasts = bounds
    messages = size = 0
    j = 0
    for first, tally in tallies:
        last = keys.ts_seq(tally.last_ts, tally.last_seq)
        while j < len(firsts) and lasts[j] < first:
            j += 1
        k = j
        while k < len(firsts) and firsts[k] <= last:
            if firsts[k] <= first and last <= lasts[k]:
                messages += tally.message_count
                size += tally.payload_bytes
            else:
                lo, hi = max(first, firsts[k]), min(last, lasts[k])
                rows = view.scan(_PAYLOADS, prefix + lo, prefix + hi + b"\0")
                n, s = _payload_counts(rows)
                messages += n
                size += s
            k += 1
    return messages, size


def _payload_counts(rows: Iterable[tuple[bytes, bytes]]) -> Counts:
    messages = size = 0
    for _, value in rows:
        messages += 1
        size += payload_size(value)
    return messages, size


def _bounds(ranges: Sequence[PayloadRange]) -> tuple[list[bytes], list[bytes]]:
    """Sorted, non-overlapping ranges as two lists of 10-byte positions (firsts, lasts)."""
    return (
        [keys.ts_seq(r.first_ts, r.first_seq) for r in ranges],
        [keys.ts_seq(r.last_ts, r.last_seq) for r in ranges],
    )


def _inside(bounds: tuple[list[bytes], list[bytes]], position: bytes) -> bool:
    firsts, lasts = bounds
    i = bisect_right(firsts, position) - 1
    return i >= 0 and position <= lasts[i]


# --- the cleaner ----------------------------------------------------------------------


class _Deltas:
    """What one write function takes off topics' counts, written once per topic."""

    def __init__(self) -> None:
        self._by_topic: dict[bytes, list[int]] = {}

    def add(self, topic_gen: bytes, messages: int, size: int) -> None:
        if messages or size:
            totals = self._by_topic.setdefault(topic_gen, [0, 0])
            totals[0] += messages
            totals[1] += size

    def subtract(self, view: WriteView) -> None:
        for topic_gen, (messages, size) in self._by_topic.items():
            topic_id = int.from_bytes(topic_gen[:4], "big")
            generation = int.from_bytes(topic_gen[4:8], "big")
            _subtract_from_state(view, topic_id, generation, messages, size)


def _subtract_from_state(
    view: WriteView, topic_id: int, generation: int, messages: int, size: int
) -> None:
    # Only the live generation's counts: a deleted or re-created topic's rows were
    # never in the current state (a re-created topic starts at zero).
    key = keys.state_key(topic_id)
    raw = view.get(_META, key)
    if raw is None:
        return
    state = values.decode_state(raw)
    if state.generation != generation or state.message_count < 0:
        return
    state = state._replace(
        message_count=max(0, state.message_count - messages),
        payload_bytes=max(0, state.payload_bytes - size),
    )
    view.put(_META, key, values.encode_state(state))


def forget_rows(view: WriteView, table: str, rows: Sequence[tuple[bytes, bytes]]) -> None:
    """Take rows of ``table`` ("messages" or "payloads", ascending keys, any topics) out
    of whatever counts them, before the caller deletes them in the same write:

    * a direct Message Table entry: its topic's state;
    * a Payload Table row under a sealed write pointer, if one of its entries exposed
      it: the seal marker and the topic's state;
    * a Payload Table row of a pointer not published: the tally holding it.
    """
    deltas = _Deltas()
    if table == _MESSAGES:
        for key, value in rows:
            n, size = entry_counts(value)
            if n:
                deltas.add(key[:_TOPIC_GEN], n, size)
    else:
        for prefix, group in groupby(rows, key=lambda row: row[0][:_POINTER]):
            messages, size = _forget_payload_rows(view, prefix, list(group))
            deltas.add(prefix[:_TOPIC_GEN], messages, size)
    deltas.subtract(view)


def _forget_payload_rows(view: WriteView, prefix: bytes, rows: list[tuple[bytes, bytes]]) -> Counts:
    """Rows under one write pointer: returns what to take off the topic's state."""
    marker = keys.SEALED_PREFIX + prefix
    raw = view.get(_META, marker)
    if raw is None:
        _forget_unpublished(view, prefix, rows)
        return 0, 0
    seal = values.decode_seal(raw)
    if seal.message_count < 0:
        return 0, 0  # a marker from before counts were kept: the state's are unknown too
    bounds = None if seal.ranges is None else _bounds(seal.ranges)
    exposed = [row for row in rows if bounds is None or _inside(bounds, row[0][_POSITION])]
    messages, size = _payload_counts(exposed)
    # Never more than the marker holds: what it never added it cannot take back.
    messages, size = min(messages, seal.message_count), min(size, seal.payload_bytes)
    if messages or size:
        left = seal._replace(
            message_count=seal.message_count - messages, payload_bytes=seal.payload_bytes - size
        )
        view.put(_META, marker, values.encode_seal(left))
    return messages, size


def _forget_unpublished(view: WriteView, prefix: bytes, rows: list[tuple[bytes, bytes]]) -> None:
    # A tally's key is its first row's key under the tally prefix, so the tallies that
    # can hold these rows are those keyed at or before the last of them.
    start = keys.TALLY_PREFIX + prefix
    stop = keys.TALLY_PREFIX + rows[-1][0] + b"\0"
    found = list(view.scan(_META, start, stop))
    if not found:
        return
    firsts = [key[-10:] for key, _ in found]
    tallies = [values.decode_tally(raw) for _, raw in found]
    taken = [[0, 0] for _ in found]
    for key, value in rows:
        position = key[_POSITION]
        i = bisect_right(firsts, position) - 1
        if i >= 0 and position <= keys.ts_seq(tallies[i].last_ts, tallies[i].last_seq):
            taken[i][0] += 1
            taken[i][1] += payload_size(value)
    for (key, _), tally, (messages, size) in zip(found, tallies, taken, strict=True):
        if not messages:
            continue
        if tally.message_count <= messages:
            view.delete(_META, key)  # its last row goes: nothing left to publish
        else:
            left = tally._replace(
                message_count=tally.message_count - messages,
                payload_bytes=max(0, tally.payload_bytes - size),
            )
            view.put(_META, key, values.encode_tally(left))


def drop_seals(view: WriteView, markers: Iterable[bytes]) -> None:
    """Delete seal markers (keys) whose entries are past the TTL, taking what each
    still adds off its topic's counts."""
    deltas = _Deltas()
    for marker in markers:
        raw = view.get(_META, marker)
        if raw is None:
            continue
        view.delete(_META, marker)
        seal = values.decode_seal(raw)
        if seal.message_count >= 0:
            topic_gen = marker[len(keys.SEALED_PREFIX) :][:_TOPIC_GEN]
            deltas.add(topic_gen, seal.message_count, seal.payload_bytes)
    deltas.subtract(view)


# --- counting a topic once (states from before counts were kept) ----------------------


def migrate_fn(topics: Topics, namespace: str, topic: str) -> Callable[[WriteView], None]:
    """The write function that counts a topic whose state has :data:`UNKNOWN` counts,
    once, by reading its live generation: direct entries from the Message Table; per
    sealed write pointer, the Payload Table rows its entries expose (rewriting the
    marker with them); per write pointer not published, one tally of its rows. A topic
    counted meanwhile is left alone. Holds the store's writer for as long as the read
    takes: once per topic, on data written before counts were kept."""

    def migrate(view: WriteView) -> None:
        ref = topics.resolve(view, namespace, topic)
        state = ref.state
        if state.message_count >= 0:
            return
        topic_id, generation = ref.topic_id, state.generation
        messages, size, exposed = _scan_entries(view, topic_id, generation)
        start, stop = keys.sealed_range(topic_id, generation, generation + 1)
        seals = {
            key[len(keys.SEALED_PREFIX) :]: values.seal_time(raw)
            for key, raw in view.scan(_META, start, stop)
        }
        counted, tallies = _scan_payloads(view, topic_id, generation, seals, exposed)
        for prefix, time in seals.items():
            wp = keys.parse_write_pointer_prefix(prefix)[2]
            n, s = counted.get(prefix, (0, 0))
            ranges = exposed.get(wp)
            seal = Seal(time, n, s, None if ranges is None else tuple(ranges))
            view.put(_META, keys.SEALED_PREFIX + prefix, values.encode_seal(seal))
            messages += n
            size += s
        view.delete_range(_META, *keys.tallies_range(topic_id, generation, generation + 1))
        for key, tally in tallies:
            view.put(_META, key, values.encode_tally(tally))
        state = state._replace(message_count=messages, payload_bytes=size)
        view.put(_META, keys.state_key(topic_id), values.encode_state(state))

    return migrate


def _scan_entries(
    view: ReadView, topic_id: int, generation: int
) -> tuple[int, int, dict[int, list[PayloadRange] | None]]:
    """Direct entries' count and bytes, and per write pointer of a pointer entry the
    ranges its entries name (merged; None: every row)."""
    messages = size = 0
    named: dict[int, list[PayloadRange] | None] = {}
    for _, value in view.scan(_MESSAGES, *keys.generation_range(topic_id, generation)):
        if value[0] & FLAG_P:  # a message, or a batch entry of them
            n, b = entry_counts(value)
            messages += n
            size += b
            continue
        wp = values.read_write_pointer(value)
        if wp is None:
            continue
        wp, rng = abs(wp), values.read_payload_range(value)
        if rng is None:
            named[wp] = None
        elif wp not in named:
            named[wp] = [rng]
        elif (ranges := named[wp]) is not None:
            ranges.append(rng)
    return messages, size, {wp: _merged(r) for wp, r in named.items()}


def _merged(ranges: list[PayloadRange] | None) -> list[PayloadRange] | None:
    # Entries of one publish never overlap, but a pointer published again after its
    # marker went may name rows twice: count each row once.
    if ranges is None:
        return None
    out: list[PayloadRange] = []
    for rng in sorted(ranges):
        if out and rng.first <= out[-1].last:
            if rng.last > out[-1].last:
                out[-1] = out[-1]._replace(last_ts=rng.last_ts, last_seq=rng.last_seq)
        else:
            out.append(rng)
    return out


def _scan_payloads(
    view: ReadView,
    topic_id: int,
    generation: int,
    seals: dict[bytes, int],
    exposed: dict[int, list[PayloadRange] | None],
) -> tuple[dict[bytes, Counts], list[tuple[bytes, Tally]]]:
    """Per sealed pointer (prefix), the counts of the rows its entries expose; per
    pointer not sealed, one tally of all its rows."""
    counted: dict[bytes, Counts] = {}
    tallies: list[tuple[bytes, Tally]] = []
    rows = view.scan(_PAYLOADS, *keys.generation_range(topic_id, generation))
    for prefix, group in groupby(rows, key=lambda row: row[0][:_POINTER]):
        if prefix in seals:
            wp = keys.parse_write_pointer_prefix(prefix)[2]
            if wp not in exposed:
                continue  # its entries are gone: it exposes nothing
            ranges = exposed[wp]
            bounds = None if ranges is None else _bounds(ranges)
            inside = (r for r in group if bounds is None or _inside(bounds, r[0][_POSITION]))
            counted[prefix] = _payload_counts(inside)
            continue
        first = last = b""
        messages = size = 0
        for key, value in group:
            first = first or key
            last = key
            messages += 1
            size += payload_size(value)
        last_ts, last_seq = keys.parse_ts_seq(last[_POSITION])
        tallies.append((keys.TALLY_PREFIX + first, Tally(last_ts, last_seq, messages, size)))
    return counted, tallies

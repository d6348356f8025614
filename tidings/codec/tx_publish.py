"""The one-request transaction's Avro body (``TransactionPublishRequest``, docs/api.md).

Written by hand: fastavro's generic writer took ~17 us for the envelope of a small
transaction (two topics of five messages), more than the messages' own bodies. Read by
hand where the body has no acks and no group positions (the shape of most
transactions), by fastavro otherwise and wherever the hand-written reader meets
anything it does not expect, so that fastavro names what is wrong;
``tests/test_codec_tx_publish.py`` checks both readers against fastavro's writer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from tidings.codec import admin, avro, queue_bodies
from tidings.errors import BadRequest

__all__ = ["read_transaction_publish", "write_transaction_publish"]

_DOUBLE = struct.Struct("<d")


def _bytes(value: bytes) -> bytes:
    return avro.varint(len(value)) + value


def write_transaction_publish(
    bodies: Sequence[tuple[str, bytes]],
    timeout: float | None,
    transactional_id: str | None,
    epoch: int | None,
    acks: Sequence[queue_bodies.TransactionAck] = (),
    group_commits: Sequence[admin.TransactionGroupCommit] = (),
) -> bytes:
    """The body: each ``(topic, publish body)``, then the acks and group positions."""
    parts = [
        b"\x00" if timeout is None else b"\x02" + _DOUBLE.pack(timeout),
        b"\x00" if transactional_id is None else b"\x02" + _bytes(transactional_id.encode()),
        b"\x00" if epoch is None else b"\x02" + avro.varint(epoch),
    ]
    if bodies:
        parts.append(avro.varint(len(bodies)))
        for topic, body in bodies:
            parts += (_bytes(topic.encode()), _bytes(body))
    parts.append(b"\x00")
    if acks:
        parts.append(avro.varint(len(acks)))
        for a in acks:
            parts += (
                _bytes(a.topic.encode()),
                _bytes(a.queue.encode()),
                _bytes(a.consumer.encode()),
                avro.varint(len(a.ids)),
                *(_bytes(i.to_bytes()) for i in a.ids),
                b"\x00" if a.ids else b"",
            )
    parts.append(b"\x00")
    if group_commits:
        parts.append(avro.varint(len(group_commits)))
        for c in group_commits:
            positions = sorted(c.positions.items())
            parts += (
                _bytes(c.topic.encode()),
                _bytes(c.group.encode()),
                _bytes(c.member_id.encode()),
                avro.varint(len(positions)),
                *(avro.varint(p) + _bytes(i.to_bytes()) for p, i in positions),
                b"\x00" if positions else b"",
            )
        parts.append(b"\x00")
        # Each entry's generations. Only with group commits: a body without any stays
        # as it was, which servers from before the field was added read too.
        parts.append(avro.varint(len(group_commits)))
        for c in group_commits:
            named = c.generations or {}
            each = [named.get(p) for p in sorted(c.positions)] if named else []
            parts += (
                _optional_long(c.generation),
                avro.varint(len(each)),
                *map(_optional_long, each),
                b"\x00" if each else b"",
            )
    parts.append(b"\x00")
    return b"".join(parts)


def _optional_long(value: int | None) -> bytes:
    """A ``["null", "long"]`` union."""
    return b"\x00" if value is None else b"\x02" + avro.varint(value)


def read_transaction_publish(body: bytes) -> dict[str, Any]:
    """The body's fields as fastavro reads them (``topics`` as ``{topic, body}``);
    :class:`~tidings.errors.BadRequest` if it is not one ``TransactionPublishRequest``."""
    try:
        value = _read(body)
    except (IndexError, ValueError, UnicodeDecodeError, struct.error):
        value = None
    if value is None:
        try:
            value = avro.read(body, avro.TRANSACTION_PUBLISH_REQUEST, "transactional publish")
        except BadRequest as exc:
            # Written before groupCommitGenerations was added: the body ends where that
            # field would begin (so it cannot read as this schema's, nor one of this
            # schema as that one's: it would leave bytes over).
            try:
                value = avro.read(body, avro.TRANSACTION_PUBLISH_REQUEST_V1, "")
            except BadRequest:
                raise exc from None
            value["groupCommitGenerations"] = []
    return value


def _string(body: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = avro.read_long(body, pos)
    stop = pos + size
    if size < 0 or stop > len(body):
        raise ValueError("field runs past the body")
    return body[pos:stop], stop


def _read(body: bytes) -> dict[str, Any] | None:
    read = avro.read_long
    pos = 0
    timeout: float | None = None
    if body[0] == 2:
        (timeout,) = _DOUBLE.unpack_from(body, 1)
        pos = 9
    elif body[0] != 0:
        return None
    else:
        pos = 1
    transactional_id: str | None = None
    branch, pos = body[pos], pos + 1
    if branch == 2:
        raw, pos = _string(body, pos)
        transactional_id = raw.decode()
    elif branch != 0:
        return None
    epoch: int | None = None
    branch, pos = body[pos], pos + 1
    if branch == 2:
        epoch, pos = read(body, pos)
    elif branch != 0:
        return None
    topics: list[dict[str, Any]] = []
    count, pos = read(body, pos)
    if count < 0:
        return None  # a block with its byte size: fastavro's
    if count:
        for _ in range(count):
            name, pos = _string(body, pos)
            publish, pos = _string(body, pos)
            topics.append({"topic": name.decode(), "body": publish})
        if body[pos] != 0:  # a second block
            return None
        pos += 1
    # Acks and group positions: fastavro (the envelope's lists there are small). No
    # generations of group positions either: present (empty) or not (a body written
    # before they were added).
    if body[pos:] not in (b"\x00\x00", b"\x00\x00\x00"):
        return None
    return {
        "timeout": timeout,
        "transactionalId": transactional_id,
        "epoch": epoch,
        "topics": topics,
        "acks": [],
        "groupCommits": [],
        "groupCommitGenerations": [],
    }

"""Keys and values of consumer-group state in the Metadata table (prefix ``grp.``).

::

    grp.g/{topic_id (4)}{generation (4)}{group}                  -> group record (JSON)
    grp.p/{topic_id (4)}{generation (4)}{len (1)}{group}{partition (2)}{wp (8)}
                                                                 -> position (message id)

A group belongs to one topic generation, so a re-created topic starts its groups
afresh and deleting a topic drops them with one range. A position is written under
the write pointer of the transaction that commits it and counts only once that
transaction is visible (Tephra's rule, as for messages); the newest visible one is
the partition's position. Write pointer 0 marks a position set by an administrator
(a reset), visible at once.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from tidings.structs import Message

__all__ = [
    "GROUP_PREFIX",
    "POSITION_PREFIX",
    "GroupRecord",
    "Member",
    "decode_group",
    "encode_group",
    "group_key",
    "group_name_of",
    "key_hash",
    "partition_of",
    "groups_range",
    "partition_range",
    "position_key",
    "positions_range",
    "topic_of",
    "topic_range",
    "write_pointer_of",
]

GROUP_PREFIX = b"grp.g/"
POSITION_PREFIX = b"grp.p/"
_TOPIC = struct.Struct(">II")
_TAIL = struct.Struct(">HQ")


@dataclass(frozen=True, slots=True)
class Member:
    """A member of a group: its session timeout and the partitions it owns."""

    timeout_ms: int
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group's durable state: partition count, generation (one per rebalance),
    members, the start policy for partitions without a position, and, per owned
    partition, the generation since which its owner has held it without a break (a
    commit by a member told only of an older generation is fenced: its positions
    come from an earlier ownership)."""

    partitions: int
    generation: int = 0
    members: Mapping[str, Member] = field(default_factory=dict)
    start: str = "earliest"
    since: Mapping[int, int] = field(default_factory=dict)

    def owner(self, partition: int) -> str | None:
        """The member owning ``partition``, if any."""
        for member_id, member in self.members.items():
            if partition in member.partitions:
                return member_id
        return None


def encode_group(record: GroupRecord) -> bytes:
    """The stored form of a group record."""
    return orjson.dumps(
        {
            "partitions": record.partitions,
            "generation": record.generation,
            "start": record.start,
            "members": {
                m: {"timeoutMs": v.timeout_ms, "partitions": list(v.partitions)}
                for m, v in record.members.items()
            },
            "since": {str(p): g for p, g in sorted(record.since.items())},
        }
    )


def decode_group(raw: bytes) -> GroupRecord:
    """Inverse of :func:`encode_group`."""
    obj = orjson.loads(raw)
    members = {
        str(m): Member(int(v["timeoutMs"]), tuple(int(p) for p in v["partitions"]))
        for m, v in obj["members"].items()
    }
    # Absent in records written before it was kept: nothing is known of the owners'
    # tenure, and no commit is fenced by it until the next rebalance.
    since = {int(p): int(g) for p, g in obj.get("since", {}).items()}
    return GroupRecord(int(obj["partitions"]), int(obj["generation"]), members, obj["start"], since)


def _topic(topic_id: int, generation: int) -> bytes:
    return _TOPIC.pack(topic_id, generation)


def group_key(topic_id: int, generation: int, group: str) -> bytes:
    """Key of a group's record."""
    return GROUP_PREFIX + _topic(topic_id, generation) + group.encode("ascii")


def groups_range(topic_id: int, generation: int) -> tuple[bytes, bytes]:
    """The records of every group of one topic generation."""
    start = GROUP_PREFIX + _topic(topic_id, generation)
    return start, start + b"\xff"


def topic_of(key: bytes) -> tuple[int, int]:
    """``(topic_id, generation)`` of a group record key."""
    topic_id, generation = _TOPIC.unpack_from(key, len(GROUP_PREFIX))
    return int(topic_id), int(generation)


def group_name_of(key: bytes) -> str:
    """The group name in a group record key."""
    return key[len(GROUP_PREFIX) + _TOPIC.size :].decode("ascii")


def _group_part(topic_id: int, generation: int, group: str) -> bytes:
    name = group.encode("ascii")
    return POSITION_PREFIX + _topic(topic_id, generation) + bytes((len(name),)) + name


def position_key(
    topic_id: int, generation: int, group: str, partition: int, write_pointer: int
) -> bytes:
    """Key of a position written under ``write_pointer`` (0: set by a reset)."""
    return _group_part(topic_id, generation, group) + _TAIL.pack(partition, write_pointer)


def partition_range(
    topic_id: int, generation: int, group: str, partition: int
) -> tuple[bytes, bytes]:
    """Every position record of one partition, oldest write pointer first."""
    start = _group_part(topic_id, generation, group) + struct.pack(">H", partition)
    return start, start + b"\xff" * 9


def positions_range(topic_id: int, generation: int, group: str) -> tuple[bytes, bytes]:
    """Every position record of a group."""
    start = _group_part(topic_id, generation, group)
    return start, start + b"\xff" * 11


def write_pointer_of(key: bytes) -> tuple[int, int]:
    """``(partition, write pointer)`` of a position key."""
    partition, write_pointer = _TAIL.unpack_from(key, len(key) - _TAIL.size)
    return int(partition), int(write_pointer)


def topic_range(topic_id: int) -> list[tuple[bytes, bytes]]:
    """Every group row of a topic, all generations: what deleting it removes."""
    id_part = struct.pack(">I", topic_id)
    return [(p + id_part, p + id_part + b"\xff" * 5) for p in (GROUP_PREFIX, POSITION_PREFIX)]


def key_hash(message: Message) -> int:
    """``crc32`` of the message's key, or of its id when it has none (so keyless
    messages spread evenly): its partition in a group of ``P`` is ``key_hash % P``."""
    return zlib.crc32(message.key if message.key is not None else message.id.to_bytes())


def partition_of(message: Message, partitions: int) -> int:
    """The partition of ``message`` in a group of ``partitions``. The server filters
    polls by it and the client files the positions it commits under it."""
    return key_hash(message) % partitions

"""Positions in topics, Spark offsets made of them, and how a range is cut into tasks.

A *position* is where reading a topic resumes, as a string (Spark keeps offsets as JSON
in its checkpoint, so they must be plain data):

- ``"earliest"``: the oldest live message;
- ``"time:<ms>"``: the first message published at or after ``ms``;
- ``"at:<id>"``: message ``id`` (40 hex characters) itself;
- ``"<id>"``: right after message ``id`` -- what every micro-batch ends at.

A streaming offset is ``{topic: position}`` with its topics sorted, so equal offsets
serialise to equal JSON (Spark compares them as text). Message ids compare as their
hex strings do, because ids sort byte-wise. Since the source checks that a topic was
not deleted and created again under a query, the offset also records each topic's
generation, under the key ``"@generations"`` (no topic name has an ``@``), last:
``{"t": "<id>", "@generations": {"t": 1}}``. An offset without it (checkpointed
before) is read as one whose generations are not known yet.

Pure functions only: the I/O that finds positions lives in :mod:`tidings.spark.scan`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidings.errors import InvalidMessageId
from tidings.structs import MessageId

__all__ = [
    "EARLIEST",
    "GENERATIONS",
    "Slice",
    "allocate",
    "check_position",
    "decode_generations",
    "decode_offset",
    "encode_offset",
    "poll_start",
    "position_after",
    "position_floor_ts",
    "position_reaches",
    "slices",
]

EARLIEST = "earliest"
#: The offset's key for the topics' generations (not a topic name: those have no ``@``).
GENERATIONS = "@generations"


def position_after(message_id: MessageId) -> str:
    """The position right after ``message_id``."""
    return message_id.hex


def check_position(position: object, what: str = "position") -> str:
    """``position`` if it is one of the forms above, else ValueError."""
    if not isinstance(position, str):
        raise ValueError(f"{what} must be a string, got {position!r}")
    try:
        if position == EARLIEST:
            return position
        if position.startswith("time:"):
            if int(position[5:]) < 0:
                raise ValueError
            return position
        if position.startswith("at:"):
            MessageId.from_hex(position[3:])
            return position
        MessageId.from_hex(position)
        return position
    except (ValueError, InvalidMessageId):
        raise ValueError(f"{what} is not a Tidings position: {position!r}") from None


def poll_start(position: str) -> tuple[MessageId | int | None, bool]:
    """``(start, inclusive)`` of the poll that reads from ``position`` on."""
    if position == EARLIEST:
        return None, True
    if position.startswith("time:"):
        return int(position[5:]), True
    if position.startswith("at:"):
        return MessageId.from_hex(position[3:]), True
    return MessageId.from_hex(position), False


def position_floor_ts(position: str) -> int | None:
    """A publish time no message after ``position`` is older than (None: unknown)."""
    if position == EARLIEST:
        return None
    if position.startswith("time:"):
        return int(position[5:])
    if position.startswith("at:"):
        return MessageId.from_hex(position[3:]).publish_ts
    return MessageId.from_hex(position).publish_ts


def position_reaches(position: str, message_id: MessageId) -> bool:
    """True if a read from ``position`` on would meet ``message_id`` (it lies at or
    after the position); False if the read starts past it."""
    start, inclusive = poll_start(position)
    if start is None:
        return True
    if isinstance(start, int):
        return message_id.publish_ts >= start
    return message_id >= start if inclusive else message_id > start


def encode_offset(
    positions: Mapping[str, str], generations: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The Spark offset for ``positions`` (and the ``generations`` of their topics):
    topics sorted so equal offsets are equal JSON."""
    offset: dict[str, Any] = {t: check_position(positions[t]) for t in sorted(positions)}
    if generations:
        offset[GENERATIONS] = {t: int(generations[t]) for t in sorted(generations)}
    return offset


def decode_offset(offset: object) -> dict[str, str]:
    """Positions from a Spark offset (as checkpointed); ValueError if it is not ours."""
    if not isinstance(offset, dict):
        raise ValueError(f"a Tidings offset is a JSON object of topic -> position: {offset!r}")
    return {
        str(t): check_position(p, f"offset of topic {t!r}")
        for t, p in offset.items()
        if t != GENERATIONS
    }


def decode_generations(offset: object) -> dict[str, int]:
    """The topics' generations a Spark offset records (none in an older offset)."""
    if not isinstance(offset, dict):
        raise ValueError(f"a Tidings offset is a JSON object of topic -> position: {offset!r}")
    raw = offset.get(GENERATIONS, {})
    if not isinstance(raw, dict) or not all(
        isinstance(g, int) and not isinstance(g, bool) for g in raw.values()
    ):
        raise ValueError(f"the offset's {GENERATIONS} is not topic -> generation: {raw!r}")
    return {str(t): g for t, g in raw.items()}


def allocate(available: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split at most ``budget`` messages among topics with ``available`` messages each.

    Everything when it fits; otherwise shares proportional to what each topic has
    (largest remainders first), so a busy topic cannot starve a quiet one for long and
    every batch makes progress while anything is available.
    """
    if budget < 1:
        raise ValueError("budget must be positive")
    total = sum(available.values())
    if total <= budget:
        return dict(available)
    shares = {t: budget * n // total for t, n in available.items()}
    left = budget - sum(shares.values())
    by_remainder = sorted(available, key=lambda t: (-(budget * available[t] % total), t))
    for topic in by_remainder:
        if left == 0:
            break
        if shares[topic] < available[topic]:
            shares[topic] += 1
            left -= 1
    return shares


@dataclass(frozen=True, slots=True)
class Slice:
    """A part of a topic's range by publish time: ``lo`` inclusive, ``hi`` exclusive.

    ``lo`` None: from the range's own start; ``hi`` None: to the range's own end.
    """

    lo: int | None
    hi: int | None


def slices(first_ts: int | None, last_ts: int, pieces: int) -> list[Slice]:
    """Cut the publish times ``[first_ts, last_ts]`` into at most ``pieces`` slices.

    Slices are whole milliseconds (a message never straddles two) and never more than
    there are milliseconds; with ``first_ts`` unknown the range stays whole.
    """
    if pieces < 1:
        raise ValueError("pieces must be positive")
    if first_ts is None or last_ts <= first_ts or pieces == 1:
        return [Slice(None, None)]
    span = last_ts - first_ts + 1
    pieces = min(pieces, span)
    cuts = [first_ts + span * i // pieces for i in range(1, pieces)]
    bounds: Sequence[int | None] = [None, *cuts, None]
    return [Slice(bounds[i], bounds[i + 1]) for i in range(pieces)]

"""Assignment of Message Table and Payload Table positions: the one ordering rule.

Pure functions; the service calls them inside the store's write function, with the
topic's last assigned position read in that same write, so assignment and visibility
happen together and in order (invariant 1 of docs/design.md).
"""

from __future__ import annotations

from tidings.codec.keys import MAX_SEQ

__all__ = ["assign"]


def assign(last_ts: int, last_seq: int, now: int, count: int) -> tuple[int, int, int, int]:
    """Positions for ``count >= 1`` entries after ``(last_ts, last_seq)``.

    Returns ``(start_ts, start_seq, end_ts, end_seq)``, both ends inclusive. The batch
    uses one timestamp, ``max(now, last_ts)``, so a clock that steps back cannot reorder
    the topic; the 2-byte seq counts up within it and, when it runs out, the batch moves
    on to the next millisecond at seq 0. ``(0, 0)`` is never assigned: a message id whose
    ``write_ts | p_seq`` is zero therefore always means "not from the Payload Table".
    """
    if count < 1:
        raise ValueError("count must be at least 1")
    ts = now if now > last_ts else last_ts
    seq = last_seq + 1 if ts == last_ts else 0
    if seq > MAX_SEQ:
        ts += 1
        seq = 0
    last = seq + count - 1
    return ts, seq, ts + last // (MAX_SEQ + 1), last % (MAX_SEQ + 1)

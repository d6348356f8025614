"""The one visibility rule (Tephra) that the transaction service and every consumer share.

Pure functions only: no I/O, no state, property-tested in ``tests/test_tx_visibility.py``.
"""

from __future__ import annotations

import bisect

from tidings.structs import Transaction

__all__ = ["Visibility", "classify", "is_visible"]


def _contains(sorted_ids: tuple[int, ...], value: int) -> bool:
    i = bisect.bisect_left(sorted_ids, value)
    return i < len(sorted_ids) and sorted_ids[i] == value


class Visibility:
    """What a transactional reader does with an entry written by pointer ``w``."""

    VISIBLE = 0
    #: Written by an invalid (timed-out/aborted) or rolled-back transaction: skip it.
    SKIP = 1
    #: Written by a transaction still in progress (or begun after the snapshot): stop here.
    BLOCK = 2


def is_visible(tx: Transaction, write_pointer: int) -> bool:
    """True if data written by ``write_pointer`` is visible in snapshot ``tx``.

    Visible means: written by ``tx`` itself, or committed before ``tx`` began, i.e.
    ``0 < w <= read_pointer`` and ``w`` neither invalid nor in progress. A negative
    pointer marks rolled-back data and is never visible.
    """
    if write_pointer == tx.write_pointer:
        return True
    if write_pointer <= 0 or write_pointer > tx.read_pointer:
        return False
    return not _contains(tx.invalid, write_pointer) and not _contains(tx.in_progress, write_pointer)


def classify(tx: Transaction, write_pointer: int) -> int:
    """:class:`Visibility` of an entry for a transactional consumer (invariant 3).

    Rolled back (negative) and invalid entries are skipped; entries of transactions
    in progress in ``tx``, or begun after it, block (ordering over latency).
    """
    if is_visible(tx, write_pointer):
        return Visibility.VISIBLE
    if write_pointer <= 0 or _contains(tx.invalid, write_pointer):
        return Visibility.SKIP
    return Visibility.BLOCK

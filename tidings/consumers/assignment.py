"""Which member of a group owns which partition: a sticky assignment (no I/O).

Every partition has one owner while the group has members. A rebalance keeps each
member's partitions where it can (Kafka's sticky assignor: as few moves as possible)
and only evens out the counts: every member ends with ``P // n`` or ``P // n + 1``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["assign"]


def assign(
    partitions: int, current: Mapping[str, Sequence[int]], members: Sequence[str]
) -> dict[str, tuple[int, ...]]:
    """The new assignment of ``partitions`` to ``members`` given the ``current`` one.

    Members keep what they owned up to their quota; what is left (partitions of
    members that left, or above a quota) goes to the members with the fewest, in
    partition order. Deterministic: the same inputs give the same answer.
    """
    if not members:
        return {}
    ordered = sorted(members)
    base, extra = divmod(partitions, len(ordered))
    # Who gets the extra partitions: those already holding the most keep the most.
    by_holding = sorted(ordered, key=lambda m: (-len(current.get(m, ())), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    kept: dict[str, list[int]] = {}
    taken: set[int] = set()
    for member in ordered:
        mine = [p for p in sorted(current.get(member, ())) if 0 <= p < partitions]
        mine = [p for p in mine if p not in taken][: quota[member]]
        kept[member] = mine
        taken.update(mine)
    free = [p for p in range(partitions) if p not in taken]
    for p in free:
        member = min(ordered, key=lambda m: (len(kept[m]) - quota[m], len(kept[m]), m))
        kept[member].append(p)
    return {m: tuple(sorted(ps)) for m, ps in kept.items()}

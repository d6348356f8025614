"""The shared visibility rule: its definition, and invariant 3 over real histories."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.structs import Transaction
from tidings.tx import Visibility, classify, is_visible
from tidings.tx.state import TxStateMachine

pointers = st.integers(min_value=1, max_value=60)


@st.composite
def snapshots(draw: st.DrawFn) -> Transaction:
    read = draw(st.integers(min_value=0, max_value=40))
    write = draw(st.integers(min_value=read + 1, max_value=50))
    ids = draw(st.lists(st.integers(1, write - 1), unique=True)) if write > 1 else []
    split = draw(st.integers(0, len(ids)))
    return Transaction(read, write, tuple(sorted(ids[:split])), tuple(sorted(ids[split:])))


@settings(max_examples=300)
@given(snapshots(), st.integers(min_value=-60, max_value=60))
def test_is_visible_is_the_tephra_rule(tx: Transaction, w: int) -> None:
    expected = w == tx.write_pointer or (
        0 < w <= tx.read_pointer and w not in tx.invalid and w not in tx.in_progress
    )
    assert is_visible(tx, w) == expected


@settings(max_examples=300)
@given(snapshots(), st.integers(min_value=-60, max_value=60))
def test_classify_agrees_with_is_visible(tx: Transaction, w: int) -> None:
    kind = classify(tx, w)
    assert (kind == Visibility.VISIBLE) == is_visible(tx, w)
    if kind == Visibility.SKIP:
        assert w <= 0 or w in tx.invalid
    if kind == Visibility.BLOCK:
        assert w > 0 and w not in tx.invalid
        assert w in tx.in_progress or w > tx.read_pointer


def test_examples() -> None:
    tx = Transaction(read_pointer=10, write_pointer=20, invalid=(3,), in_progress=(5, 12))
    assert classify(tx, 20) == Visibility.VISIBLE  # its own writes
    assert classify(tx, 7) == Visibility.VISIBLE  # committed before it began
    assert classify(tx, 3) == Visibility.SKIP  # invalid
    assert classify(tx, -7) == Visibility.SKIP  # rolled back
    assert classify(tx, 0) == Visibility.SKIP
    assert classify(tx, 5) == Visibility.BLOCK  # in progress, below the read pointer
    assert classify(tx, 12) == Visibility.BLOCK  # in progress, above it
    assert classify(tx, 25) == Visibility.BLOCK  # began after this snapshot


# -- invariant 3 over histories produced by the real state machine -----------------------

ops = st.lists(
    st.tuples(st.sampled_from(["begin", "commit", "abort", "invalidate", "expire"]), pointers),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_snapshots_follow_invariant_3(script: list[tuple[str, int]]) -> None:
    """Each snapshot sees exactly what committed before it, skips what was invalid when it
    began (and what was rolled back), blocks on the rest; later snapshots keep seeing what
    earlier ones saw."""
    state = TxStateMachine()
    now = 1_000
    status: dict[int, str] = {}  # wp -> in_progress/committed/aborted/invalid
    taken: list[tuple[Transaction, dict[int, str]]] = []
    for op, n in script:
        now += n
        open_ = [wp for wp, s in status.items() if s == "in_progress"]
        if op == "begin" or not open_:
            result = state.begin(now, timeout_ms=30)
            assert result.transaction is not None
            taken.append((result.transaction, dict(status)))
            status[result.transaction.write_pointer] = "in_progress"
            continue
        wp = open_[n % len(open_)]
        if op == "commit":
            result = state.commit(now, wp)
            status[wp] = "committed" if result.error is None else "invalid"
        elif op == "abort":
            state.abort(wp)
            status[wp] = "aborted"
        elif op == "invalidate":
            state.invalidate(wp)
            status[wp] = "invalid"
        else:
            for expired in state.expire(now).ids:
                status[expired] = "invalid"

    every = list(status)
    for tx, before in taken:
        for w in every:
            stored = -w if status[w] == "aborted" else w  # the client rolled it back
            kind = classify(tx, stored)
            if w == tx.write_pointer:
                expected = Visibility.SKIP if status[w] == "aborted" else Visibility.VISIBLE
            elif status[w] == "aborted":
                expected = Visibility.SKIP
            elif before.get(w) == "committed":
                expected = Visibility.VISIBLE
            elif before.get(w) == "invalid":
                expected = Visibility.SKIP
            else:  # in progress when tx began, or began later: tx must wait, never see it
                expected = Visibility.BLOCK
            assert kind == expected, (tx, w, status[w], before.get(w))
    for (early, _), (late, _) in itertools.pairwise(taken):
        for w in every:
            if w != early.write_pointer and is_visible(early, w):
                assert is_visible(late, w)

"""The pure state machine: pointers, conflicts, timeouts, end states, prune, replay."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import (
    BadRequest,
    TransactionAborted,
    TransactionCommitted,
    TransactionConflict,
    TransactionInvalid,
    TransactionNotFound,
    TransactionTimedOut,
)
from tidings.structs import Transaction
from tidings.tx.records import (
    Commit,
    Invalidate,
    Outcome,
    Record,
    Reserve,
    decode_record,
    encode_record,
)
from tidings.tx.snapshot import decode_state, encode_state
from tidings.tx.state import RESERVATION, TxStateMachine

NOW = 1_700_000_000_000


def begin(state: TxStateMachine, now: int = NOW, timeout_ms: int = 30_000) -> Transaction:
    result = state.begin(now, timeout_ms)
    assert result.error is None and result.transaction is not None
    return result.transaction


def ok(result: object) -> None:
    assert getattr(result, "error", None) is None


def error_of(result: object) -> type[BaseException]:
    error = getattr(result, "error", None)
    assert error is not None
    return type(error)


def test_write_pointers_follow_the_clock_between_reservations() -> None:
    state = TxStateMachine()
    a = begin(state).write_pointer
    b = begin(state).write_pointer
    assert a == NOW * 1_000_000
    assert b == a + 1  # inside a reservation pointers are consecutive
    c = begin(state, now=NOW - 60_000).write_pointer  # clock stepped back
    assert c == b + 1
    assert state.reserved_from == a and state.reserved >= a + RESERVATION
    later = NOW + 5
    pointers = [begin(state, now=later).write_pointer for _ in range(3 * RESERVATION)]
    assert pointers == list(range(c + 1, c + 1 + 3 * RESERVATION))  # extended, contiguous
    ok(state.release())  # a clean stop: the reservation ends at the last pointer
    assert state.reserved == pointers[-1]
    d = begin(state, now=later).write_pointer
    assert d == later * 1_000_000  # a new reservation starts from the clock
    assert state.reserved_from == d


def test_begins_reserve_pointers_ahead() -> None:
    state = TxStateMachine()
    seen: list[Reserve] = []
    for _ in range(5 * RESERVATION):
        result = state.begin(NOW, 30_000)
        assert result.transaction is not None
        wp = result.transaction.write_pointer
        seen += [r for r in result.records if isinstance(r, Reserve)]
        # Every pointer handed out is reserved, with at least half a reservation to spare.
        assert state.reserved_from <= wp and state.reserved - wp >= RESERVATION // 2
    starts = [r.start for r in seen]
    assert starts[1:] == [r.upto + 1 for r in seen[:-1]]  # one contiguous run


def test_recovery_invalidates_the_unlogged_rest_of_the_reservation() -> None:
    state = TxStateMachine()
    logged: list[Record] = []
    for _ in range(10):
        logged += state.begin(NOW, 30_000).records
    lost_begins = [begin(state).write_pointer for _ in range(3)]  # records "lost"
    replayed = TxStateMachine()
    for record in logged:
        replayed.apply(record)
    lost = replayed.invalidate_unlogged()
    assert set(lost_begins) <= set(lost)
    assert lost == tuple(range(lost[0], state.reserved + 1))
    assert len(lost) <= RESERVATION
    assert replayed.last_write_pointer == state.reserved
    assert replayed.outcome(lost_begins[0]) is Outcome.UNLOGGED
    assert error_of(replayed.commit(NOW, lost_begins[0])) is TransactionInvalid
    assert replayed.invalidate_unlogged() == ()  # idempotent: a second recovery adds none
    fresh = replayed.begin(NOW, 30_000).transaction
    assert fresh is not None and fresh.write_pointer > state.reserved  # never handed out again
    assert set(lost) <= set(fresh.invalid)


def test_snapshot_contents() -> None:
    state = TxStateMachine()
    t1, t2, t3 = begin(state), begin(state), begin(state)
    ok(state.commit(NOW, t2.write_pointer))
    ok(state.invalidate(t3.write_pointer))
    t4 = begin(state)
    assert t4.read_pointer == t2.write_pointer
    assert t4.in_progress == (t1.write_pointer,)
    assert t4.invalid == (t3.write_pointer,)
    assert t4.write_pointer > state.read_pointer
    view = state.view()
    assert set(view.in_progress) == {t1.write_pointer, t4.write_pointer}
    assert view.in_progress[t1.write_pointer] == NOW + 30_000


def test_conflicts_only_with_later_commits_of_the_same_key() -> None:
    state = TxStateMachine()
    early = begin(state)
    ok(state.commit(NOW, early.write_pointer, [b"k"]))  # committed before `a` began
    a, b = begin(state), begin(state)
    ok(state.commit(NOW, b.write_pointer, [b"k", b"x"]))
    assert error_of(state.commit(NOW, a.write_pointer, [b"k"])) is TransactionConflict
    # A conflict changes nothing: `a` is still in progress and may try other keys.
    assert a.write_pointer in state.in_progress
    ok(state.commit(NOW, a.write_pointer, [b"y"]))
    c = begin(state)
    ok(state.commit(NOW, c.write_pointer, [b"k"]))  # nothing committed after c began


def test_change_sets_are_dropped_once_no_older_transaction_is_open() -> None:
    state = TxStateMachine()
    a = begin(state)
    b = begin(state)
    ok(state.commit(NOW, b.write_pointer, [b"k"]))
    assert state.change_set_count() == 1  # `a` could still conflict with it
    ok(state.abort(a.write_pointer))
    assert state.change_set_count() == 0
    c = begin(state)
    ok(state.commit(NOW, c.write_pointer, [b"k"]))  # no one left to conflict with
    assert state.change_set_count() == 0


def test_timeout_at_commit_invalidates() -> None:
    state = TxStateMachine()
    t = begin(state, timeout_ms=1_000)
    result = state.commit(NOW + 1_000, t.write_pointer)
    assert isinstance(result.error, TransactionTimedOut)
    assert result.records == (Invalidate(t.write_pointer, Outcome.TIMED_OUT),)
    assert state.invalid == {t.write_pointer}
    assert error_of(state.commit(NOW, t.write_pointer)) is TransactionTimedOut


def test_expire_moves_only_expired_transactions() -> None:
    state = TxStateMachine()
    short = begin(state, timeout_ms=1_000)
    long = begin(state, timeout_ms=10_000)
    assert state.expire(NOW + 999).ids == ()
    assert state.expire(NOW + 1_000).ids == (short.write_pointer,)
    assert list(state.in_progress) == [long.write_pointer]
    later = begin(state, now=NOW + 2_000)
    assert later.invalid == (short.write_pointer,)


def test_end_states_answer_each_later_call() -> None:
    state = TxStateMachine()
    committed, aborted, invalid, timed_out = (begin(state, timeout_ms=5) for _ in range(4))
    ok(state.commit(NOW, committed.write_pointer))
    ok(state.abort(aborted.write_pointer))
    ok(state.invalidate(invalid.write_pointer))
    state.expire(NOW + 5)
    unknown = 12345

    commit = {
        committed: TransactionCommitted,
        aborted: TransactionAborted,
        invalid: TransactionInvalid,
        timed_out: TransactionTimedOut,
    }
    for tx, error in commit.items():
        assert error_of(state.commit(NOW, tx.write_pointer)) is error
    assert error_of(state.commit(NOW, unknown)) is TransactionNotFound

    # abort: idempotent once the data is skipped anyway; committed stays committed
    assert error_of(state.abort(committed.write_pointer)) is TransactionCommitted
    for tx in (aborted, invalid, timed_out):
        assert state.abort(tx.write_pointer).records == ()
        ok(state.abort(tx.write_pointer))
    assert error_of(state.abort(unknown)) is TransactionNotFound

    # invalidate: idempotent on invalid ones; refuses ended ones (as Tephra's returns false)
    assert error_of(state.invalidate(committed.write_pointer)) is TransactionCommitted
    assert error_of(state.invalidate(aborted.write_pointer)) is TransactionAborted
    for tx in (invalid, timed_out):
        ok(state.invalidate(tx.write_pointer))
    assert error_of(state.invalidate(unknown)) is TransactionNotFound
    # none of the refused calls changed a thing
    assert state.invalid == {invalid.write_pointer, timed_out.write_pointer}


def test_abort_does_not_invalidate() -> None:
    state = TxStateMachine()
    t = begin(state)
    ok(state.abort(t.write_pointer))
    assert state.invalid == set()
    assert t.write_pointer not in state.in_progress


def test_history_is_bounded() -> None:
    state = TxStateMachine(history_size=3)
    txs = [begin(state) for _ in range(5)]
    for tx in txs:
        ok(state.commit(NOW, tx.write_pointer))
    assert error_of(state.commit(NOW, txs[0].write_pointer)) is TransactionNotFound
    assert error_of(state.commit(NOW, txs[-1].write_pointer)) is TransactionCommitted


def test_invalid_ids_outlive_the_history() -> None:
    state = TxStateMachine(history_size=1)
    t = begin(state)
    ok(state.invalidate(t.write_pointer))
    ok(state.commit(NOW, begin(state).write_pointer))
    assert error_of(state.commit(NOW, t.write_pointer)) is TransactionInvalid


def test_prune() -> None:
    state = TxStateMachine()
    txs = [begin(state) for _ in range(5)]
    for tx in txs:
        ok(state.invalidate(tx.write_pointer))
    ids = [tx.write_pointer for tx in txs]
    assert state.prune(below=ids[2]).ids == tuple(ids[:2])
    assert state.prune(ids=[ids[4], 999, ids[0]]).ids == (ids[4],)
    assert state.prune(below=ids[0]).records == ()
    assert state.invalid_ids() == (ids[2], ids[3])
    assert begin(state).invalid == (ids[2], ids[3])
    with pytest.raises(BadRequest):
        state.prune(ids=["x"])  # type: ignore[list-item]


def test_change_keys_must_be_bytes() -> None:
    state = TxStateMachine()
    t = begin(state)
    with pytest.raises(BadRequest):
        state.commit(NOW, t.write_pointer, ["text"])  # type: ignore[list-item]
    with pytest.raises(BadRequest):
        state.commit(NOW, t.write_pointer, b"key")
    assert t.write_pointer in state.in_progress


# -- properties over random scripts ------------------------------------------------------

KEYS = st.frozensets(st.sampled_from([b"a", b"b", b"c", b"d"]), max_size=2)
SCRIPT = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "begin",
                "begin",
                "commit",
                "commit",
                "abort",
                "invalidate",
                "expire",
                "prune",
                "register",
                "release",
            ]
        ),
        st.integers(0, 2_000),
        KEYS,
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(SCRIPT, st.data())
def test_random_scripts(
    script: list[tuple[str, int, frozenset[bytes]]], data: st.DataObject
) -> None:
    state = TxStateMachine(history_size=8)
    now = NOW
    log = []
    handed_out: list[int] = []
    began: dict[int, int] = {}  # wp -> wp (the snapshot point)
    # wp -> (log index of the Reserve covering it, log index of its Begin)
    where: dict[int, tuple[int, int]] = {}
    commits: list[tuple[int, frozenset[bytes]]] = []  # (commit pointer, keys), never pruned
    for op, n, keys in script:
        now += n - 500  # the clock wanders, backwards too
        open_ = list(state.in_progress)
        target = open_[n % len(open_)] if open_ else n
        if op == "begin":
            result = state.begin(now, 1_500, None, None)
            assert result.transaction is not None
            wp = result.transaction.write_pointer
            handed_out.append(wp)
            began[wp] = wp
            records = log + list(result.records)
            covering = [
                i
                for i, r in enumerate(records)
                if isinstance(r, Reserve) and r.start <= wp <= r.upto
            ]
            where[wp] = (covering[-1], len(records) - 1)  # the latest one covering it
        elif op == "commit":
            expected_conflict = target in state.in_progress and any(
                cp > target and ck & keys for cp, ck in commits
            )
            expired = target in state.in_progress and now >= state.in_progress[target].expiry_ms
            result = state.commit(now, target, keys)
            if expired:
                assert isinstance(result.error, TransactionTimedOut)
            elif target in open_:
                assert isinstance(result.error, TransactionConflict) == expected_conflict
            if result.error is None:
                (record,) = result.records
                assert isinstance(record, Commit)
                commits.append((record.commit_pointer, keys))
        elif op == "abort":
            result = state.abort(target)
        elif op == "invalidate":
            result = state.invalidate(target)
        elif op == "expire":
            result = state.expire(now)
        elif op == "prune":
            result = state.prune(below=target if n % 2 else None, ids=[target])
        elif op == "release":
            result = state.release()
        else:
            result = state.register(f"p{n % 3}")
        log.extend(result.records)
        assert not state.invalid & set(state.in_progress)
        assert state.read_pointer <= state.last_write_pointer
        assert list(state.in_progress) == sorted(state.in_progress)

    assert len(set(handed_out)) == len(handed_out)
    assert handed_out == sorted(handed_out)
    # Replaying the records (through their binary form) rebuilds exactly this state...
    replayed = TxStateMachine(history_size=8)
    for record in log:
        replayed.apply(decode_record(encode_record(record)))
    assert replayed.export() == state.export()
    # ...and so does a snapshot image.
    image = decode_state(encode_state(state.export()))
    assert image == state.export()
    assert TxStateMachine.from_image(image, 8).export() == state.export()
    # A crash keeps a prefix of the log. Every begin whose reservation is in it may have
    # been answered early: its pointer is named by the prefix, or invalid after recovery,
    # and never handed out again.
    cut = data.draw(st.integers(0, len(log)), label="cut")
    recovered = TxStateMachine(history_size=8)
    for record in log[:cut]:
        recovered.apply(record)
    recovered.invalidate_unlogged()
    for wp, (reserve_at, begin_at) in where.items():
        if reserve_at < cut:
            assert begin_at < cut or wp in recovered.invalid
            assert wp <= recovered.last_write_pointer

"""Positions, offsets, admission shares and time slices (pure functions)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidings.spark.offsets import (
    EARLIEST,
    Slice,
    allocate,
    decode_offset,
    encode_offset,
    poll_start,
    position_after,
    position_floor_ts,
    slices,
)
from tidings.structs import MessageId

pytestmark = pytest.mark.spark

MID = MessageId(1_700_000_000_123, 4, 1_700_000_000_100, 2)


def test_positions_and_poll_starts() -> None:
    assert poll_start(EARLIEST) == (None, True)
    assert poll_start("time:42") == (42, True)
    assert poll_start("at:" + MID.hex) == (MID, True)
    assert poll_start(position_after(MID)) == (MID, False)
    assert position_floor_ts(EARLIEST) is None
    assert position_floor_ts("time:42") == 42
    assert position_floor_ts(MID.hex) == MID.publish_ts


def test_offsets_are_sorted_json_and_checked() -> None:
    offset = encode_offset({"b": MID.hex, "a": EARLIEST})
    assert json.dumps(offset) == json.dumps({"a": EARLIEST, "b": MID.hex})
    assert decode_offset(json.loads(json.dumps(offset))) == {"a": EARLIEST, "b": MID.hex}
    for bad in ([], {"a": 1}, {"a": "time:x"}, {"a": "at:zz"}, {"a": "nope"}):
        with pytest.raises(ValueError):
            decode_offset(bad)


def test_hex_order_is_id_order() -> None:
    ids = [MessageId(5, 1), MessageId(5, 1, 3, 0), MessageId(5, 2), MessageId(300, 0)]
    assert sorted(i.hex for i in ids) == [i.hex for i in sorted(ids)]


def test_allocate_examples() -> None:
    assert allocate({"a": 3, "b": 4}, 10) == {"a": 3, "b": 4}
    assert allocate({"a": 90, "b": 10}, 10) == {"a": 9, "b": 1}
    assert allocate({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}
    assert allocate({"a": 0, "b": 5}, 1) == {"a": 0, "b": 1}


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 1000)), st.integers(1, 2000))
def test_allocate_properties(available: dict[str, int], budget: int) -> None:
    shares = allocate(available, budget)
    assert set(shares) == set(available)
    assert all(0 <= shares[t] <= available[t] for t in available)
    assert sum(shares.values()) == min(budget, sum(available.values()))


def test_slices() -> None:
    assert slices(None, 100, 4) == [Slice(None, None)]
    assert slices(100, 100, 4) == [Slice(None, None)]
    assert slices(100, 101, 4) == [Slice(None, 101), Slice(101, None)]
    assert slices(0, 99, 4) == [Slice(None, 25), Slice(25, 50), Slice(50, 75), Slice(75, None)]


@given(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(1, 20))
def test_slices_cover_the_range_in_order(first: int, span: int, pieces: int) -> None:
    cuts = slices(first, first + span, pieces)
    assert cuts[0].lo is None and cuts[-1].hi is None
    assert len(cuts) <= pieces
    for left, right in itertools.pairwise(cuts):
        assert left.hi is not None and left.hi == right.lo
        assert first < left.hi <= first + span
    inner = [c.lo for c in cuts[1:]]
    assert inner == sorted(set(inner))


@pytest.mark.parametrize(
    ("cores", "slices_wanted"), [(1, 1), (2, 2), (3, 3), (4, 4), (64, 4), (None, 4)]
)
def test_a_batch_read_is_cut_into_one_slice_per_core_up_to_four(
    monkeypatch: pytest.MonkeyPatch, cores: int | None, slices_wanted: int
) -> None:
    from tidings.spark import reader

    monkeypatch.setattr(reader.os, "cpu_count", lambda: cores)
    assert reader.default_batch_slices() == slices_wanted

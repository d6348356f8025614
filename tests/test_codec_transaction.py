"""The binary transaction snapshot: round trips, compactness, and strict rejection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.codec.transaction import decode_transaction, encode_transaction
from tidings.errors import InvalidTransaction
from tidings.structs import Transaction

MAX = 2**63 - 1
BASE = 1_700_000_000_000 * 1_000_000


@st.composite
def transactions(draw: st.DrawFn) -> Transaction:
    near = draw(st.booleans())
    low, high = (BASE, BASE + 10**12) if near else (2, MAX)
    write = draw(st.integers(low, high))
    read = draw(st.integers(0 if not near else BASE - 1, write - 1))
    ids = draw(st.lists(st.integers(max(1, low - 1), write - 1), unique=True, max_size=30))
    split = draw(st.integers(0, len(ids)))
    return Transaction(read, write, tuple(sorted(ids[:split])), tuple(sorted(ids[split:])))


@settings(max_examples=300)
@given(transactions())
def test_round_trip(tx: Transaction) -> None:
    raw = encode_transaction(tx)
    assert decode_transaction(raw) == tx
    assert decode_transaction(bytearray(raw)) == tx


def test_compact() -> None:
    wp = BASE + 5_000_000
    empty = encode_transaction(Transaction(BASE, wp))
    assert len(empty) <= 16
    busy = Transaction(
        BASE, wp, tuple(BASE - 1000 * i for i in range(50, 0, -1)), (BASE + 1, BASE + 2)
    )
    # 52 ids: far less than the 8 bytes each a fixed-width encoding would take.
    assert len(encode_transaction(busy)) < 52 * 3 + 20


@settings(max_examples=300)
@given(transactions(), st.data())
def test_truncation_and_trailing_bytes_are_rejected(tx: Transaction, data: st.DataObject) -> None:
    raw = encode_transaction(tx)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(InvalidTransaction):
        decode_transaction(raw[:cut])
    with pytest.raises(InvalidTransaction):
        decode_transaction(raw + data.draw(st.binary(min_size=1, max_size=4)))


@settings(max_examples=500)
@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_another_error(raw: bytes) -> None:
    try:
        tx = decode_transaction(raw)
    except InvalidTransaction:
        return
    assert encode_transaction(tx) == raw  # whatever decodes is canonical


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty"),
        (b"\x02\x00\x01\x00\x00", "version 2"),
        (b"\x01\x00\x00\x00\x00", "read pointer < write pointer"),
        (b"\x01\x80\x00\x01\x00\x00", "non-canonical"),
        (b"\x01" + b"\xff" * 10, "too long"),
        (b"\x01\x00\x0a\x02\x05\x00\x00", "unsorted (zero gap)"),
        (b"\x01\x00\x0a\x01\x0a\x00", "id not below write pointer"),
        (b"\x01\x00\x0a\x01\x03\x01\x03", "in both lists"),
        (b"\x01\x00\x0a\x05\x01", "count beyond the data"),
        (b"\x01\x00\x0a\x00\x00\x00", "trailing"),
        (b"\x01" + b"\xff" * 8 + b"\x7f" + b"\x01\x00\x00", "above 2**63"),
    ],
)
def test_rejects(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidTransaction):
        decode_transaction(raw)


def test_rejects_non_bytes() -> None:
    with pytest.raises(InvalidTransaction):
        decode_transaction("AQAB")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tx",
    [
        Transaction(5, 5),
        Transaction(-1, 5),
        Transaction(1, 2**63),
        Transaction(1, 10, invalid=(4, 3)),
        Transaction(1, 10, in_progress=(0,)),
        Transaction(1, 10, in_progress=(10,)),
        Transaction(1, 10, invalid=(3,), in_progress=(3,)),
    ],
)
def test_encode_refuses_impossible_snapshots(tx: Transaction) -> None:
    with pytest.raises(InvalidTransaction):
        encode_transaction(tx)


def test_version_byte_first() -> None:
    assert encode_transaction(Transaction(0, 1))[0] == 1

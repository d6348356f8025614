"""The client's shared non-I/O logic: messages, start positions, snapshots, retries."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tidings.client.base import (
    READ_ONLY_WRITE_POINTER,
    RetryPolicy,
    as_record,
    bearer_token,
    encoded_transaction,
    read_only_snapshot,
    resolve_start,
    to_records,
)
from tidings.codec.transaction import decode_transaction
from tidings.errors import (
    InvalidMessageId,
    RequestTimeout,
    TidingsConnectionError,
    TopicNotFound,
)
from tidings.structs import MessageId, Record, TransactionState


def test_messages_accept_bytes_text_and_records() -> None:
    record = Record(b"r", key=b"k")
    # Plain payloads stay bytes (the codec's fast path); text is UTF-8.
    assert to_records([b"a", "é", bytearray(b"b"), memoryview(b"c"), record]) == [
        b"a",
        "é".encode(),
        b"b",
        b"c",
        record,
    ]
    assert to_records("one") == [b"one"]
    plain = [b"x", b"y"]
    assert to_records(plain) == plain and to_records(plain) is not plain
    assert as_record(b"x") == Record(b"x") and as_record(record) is record
    with pytest.raises(TypeError):
        to_records([1])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (None, None),
        ("earliest", None),
        ("beginning", None),
        ("latest", "latest"),
        ("end", "latest"),
        (1234, 1234),
        ("1234", 1234),
        (MessageId(1, 2), MessageId(1, 2)),
        (MessageId(1, 2).hex, MessageId(1, 2)),
        (datetime(2024, 1, 1, tzinfo=UTC), 1704067200000),
        ("2024-01-01T00:00:00+00:00", 1704067200000),
    ],
)
def test_start_positions(start: object, expected: object) -> None:
    assert resolve_start(start) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("start", ["yesterday", -1, True, 1.5, "xyz" * 13 + "x"])
def test_bad_start_positions(start: object) -> None:
    with pytest.raises(InvalidMessageId):
        resolve_start(start)  # type: ignore[arg-type]


def test_read_only_snapshot_sees_what_a_fresh_transaction_would() -> None:
    from tidings.tx.visibility import Visibility, classify

    state = TransactionState(100, 130, {90: 0, 120: 0}, (80,))
    snap = read_only_snapshot(state)
    assert snap.write_pointer == READ_ONLY_WRITE_POINTER
    assert decode_transaction(encoded_transaction(snap) or b"") == snap
    assert classify(snap, 50) == Visibility.VISIBLE
    assert classify(snap, 100) == Visibility.VISIBLE
    assert classify(snap, 90) == Visibility.BLOCK  # in progress
    assert classify(snap, 120) == Visibility.BLOCK  # began after the read pointer
    assert classify(snap, 131) == Visibility.BLOCK  # began after the snapshot
    assert classify(snap, 80) == Visibility.SKIP  # invalid
    assert classify(snap, -50) == Visibility.SKIP  # rolled back


def test_retry_policy() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff=0.1, max_backoff=0.3, multiplier=2, jitter=0)
    assert policy.should_retry(TidingsConnectionError(), 1)
    assert policy.should_retry(RequestTimeout(), 2)
    assert not policy.should_retry(RequestTimeout(), 3)  # that was the last try
    assert not policy.should_retry(TopicNotFound(), 1)  # retrying cannot help
    assert not policy.should_retry(ValueError(), 1)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.3, 0.3])
    jittery = RetryPolicy(initial_backoff=1, jitter=0.5)
    assert jittery.backoff(1, rand=lambda: 0.0) == 0.5
    assert jittery.backoff(1, rand=lambda: 1.0) == 1.5
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_a_start_before_now() -> None:
    import time as _time

    from tidings.client.base import resolve_start

    before = int(_time.time() * 1000)
    got = resolve_start("-10m")
    assert isinstance(got, int) and before - 600_000 - 1000 <= got <= before - 600_000 + 1000
    assert resolve_start("earliest") is None and resolve_start("latest") == "latest"


@pytest.mark.parametrize("token", ["tok\r\nX-Forged: yes", "ab\ncd", "a\x00b", "a\x7fb", 12])
def test_a_token_that_would_break_its_header_line_is_refused(token: object) -> None:
    from tidings import AsyncClient, Client

    with pytest.raises(ValueError) as refused:
        bearer_token(token)  # type: ignore[arg-type]
    assert "X-Forged" not in str(refused.value)  # the message never shows the token
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1", token=token)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AsyncClient("http://127.0.0.1:1", token=token)  # type: ignore[arg-type]


def test_a_token_is_sent_without_the_space_around_it() -> None:
    assert bearer_token(" tok-1\r\n") == "tok-1"
    assert bearer_token(None) is None

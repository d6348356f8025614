"""The driver's scan of a topic's ids (tidings.spark.scan.scan) against a model: what
it finds for any page size, count bound, last id and publish-time bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidings.spark.offsets import poll_start
from tidings.spark.scan import Scan, scan
from tidings.structs import MessageId

pytestmark = pytest.mark.spark


class _Topic:
    """poll_ids over a sorted list of ids, as the server pages them."""

    def __init__(self, ids: list[MessageId]) -> None:
        self.ids = ids
        self.polls = 0

    def poll_ids(
        self, topic: str, start: Any, *, inclusive: bool, limit: int, transaction: Any
    ) -> list[MessageId]:
        self.polls += 1
        if start is None:
            rest = self.ids
        else:
            rest = [i for i in self.ids if i > start or (inclusive and i == start)]
        return rest[:limit]


def _model(
    ids: list[MessageId], max_messages: int | None, stop_after: MessageId | None, ts: int | None
) -> list[MessageId]:
    taken: list[MessageId] = []
    for mid in ids:
        if max_messages is not None and len(taken) >= max_messages:
            break
        if (stop_after is not None and mid > stop_after) or (
            ts is not None and mid.publish_ts >= ts
        ):
            break
        taken.append(mid)
    return taken


id_lists = st.lists(
    st.builds(MessageId, st.integers(1, 40), st.integers(0, 3), st.just(0), st.just(0)),
    max_size=60,
    unique=True,
).map(sorted)


@given(
    id_lists,
    st.integers(1, 15),
    st.none() | st.integers(0, 70),
    st.none() | st.integers(0, 59),
    st.none() | st.integers(0, 45),
    st.booleans(),
)
def test_a_scan_finds_what_the_model_takes(
    ids: list[MessageId],
    fetch_size: int,
    max_messages: int | None,
    after_index: int | None,
    before_ts: int | None,
    keep_ids: bool,
) -> None:
    stop_after = None if after_index is None or not ids else ids[after_index % len(ids)]
    topic = _Topic(ids)
    found = scan(
        topic,  # type: ignore[arg-type]
        "t",
        "earliest",
        None,
        fetch_size=fetch_size,
        max_messages=max_messages,
        stop_after=stop_after,
        stop_before_ts=before_ts,
        keep_ids=keep_ids,
    )
    taken = _model(ids, max_messages, stop_after, before_ts)
    expected = Scan(
        count=len(taken),
        first_ts=taken[0].publish_ts if taken else None,
        last=taken[-1] if taken else None,
        ids=taken if keep_ids else None,
    )
    assert found == expected
    assert poll_start("earliest") == (None, True)  # what the fake takes as the start

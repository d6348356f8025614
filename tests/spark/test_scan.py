"""The driver's scan of a topic's ids (tidings.spark.scan.scan) against a model: what
it finds for any page size, count bound, last id and publish-time bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidings.client.api import IdsPage
from tidings.spark.offsets import poll_start
from tidings.spark.scan import Scan, scan
from tidings.structs import MessageId, TopicEnd

pytestmark = pytest.mark.spark


class _Topic:
    """poll_ids over a sorted list of ids, as the server pages them: at most ``cap`` a
    page (the server's ``fetch_max_limit``), whatever the limit asked."""

    def __init__(self, ids: list[MessageId], cap: int | None = None) -> None:
        self.ids = ids
        self.cap = cap
        self.polls = 0

    def poll_ids(
        self, topic: str, start: Any, *, inclusive: bool, limit: int, transaction: Any
    ) -> list[MessageId]:
        self.polls += 1
        if start is None:
            rest = self.ids
        else:
            rest = [i for i in self.ids if i > start or (inclusive and i == start)]
        return rest[: limit if self.cap is None else min(limit, self.cap)]

    def end(self, topic: str) -> TopicEnd:
        return TopicEnd(self.ids[-1] if self.ids else None, None)

    # The scan sends its polls through the client's request layer, for the answer's
    # topic generation: here a "call" is its answer already.
    @property
    def _api(self) -> _Topic:
        return self

    def poll_ids_page(
        self, topic: str, start: Any, *, inclusive: bool, limit: int, transaction: Any
    ) -> IdsPage:
        return IdsPage(
            self.poll_ids(topic, start, inclusive=inclusive, limit=limit, transaction=transaction),
            None,
        )

    def _send(self, call: IdsPage) -> IdsPage:
        return call


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
    st.none() | st.integers(1, 15),
)
def test_a_scan_finds_what_the_model_takes(
    ids: list[MessageId],
    fetch_size: int,
    max_messages: int | None,
    after_index: int | None,
    before_ts: int | None,
    keep_ids: bool,
    cap: int | None,
) -> None:
    stop_after = None if after_index is None or not ids else ids[after_index % len(ids)]
    topic = _Topic(ids, cap)
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


class _Busy(_Topic):
    """A topic that gains a message before every poll, as a busy one does."""

    def poll_ids(
        self, topic: str, start: Any, *, inclusive: bool, limit: int, transaction: Any
    ) -> list[MessageId]:
        assert self.polls < 20, "the scan does not end"
        self.ids.append(MessageId(self.ids[-1].publish_ts + 1, 0, 0, 0))
        return super().poll_ids(
            topic, start, inclusive=inclusive, limit=limit, transaction=transaction
        )


def test_a_scan_of_a_busy_topic_ends_where_the_topic_ended_when_it_looked() -> None:
    # Pages come back short (a server capping them at 2, or just the end), and new
    # messages keep coming: the scan reads to where the topic ended at its first
    # short page, and stops there.
    topic = _Busy([MessageId(ts, 0, 0, 0) for ts in range(1, 6)], cap=2)
    found = scan(topic, "t", "earliest", None, fetch_size=10)  # type: ignore[arg-type]
    assert found.count == 6 and found.last == MessageId(6, 0, 0, 0)
    assert topic.polls == 3

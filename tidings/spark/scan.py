"""Reading topics through the client: finding where a range ends, and reading it.

The driver *scans* to fix the end of what a batch or micro-batch reads: a read-committed
poll stops before the first entry of a transaction still in progress, so the last
message it returns is *stable* -- every entry before it is either visible or skipped
(invalid or rolled back) in this snapshot, and stays so in every later snapshot: a
committed transaction stays committed, an invalid one stays skipped, and nothing is ever
inserted before a message once it is visible (invariants 1 and 3 of docs/design.md). So reading
``(start, end]`` again later -- on an executor, after a task retry, or when a restarted
query replays a batch -- yields exactly the same messages, with whatever newer snapshot.

Executors then read their :class:`TopicRange` with the snapshot planned for them.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql.datasource import InputPartition

from tidings.client import Client
from tidings.client._sync.concurrency import Pending, Worker
from tidings.client.api import Call, PollPage
from tidings.client.base import encoded_transaction
from tidings.codec.media import AVRO_EXT, COLUMNS
from tidings.errors import TidingsError
from tidings.spark.bodies import PollColumns, PollRows, read_column_body, read_poll_body
from tidings.spark.offsets import Slice, poll_start
from tidings.structs import MessageId, Transaction

__all__ = [
    "Scan",
    "TopicRange",
    "connect",
    "plan_ranges",
    "read_range_columns",
    "scan",
    "snapshot",
]


class _Server(Protocol):
    @property
    def url(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def request_timeout(self) -> float: ...
    @property
    def token(self) -> str | None: ...
    @property
    def cacert(self) -> str | None: ...


def connect(options: _Server) -> Client:
    """A client for one task or one driver-side object, as the options say."""
    verify: bool | str = True if options.cacert is None else options.cacert
    return Client(
        options.url,
        options.namespace,
        timeout=options.request_timeout,
        token=options.token,
        verify=verify,
    )


def snapshot(client: Client, committed: bool) -> Transaction | None:
    """A fresh read-only snapshot for read-committed reads; None for read-uncommitted."""
    return client.snapshot() if committed else None


@dataclass(slots=True)
class Scan:
    """What a scan found: how many messages, the first one's publish time, the last id
    (and with ``keep_ids`` every id, to cut the range at any count)."""

    count: int = 0
    first_ts: int | None = None
    last: MessageId | None = None
    ids: list[MessageId] | None = None
    #: The generation of the topic the scan's last page was read from (generations only
    #: grow: the same as the one its ids were taken in means all of them were), or
    #: None (no page read, or a server that does not say).
    generation: int | None = None


def scan(
    client: Client,
    topic: str,
    position: str,
    transaction: Transaction | None,
    *,
    fetch_size: int,
    max_messages: int | None = None,
    stop_after: MessageId | None = None,
    stop_before_ts: int | None = None,
    keep_ids: bool = False,
) -> Scan:
    """Read ``topic`` from ``position`` to its stable end (or to a bound) page by page,
    keeping only ids: at most ``max_messages``, none after ``stop_after``, none
    published at or after ``stop_before_ts``.

    An empty page ends the scan: the topic's end, or (read-committed) an entry still in
    progress. A short page need not: a server whose ``fetch_max_limit`` is below
    ``fetch_size`` answers every page short. So at the first short page the scan asks
    where the topic ends now and reads on to there, no further (a busy topic's new
    messages cannot keep it going). Any prefix the server returns is stable.
    """
    found = Scan(ids=[] if keep_ids else None)
    start, inclusive = poll_start(position)
    asked_end = False
    snapshot = encoded_transaction(transaction)
    while True:
        want = fetch_size if max_messages is None else min(fetch_size, max_messages - found.count)
        # Ids only: the driver keeps nothing else, so the payloads stay on the server.
        answer = client._send(
            client._api.poll_ids_page(
                topic, start, inclusive=inclusive, limit=want, transaction=snapshot
            )
        )
        page, found.generation = answer.ids, answer.generation
        # The page is in id order (and so in publish-time order): its part within the
        # bounds is a prefix, found by bisection rather than a test per id (a
        # micro-batch's scan is tens of thousands of ids, on the driver).
        cut = len(page)
        if stop_after is not None:
            cut = bisect.bisect_right(page, stop_after, hi=cut)
        if stop_before_ts is not None:
            cut = bisect.bisect_left(page, stop_before_ts, hi=cut, key=_publish_ts)
        if cut:
            if found.first_ts is None:
                found.first_ts = page[0].publish_ts
            found.count += cut
            found.last = page[cut - 1]
            if found.ids is not None:
                found.ids += page[:cut]
        if cut < len(page) or not page:
            return found
        if max_messages is not None and found.count >= max_messages:
            return found
        if stop_after is not None and page[-1] >= stop_after:
            return found
        if len(page) < want and not asked_end:
            asked_end = True
            newest = client.end(topic).newest_id
            if newest is None or page[-1] >= newest:
                return found
            stop_after = newest if stop_after is None else min(stop_after, newest)
        start, inclusive = page[-1], False


def _publish_ts(mid: MessageId) -> int:
    return mid.publish_ts


@dataclass
class TopicRange(InputPartition):
    """One task's share of a topic: from ``start`` (a position) through message ``end``,
    within the publish-time slice ``[lo, hi)``, read with ``snapshot``."""

    topic: str
    start: str
    end: str
    lo: int | None = None
    hi: int | None = None
    snapshot: Transaction | None = None
    #: The topic's generation the range was planned in (streaming reads; None: not
    #: checked): a task that finds another one once it has read is failed by the
    #: topic's deletion, or reads nothing (``failOnDataLoss=false``).
    generation: int | None = None


def plan_ranges(
    topic: str,
    start: str,
    end: MessageId,
    cuts: list[Slice],
    snapshot: Transaction | None,
) -> list[TopicRange]:
    """The tasks reading ``(start, end]`` of ``topic``, one per time slice."""
    return [
        TopicRange(
            topic=topic,
            start=start if piece.lo is None else f"time:{piece.lo}",
            end=end.hex,
            lo=piece.lo,
            hi=piece.hi,
            snapshot=snapshot,
        )
        for piece in cuts
    ]


def _columns(page: PollPage) -> PollRows:
    # The columnar body's offsets become Arrow's as they are, which needs a
    # little-endian process; a big-endian one takes the client's decoder below.
    if page.media is COLUMNS and sys.byteorder == "little":
        return read_column_body(page.body)
    if page.media is AVRO_EXT:
        return read_poll_body(page.body or b"\x00")
    # Any other answer (a server that chose another medium) through the client's decoder.
    messages = page.messages()
    offsets = [0]
    names: list[str] = []
    values: list[bytes] = []
    for m in messages:
        names.extend(m.headers)
        values.extend(m.headers.values())
        offsets.append(len(names))
    return PollColumns(
        [m.id.to_bytes() for m in messages],
        [m.payload for m in messages],
        [m.key for m in messages],
        offsets,
        names,
        values,
    )


def read_range_columns(
    client: Client,
    part: TopicRange,
    fetch_size: int,
    accept: Callable[[int | None], bool] | None = None,
) -> Iterator[tuple[PollRows, int]]:
    """The messages of one range as pages of columns, with how many leading rows of
    each belong to the range. The next page is asked for as soon as the answer's
    headers say where this one ends, so the server prepares it while this one is
    decoded and handed to Spark.

    ``accept`` is given each page's topic generation (None where the server does not
    say) before its rows are used, the empty last page's too; False ends the read
    there."""
    end = MessageId.from_hex(part.end)
    hi = part.hi

    snapshot = encoded_transaction(part.snapshot)

    def fetch(start: MessageId | int | None, inclusive: bool) -> Call[PollPage]:
        return client._api.poll_page(
            part.topic,
            start,
            inclusive=inclusive,
            limit=fetch_size,
            transaction=snapshot,
            wait=None,
            isolation=None,
        )

    def more_after(page: PollPage) -> bool:
        last = page.last_id
        return last is not None and last < end and (hi is None or last.publish_ts < hi)

    # The poll sent ahead is read on this thread once Spark asks for the next page
    # (the client's default transport; a thread with any other).
    ahead = Worker("tidings-poll")
    following: Pending[PollPage] | None = None
    try:
        start, inclusive = poll_start(part.start)
        page = client._send(fetch(start, inclusive))
        while True:
            if more_after(page):
                assert page.last_id is not None
                resume = page.last_id
                following = client._begin(ahead, fetch(resume, False))
            if accept is not None and not accept(page.generation):
                return
            columns = _columns(page)
            if not len(columns):
                return  # the rest of the range expired (retention) before it was read
            kept = columns.cut(end, hi)
            if kept:
                yield columns, kept
            if kept < len(columns) or columns.ids[-1] >= end.to_bytes():
                return
            if following is None:  # the answer did not say where it ends
                page = client._send(fetch(MessageId.from_bytes(columns.ids[-1]), False))
            else:
                try:
                    page = following.result()
                except TidingsError:  # sent once: asked again, with the client's retries
                    page = client._send(fetch(resume, False))
                following = None
    finally:
        if following is not None:
            following.cancel()
        ahead.close()

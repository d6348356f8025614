"""``spark.readStream.format("tidings")``: micro-batches that replay identically.

Offsets are ``{topic: position}`` (:mod:`tidings.spark.offsets`). Each micro-batch ends,
per topic, at the last message a fresh read-committed poll returns (the last message
for read-uncommitted): nothing before it can change any more, so the batch
``(start, end]`` reads the same messages whenever it is read again, and a query
restarted from its checkpoint continues exactly where it stopped
(:mod:`tidings.spark.scan` has the argument).

A topic deleted (and perhaps created again) under the query is noticed by its
generation, which every offset records: each poll of a scan answers the generation
of the topic it read, which is compared with the recorded one, so a topic created
again is noticed even empty (it has no new message to be noticed by) without a request
of its own. Only where no poll said it (a scan that failed or was not needed, or a
server that does not send it) is the generation asked: at once for a topic gone or
with new messages, and at most every ``generationCheckInterval`` seconds for one with
nothing new (:data:`QUIET_CHECK_INTERVAL` by default). By default (Kafka's
``failOnDataLoss=true``) the query then fails naming the topic: the new topic's
messages would otherwise be read as if they followed the old one's, and the old one's
unread messages be lost without a word. With ``failOnDataLoss=false`` the new topic is
read from its start (and a topic that is gone is left until it is back).

Admission control: ``maxMessagesPerTrigger`` is the default read limit
(:class:`ReadMaxRows`); a batch takes at most that many messages, shared between topics
in proportion to what each has waiting. ``Trigger.AvailableNow`` reads up to the stable
end found when the query starts, in batches of that limit, then stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from tidings.client import Client
from tidings.errors import TopicNotFound
from tidings.spark.offsets import (
    EARLIEST,
    allocate,
    decode_generations,
    decode_offset,
    encode_offset,
    position_after,
    position_floor_ts,
    position_reaches,
    slices,
)
from tidings.spark.options import DEFAULT_GENERATION_CHECK_INTERVAL, ReadOptions
from tidings.spark.reader import (
    data_loss_message,
    read_partition,
    slices_per_topic,
    start_position,
)
from tidings.spark.scan import Scan, connect, plan_ranges, scan, snapshot
from tidings.structs import MessageId

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = ["QUIET_CHECK_INTERVAL", "TidingsStreamReader"]

#: Default seconds between requests for the generation of a topic that has nothing
#: new, where no poll of the scan said it (option ``generationCheckInterval``). One
#: created again but left empty has no new message to be noticed by, so it is asked
#: after, but not at every trigger: an idle query polls every few milliseconds, and
#: one request per topic more each time would add half to what an idle query costs
#: the server.
QUIET_CHECK_INTERVAL = DEFAULT_GENERATION_CHECK_INTERVAL


def _is_id(position: str) -> bool:
    return len(position) == 40 and ":" not in position and position != EARLIEST


class TidingsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in one Python process on the driver for the whole query run; its
    ``read`` runs on executors from a pickled copy (without the client)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: Client | None = None
        self._available_now = False
        self._target: dict[str, str] | None = None
        # The next batch's end, looked for while Spark runs this one (_look_ahead).
        self._ahead: _Ahead | None = None
        # When each topic with nothing new last had its generation checked (monotonic).
        self._quiet_checked: dict[str, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_ahead"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def client(self) -> Client:
        if self._client is None:
            o = self.options
            self._client = connect(o)
        return self._client

    # --- offsets ---

    def _initial(self, topic: str) -> str:
        start = self.options.starts[topic]
        if start.kind != "latest":
            return start_position(start)
        # Read-committed from the last stable position, if a transaction is open:
        # a transaction that commits later is read, not skipped. Read-uncommitted
        # already sees the open transactions' entries, so it starts after the newest.
        end = self.client.end(topic)
        if self.options.committed and end.last_stable_id is not None:
            return position_after(end.last_stable_id.previous())
        return EARLIEST if end.newest_id is None else position_after(end.newest_id)

    def _positions(
        self, offset: dict[str, Any]
    ) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
        """The checkpointed positions of the topics read, the starts of topics the
        checkpoint does not know yet (added to the ``topic`` option since), and the
        generations of both."""
        known = decode_offset(offset)
        generations = decode_generations(offset)
        topics = self.options.topics
        added: dict[str, str] = {}
        for topic in topics:
            if topic not in known:
                added[topic], generations[topic] = self._start(topic)
        positions = {t: known[t] for t in topics if t in known}
        return positions, added, {t: g for t, g in generations.items() if t in topics}

    def _start(self, topic: str) -> tuple[str, int]:
        """Where reading ``topic`` starts, and its generation, asked first: a topic
        created again in between then fails the check later rather than pass it."""
        generation = self.client.get_topic(topic).generation
        # A start taken from a checkpointed offset is of the generation it records: a
        # topic created again since is then noticed at the first batch.
        return self._initial(topic), self.options.generations.get(topic, generation)

    def _generation(self, topic: str) -> int | None:
        """``topic``'s generation now; None while there is no such topic."""
        try:
            return self.client.get_topic(topic).generation
        except TopicNotFound:
            return None

    def initialOffset(self) -> dict[str, Any]:
        starts = {t: self._start(t) for t in self.options.topics}
        return encode_offset(
            {t: p for t, (p, _) in starts.items()}, {t: g for t, (_, g) in starts.items()}
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        # The target is fixed at the first latestOffset, which knows where to start.
        self._available_now = True
        self._target = None

    def _stable_ends(self, positions: dict[str, str]) -> dict[str, str]:
        """Per topic, the position after its last stable message now: the
        Trigger.AvailableNow target. The server seeks each topic's end; only when it
        cannot tell the last stable position (no transaction service in its process),
        or the position is past it, is a read-committed topic scanned to its end."""
        ends: dict[str, str] = {}
        for topic, position in positions.items():
            try:
                end = self.client.end(topic)
            except TopicNotFound:
                if self.options.fail_on_data_loss:
                    raise
                ends[topic] = position  # gone: nothing to read until it is back
                continue
            stop = end.last_stable_id if self.options.committed else None
            if (self.options.committed and not end.stable_known) or (
                # Past the oldest open transaction's first entry the read stops at the
                # first open entry after its position, which only a scan finds.
                stop is not None and not position_reaches(position, stop)
            ):
                found = self._scan_all({topic: position}, None)[topic]
                ends[topic] = position if found.last is None else position_after(found.last)
            elif stop is not None:
                # Up to the first entry of the oldest open transaction, as a
                # read-committed poll stops there.
                ends[topic] = position_after(stop.previous())
            else:
                ends[topic] = position if end.newest_id is None else position_after(end.newest_id)
        return ends

    def _scan_all(
        self, positions: dict[str, str], max_rows: int | None, client: Client | None = None
    ) -> dict[str, Scan]:
        """Per topic, what is stable after its position (at most ``max_rows``, never
        past the Trigger.AvailableNow target), with one fresh snapshot for all."""
        o = self.options
        client = self.client if client is None else client
        tx = snapshot(client, o.committed)
        found: dict[str, Scan] = {}
        for topic, position in positions.items():
            stop = None
            if self._target is not None and topic in self._target:
                target = self._target[topic]
                if target == position or not _is_id(target):
                    found[topic] = Scan(ids=[])
                    continue
                stop = MessageId.from_hex(target)
            found[topic] = scan(
                client,
                topic,
                position,
                tx,
                fetch_size=o.fetch_size,
                max_messages=max_rows,
                stop_after=stop,
                keep_ids=max_rows is not None,
            )
        return found

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        positions, added, generations = self._positions(start)
        if added:
            # A batch that only records where added topics start: their first range is
            # then planned from a checkpointed position, so it replays identically.
            return encode_offset({**positions, **added}, generations)
        for topic in positions:
            if topic not in generations:  # checkpointed before generations were
                current = self._generation(topic)
                if current is not None:
                    generations[topic] = current
        if self._available_now and self._target is None:
            self._target = self._stable_ends(positions)
        if isinstance(limit, ReadMaxRows):
            budget: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable | ReadMinRows):
            budget = None
        else:
            raise ValueError(f"the tidings source does not support read limit {limit!r}")
        found = self._scans_ahead(positions, budget)
        if found is not None and not self._check_generations(positions, generations, found, set()):
            found = None  # looked for from positions that no longer apply
        if found is None:
            found = self._scan_checked(positions, generations, budget)
        if isinstance(limit, ReadMinRows) and sum(s.count for s in found.values()) < limit.min_rows:
            return encode_offset(positions, generations)
        new = dict(positions)
        if budget is None:
            for topic, s in found.items():
                if s.last is not None:
                    new[topic] = position_after(s.last)
        else:
            shares = allocate({t: s.count for t, s in found.items()}, budget)
            for topic, n in shares.items():
                ids = found[topic].ids
                if n > 0 and ids:
                    new[topic] = position_after(ids[n - 1])
            if new != positions:
                self._look_ahead(new, budget)
        return encode_offset(new, generations)

    # --- topics deleted or created again under the query ---

    def _scan_checked(
        self, positions: dict[str, str], generations: dict[str, int], budget: int | None
    ) -> dict[str, Scan]:
        """:meth:`_scan_all` of the topics, checking that none was deleted or created
        again (where a topic is gone or has new messages: an unchanged topic costs no
        more requests). Updates ``positions`` and ``generations`` where the new topic is
        read from its start (``failOnDataLoss=false``)."""
        gone: set[str] = set()
        for _ in range(3):
            readable = {t: p for t, p in positions.items() if t not in gone}
            try:
                found: dict[str, Scan] | None = self._scan_all(readable, budget)
            except TopicNotFound:
                found = None  # which topic, and whether it is back, the check tells
            if self._check_generations(positions, generations, found, gone) and found is not None:
                return {**found, **{t: Scan(ids=[]) for t in gone}}
        return self._scan_all(positions, budget)  # still failing: that error, then

    def _check_generations(
        self,
        positions: dict[str, str],
        generations: dict[str, int],
        found: dict[str, Scan] | None,
        gone: set[str],
    ) -> bool:
        """True if no topic changed generation: as its scan's polls said it, or else,
        asked, a topic that ``found`` has news of (every topic, where the scan failed:
        ``found`` None) or one with nothing new whose turn it is
        (``generationCheckInterval``). Otherwise fails naming the topic
        (``failOnDataLoss``), or sets the new topic's start and generation, adds a topic
        that is gone to ``gone``, and returns False."""
        same = True
        now = time.monotonic()
        interval = self.options.generation_check_interval
        for topic in list(positions):
            if topic in gone:
                continue
            told = None if found is None or topic not in found else found[topic].generation
            if told is not None:
                # Read with the scan's own last page: the ids it found are of this
                # generation (generations only grow), and a topic created again, even
                # empty, is noticed at the first scan after, at no cost.
                current: int | None = told
                self._quiet_checked[topic] = now
            elif found is not None and (topic not in found or found[topic].last is None):
                # Nothing new, so nothing read from a topic that may have changed; but a
                # topic created again and left empty has no new message to be noticed
                # by, and the query would go on as if nothing had happened.
                checked = self._quiet_checked.get(topic)
                if checked is not None and now - checked < interval:
                    continue
                self._quiet_checked[topic] = now
                current = self._generation(topic)
            else:
                current = self._generation(topic)
            recorded = generations.get(topic)
            if current is not None and (recorded is None or current == recorded):
                continue
            if self.options.fail_on_data_loss:
                raise TopicNotFound(
                    data_loss_message(self.options.namespace, topic, recorded, current)
                )
            same = False
            if current is None:
                gone.add(topic)
            else:
                positions[topic] = EARLIEST
                generations[topic] = current
        return same

    # --- the next batch's end, found while this one runs ---

    def _look_ahead(self, positions: dict[str, str], budget: int) -> None:
        """Start scanning for the batch after the one ending at ``positions``: Spark
        asks for its end only once this batch is done, and the scan (a page of ids per
        10,000 messages) would hold up every batch."""
        if self._ahead is None:
            self._ahead = _Ahead(connect(self.options))
        self._ahead.start(positions, budget, self._scan_all)

    def _scans_ahead(self, positions: dict[str, str], budget: int | None) -> dict[str, Scan] | None:
        """The scans looked for ahead from ``positions``, if they still answer: with a
        full budget (a short one may have missed what came since), or anything up to
        the Trigger.AvailableNow target (fixed when the query started)."""
        if self._ahead is None or budget is None:
            return None
        found = self._ahead.take(positions, budget)
        if found is None:
            return None
        if self._target is None and sum(s.count for s in found.values()) < budget:
            return None
        return found

    def reportLatestOffset(self) -> dict[str, str] | None:
        return None

    # --- planning and reading ---

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        o = self.options
        first = decode_offset(start)
        last = decode_offset(end)
        born, grown = decode_generations(start), decode_generations(end)
        pieces = slices_per_topic(o, 1)
        tx = None
        parts: list[InputPartition] = []
        for topic in o.topics:
            begin, stop = first.get(topic), last.get(topic)
            if topic in born and topic in grown and born[topic] != grown[topic]:
                begin = EARLIEST  # created again: the new topic is read from its start
            if begin is None or stop is None or begin == stop:
                continue
            if not _is_id(stop):
                continue  # nothing was read from this topic yet
            if tx is None:
                tx = snapshot(self.client, o.committed)
            end_id = MessageId.from_hex(stop)
            floor = position_floor_ts(begin)
            if floor is None and pieces > 1:
                try:
                    head = self.client.poll(topic, None, limit=1)
                except TopicNotFound:
                    if self.options.fail_on_data_loss:
                        raise
                    head = []  # gone: the tasks find nothing to read either
                floor = head[0].id.publish_ts if head else None
            cuts = slices(floor, end_id.publish_ts, pieces)
            for part in plan_ranges(topic, begin, end_id, cuts, tx):
                part.generation = grown.get(topic)
                parts.append(part)
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        return None

    def stop(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        if self._client is not None:
            self._client.close()
            self._client = None


class _Ahead:
    """One scan at a time on a thread of its own, with a client of its own."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tidings-ahead")
        self._key: tuple[dict[str, str], int] | None = None
        self._future: Future[dict[str, Scan]] | None = None

    def start(
        self,
        positions: dict[str, str],
        budget: int,
        scan_all: Callable[[dict[str, str], int | None, Client], dict[str, Scan]],
    ) -> None:
        self.cancel()
        self._key = (dict(positions), budget)
        self._future = self._pool.submit(scan_all, dict(positions), budget, self._client)

    def take(self, positions: dict[str, str], budget: int) -> dict[str, Scan] | None:
        """The scans started from exactly ``positions`` with ``budget``, or None (none
        started, or it failed: the caller scans again and meets the error itself)."""
        future, key = self._future, self._key
        self._future = self._key = None
        if future is None or key != (positions, budget):
            if future is not None:
                future.cancel()
            return None
        try:
            return future.result()
        except Exception:
            return None

    def cancel(self) -> None:
        if self._future is not None:
            self._future.cancel()
        self._future = self._key = None

    def close(self) -> None:
        self.cancel()
        self._pool.shutdown(wait=True)
        self._client.close()

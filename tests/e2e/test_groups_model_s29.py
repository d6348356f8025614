"""A model-based test of consumer groups: random runs of publishes, joins, polls, commits
(plain, or in transactions that commit or abort), leaves, resets and deletes, through the
real server and the real sync client, checked against a model of what the group has
committed and what each member was delivered (docs/client.md, "Consumer groups";
docs/api.md, "Consumer groups")."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_groups_regressions_s29 import settle_read_ahead
from tidings import Client
from tidings.client._sync.group_consumer import GroupConsumer
from tidings.client.base import DEFAULT_MEDIA
from tidings.codec.groups import partition_of
from tidings.codec.media import Media
from tidings.errors import PartitionFenced, TidingsError, TransactionNotInProgress
from tidings.structs import GroupAssignment, Message, MessageId, Record

pytestmark = pytest.mark.e2e

PARTITIONS = 4
GROUP = "g"
#: Before every message: the position a reset to "earliest" writes.
ZERO = MessageId(0, 0, 0, 0)


class _Abort(Exception):
    """Raised in a transaction's block to abort it."""


def join_as(client: Client, consumer: GroupConsumer, member_id: str) -> GroupAssignment:
    """Join with a chosen member id (as a member rejoining under its id does): the sticky
    assignment orders members by id, so random ids would make each run differ."""
    call = client._api.group_join(
        consumer.topic, consumer.group, member_id, 300_000, PARTITIONS, consumer._start
    )
    consumer._assignment = client._send(call)
    return consumer.heartbeat()


@dataclass
class MemberModel:
    """What the machine knows of one live member."""

    consumer: GroupConsumer
    member_id: str
    #: The last message returned per partition and not committed (the client's own
    #: bookkeeping for ``commit()``, as the docs describe it).
    returned: dict[int, MessageId] = field(default_factory=dict)
    #: The last message returned per partition, committed or not.
    last: dict[int, MessageId] = field(default_factory=dict)
    #: Partitions whose delivery may start over (from the committed position): newly
    #: assigned, or after a rewind.
    restart: set[int] = field(default_factory=set)
    #: Where that delivery starts over, as it was when the member got the partition or
    #: was rewound (a page of an older generation, read ahead before the partition
    #: moved on, starts there, not where its next owner starts).
    floors: dict[int, MessageId | None] = field(default_factory=dict)
    #: The newest generation the client reported.
    generation: int = 0


class GroupsMachine(RuleBasedStateMachine):
    """One group of ``PARTITIONS`` on a fresh topic per run. Checked after each step:
    a partition has one owner per generation and the owners' counts are even; a
    message goes to one member per generation, of a partition it owns; each member gets
    each partition's messages in order, without gaps, starting over only after the
    partition came to it or it was rewound, and then right after the committed position
    (or where it started the partition); a plain commit, or a transaction's that
    commits, moves the positions to what was returned; an aborted or fenced one moves
    nothing and shows no output; describe's positions, owners and lags (and the topic
    stats' group lag) are the model's."""

    url: ClassVar[str] = ""
    #: The medium of the client's bodies (a transaction's one request among them).
    media: ClassVar[Media] = DEFAULT_MEDIA

    def __init__(self) -> None:
        super().__init__()
        self.client = Client(self.url, media=self.media)
        self.topic = "gm-" + uuid.uuid4().hex[:12]
        self.out = self.topic + "-out"
        self.client.create_topic(self.topic)
        self.client.create_topic(self.out)
        self.start = "earliest"
        #: Every message of the topic, in order, and its partition.
        self.messages: list[Message] = []
        self.parts: dict[MessageId, int] = {}
        #: The group's committed positions, as the model has them.
        self.committed: dict[int, MessageId] = {}
        self.group_exists = False
        self.members: dict[str, MemberModel] = {}
        #: The current assignment on the server (partition -> member).
        self.owner: dict[int, str] = {}
        self.generation = 0
        #: Where a partition without a committed position starts, for a group starting
        #: at "latest": the topic's end when its owner got it (None: the beginning).
        self.origin: dict[int, MessageId | None] = {}
        #: The generation since which each partition's owner has held it.
        self.since: dict[int, int] = {}
        #: (generation, partition) -> owner, as seen by anyone.
        self.gen_owner: dict[tuple[int, int], str] = {}
        #: (generation, message) -> the member it was returned to.
        self.delivered: dict[tuple[int, MessageId], str] = {}
        #: Payloads of the output topic that must be visible.
        self.outputs: list[bytes] = []
        self.seq = 0
        self.joined = 0

    def teardown(self) -> None:
        for m in self.members.values():
            with contextlib.suppress(TidingsError):
                m.consumer.close()
        try:
            self.client.delete_topic(self.topic)
            self.client.delete_topic(self.out)
        finally:
            self.client.close()

    # --- helpers -------------------------------------------------------------------------

    def of(self, p: int) -> list[Message]:
        return [m for m in self.messages if self.parts[m.id] == p]

    def floor(self, p: int) -> MessageId | None:
        """Where delivery of ``p`` starts over: after its committed position, else where
        the group starts."""
        if p in self.committed:
            return self.committed[p]
        if self.start == "latest":
            return self.origin.get(p)
        return None

    def after(self, p: int, floor: MessageId | None) -> list[Message]:
        return [m for m in self.of(p) if floor is None or m.id > floor]

    def end_id(self) -> MessageId | None:
        return self.messages[-1].id if self.messages else None

    def sync(self) -> set[int]:
        """Read the server's assignment after a membership change; mark what moved.
        Answers the partitions whose owner changed."""
        info = self.client.describe_group(self.topic, GROUP)
        assert info.generation >= self.generation
        owner = {p.partition: p.owner for p in info.partitions if p.owner is not None}
        assert set(info.members) == set(self.members), (info.members, list(self.members))
        if self.members:
            assert sorted(owner) == list(range(PARTITIONS))
            counts = sorted(len(ps) for ps in info.members.values())
            assert counts[-1] - counts[0] <= 1, info.members  # evened out
        moved = {p for p in range(PARTITIONS) if owner.get(p) != self.owner.get(p)}
        for p in moved:
            new = owner.get(p)
            self.since.pop(p, None)
            if new is not None:
                self.since[p] = info.generation
                self.members[new].restart.add(p)
                if p not in self.committed:
                    self.origin[p] = self.end_id()
                self.members[new].floors[p] = self.floor(p)
        for p, m in owner.items():
            self.note_owner(info.generation, p, m)
        self.owner = {p: m for p, m in owner.items() if m is not None}  # type: ignore[misc]
        self.generation = info.generation
        return moved

    def tell_all(self) -> None:
        for m in self.members.values():
            m.consumer.heartbeat()
            self.observe(m)

    def note_owner(self, generation: int, p: int, member_id: str | None) -> None:
        if member_id is None:
            return
        seen = self.gen_owner.setdefault((generation, p), member_id)
        assert seen == member_id, f"partition {p} has two owners in generation {generation}"

    def observe(self, m: MemberModel) -> None:
        """The client's view of its assignment after a call."""
        a = m.consumer.assignment
        if a is None:
            return
        assert a.generation >= m.generation, (
            f"member {m.member_id} went back from generation {m.generation} to {a.generation}"
        )
        if a.generation != m.generation:
            # The client forgets what it returned of partitions it no longer owns, and of
            # those that moved away and came back since it last heard.
            m.returned = {
                p: i
                for p, i in m.returned.items()
                if p in a.partitions and self.since.get(p, 0) <= m.generation
            }
        m.generation = a.generation
        for p in a.partitions:
            self.note_owner(a.generation, p, m.member_id)

    def advance(self, positions: dict[int, MessageId]) -> None:
        """A commit that went through: a position never moves back (only a reset moves
        it anywhere), since a member commits only what it was delivered after it."""
        for p, position in positions.items():
            old = self.committed.get(p)
            assert old is None or position >= old, f"partition {p} went back to {position}"
        self.committed.update(positions)

    def rewound(self, m: MemberModel) -> None:
        m.returned.clear()
        mine = {p for p, o in self.owner.items() if o == m.member_id}
        m.restart |= mine
        m.floors.update({p: self.floor(p) for p in mine})

    def outputs_visible(self) -> list[bytes]:
        got = self.client.poll(self.out, limit=10_000, transaction=self.client.snapshot())
        return [x.payload for x in got]

    def check_unchanged(self) -> None:
        self.check_describe()
        assert self.outputs_visible() == self.outputs

    # --- rules -----------------------------------------------------------------------------

    @initialize(start=st.sampled_from(["earliest", "latest"]))
    def choose_start(self, start: str) -> None:
        self.start = start

    @rule(n=st.integers(1, 8), keys=st.sampled_from([0, 1, 3, 8]))
    def publish(self, n: int, keys: int) -> None:
        self.seq += 1
        records = [
            Record(b"m%d-%d" % (self.seq, i), None if not keys else b"k%d" % (i % keys))
            for i in range(n)
        ]
        self.client.publish(self.topic, records)
        self.messages = self.client.poll(self.topic, limit=10_000)
        self.parts = {m.id: partition_of(m, PARTITIONS) for m in self.messages}

    @precondition(lambda self: len(self.members) < 3)
    @rule(batch=st.sampled_from([2, 100]), quiet=st.booleans())
    def add_member(self, batch: int, quiet: bool = False) -> None:
        # Told or not, before and after: a quiet join leaves the members to find out (a
        # fenced commit, a poll), maybe after more moves, away and back.
        if not quiet:
            self.tell_all()
        consumer = self.client.consume(
            self.topic, self.start, group=GROUP, follow=False, batch_size=batch,
            session_timeout=300.0, partitions=PARTITIONS,
        )  # fmt: skip
        self.joined += 1
        assignment = join_as(self.client, consumer, f"m{self.joined:03d}")
        m = MemberModel(consumer, assignment.member_id)
        self.members[m.member_id] = m
        created = not self.group_exists
        self.group_exists = True
        if created:
            self.owner = {}
        self.sync()
        self.observe(m)
        if not quiet:
            self.tell_all()

    def _member(self, data: st.DataObject) -> MemberModel:
        # By join order: member ids differ from run to run, the order does not.
        name = data.draw(st.sampled_from(list(self.members)))
        return self.members[name]

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        m = self._member(data)
        page = m.consumer.poll()
        settle_read_ahead(m.consumer)
        self.observe(m)
        self.check_page(m, page)

    def check_page(self, m: MemberModel, page: list[Message]) -> None:
        a = m.consumer.assignment
        assert a is not None
        for msg in page:
            p = self.parts[msg.id]
            assert p in a.partitions, f"{msg.id} of partition {p} not in {a}"
            who = self.delivered.setdefault((a.generation, msg.id), m.member_id)
            assert who == m.member_id, f"{msg.id} went to two members in generation {a.generation}"
            prev = m.last.get(p)
            # Starting over (from the committed position, or where the member started
            # the partition), or going on right after the last message it got.
            restart = p in m.restart or prev is None
            nxt = self.after(p, m.floors.get(p, self.floor(p)) if restart else prev)
            assert nxt and msg.id == nxt[0].id, (
                f"member {m.member_id} got {msg.id} of partition {p}; expected "
                f"{nxt[0].id if nxt else None} (last {prev}, restart {p in m.restart}, "
                f"floor {self.floor(p)})"
            )
            m.restart.discard(p)
            m.last[p] = msg.id
            m.returned[p] = msg.id

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def drain(self, data: st.DataObject) -> None:
        m = self._member(data)
        for _ in range(30):
            page = m.consumer.poll()
            settle_read_ahead(m.consumer)
            self.observe(m)
            self.check_page(m, page)
            if not page:
                break
        else:
            raise AssertionError("a member never caught up")
        for p, o in self.owner.items():
            if o != m.member_id:
                continue
            rest = self.after(p, self.floor(p))
            if rest and p in m.restart:
                raise AssertionError(f"partition {p} was not delivered again: {rest}")
            if rest:
                assert m.last.get(p) == self.of(p)[-1].id, f"partition {p} not caught up"

    def _fenced(self, m: MemberModel) -> bool:
        # Not its partition any more, or its again since a generation it did not hear of.
        return any(
            self.owner.get(p) != m.member_id or self.since.get(p, 0) > m.generation
            for p in m.returned
        )

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        m = self._member(data)
        if self._fenced(m):
            with pytest.raises(PartitionFenced):
                m.consumer.commit()
            self.observe(m)  # it learned its assignment
            self.check_unchanged()
            return
        m.consumer.commit()
        self.advance(m.returned)
        m.returned.clear()

    @precondition(lambda self: self.members)
    @rule(data=st.data(), outcome=st.sampled_from(["commit", "abort"]), defer=st.booleans())
    def commit_in_transaction(self, data: st.DataObject, outcome: str, defer: bool) -> None:
        m = self._member(data)
        self.seq += 1
        marker = b"out%d" % self.seq
        fenced = self._fenced(m) and bool(m.returned)
        try:
            with self.client.transaction(defer_begin=defer) as tx:
                tx.publish(self.out, [marker])
                m.consumer.commit(transaction=tx)
                if outcome == "abort":
                    raise _Abort
        except _Abort:
            assert outcome == "abort"
            self.rewound(m)
        except PartitionFenced:
            assert fenced, "a commit of partitions the member owns was fenced"
            self.rewound(m)
        else:
            assert not fenced, "a fenced member's transaction committed"
            assert outcome == "commit"
            self.advance(m.returned)
            m.returned.clear()
            self.outputs.append(marker)
        self.check_unchanged()

    @precondition(lambda self: self.members and len(self.members) < 3)
    @rule(data=st.data(), batch=st.sampled_from([2, 100]))
    def zombie_transaction(self, data: st.DataObject, batch: int) -> None:
        """A member's positions wait in an open transaction while a join moves
        partitions: if one of them moved, the transaction cannot commit."""
        m = self._member(data)
        if not m.returned or self._fenced(m):
            # The join all the same: how many members there are decides what is drawn
            # next, and which messages a member holds depends on the ids of keyless
            # ones (their partitions), which differ from run to run.
            self.add_member(batch)
            return
        self.seq += 1
        marker = b"zombie%d" % self.seq
        held = dict(m.returned)
        moved: set[int] = set()
        try:
            with self.client.transaction(defer_begin=False) as tx:
                tx.publish(self.out, [marker])
                m.consumer.commit(transaction=tx)
                self.add_member(batch)
                moved = {p for p in held if self.owner.get(p) != m.member_id}
        except TransactionNotInProgress:
            assert moved, "a transaction whose partitions stayed put was fenced"
            # The abort rewinds the member as any abort does.
            self.rewound(m)
        else:
            assert not moved, f"a zombie's transaction committed (moved {moved})"
            self.advance(held)
            m.returned.clear()
            self.outputs.append(marker)
        self.check_unchanged()

    @precondition(lambda self: self.members and len(self.members) < 3)
    @rule(
        data=st.data(),
        batch=st.sampled_from([2, 100]),
        tell=st.booleans(),
        then=st.sampled_from(["wait", "commit", "transaction"]),
    )
    def away_and_back(self, data: st.DataObject, batch: int, tell: bool, then: str) -> None:
        """A member joins and leaves while the others hear nothing: the partitions it
        took go back to the members they came from (the sticky assignment gives them to
        whoever has fewest), held since a generation those did not hear of, and what
        they were returned of them before cannot commit. With ``tell`` the server tells
        them (an answer their application has not seen yet, as a poll's from another
        thread): their commits are fenced all the same, by the generation they name.
        ``then``: a member commits at once (random runs seldom get a commit in before
        the member hears of the move otherwise), or the run goes on. Members are first
        returned a message of every partition they own, where they hold no position of
        one (so the member whose partition moves holds one of it), and the commit is
        one of such a member's, where there is one."""
        mine = {n: {p for p, o in self.owner.items() if o == n} for n in self.members}
        short = sorted(n for n, m in self.members.items() if set(m.returned) != mine[n])
        if short:
            self.publish(8, 8)  # (keys k0..k7 fall in each of the 4 partitions)
            for name in short:
                self.drain(_Drawn(name))  # type: ignore[arg-type]
        self.move_away_and_back(batch, tell)
        fenced = [n for n, m in self.members.items() if self._fenced(m)]
        who = _Drawn(data.draw(st.sampled_from(sorted(fenced or self.members))))
        if then == "commit":
            self.commit(who)  # type: ignore[arg-type]
        elif then == "transaction":
            outcome = data.draw(st.sampled_from(["commit", "abort"]))
            self.commit_in_transaction(who, outcome, data.draw(st.booleans()))  # type: ignore[arg-type]

    def move_away_and_back(self, batch: int, tell: bool) -> None:
        """A member joins and leaves, quietly (see :meth:`away_and_back`)."""
        self.add_member(batch, quiet=True)
        self._close(self.members[f"m{self.joined:03d}"], quiet=True)
        if tell:
            for m in self.members.values():
                call = self.client._api.group_heartbeat(self.topic, GROUP, m.member_id)
                self.client._send(call)

    @precondition(lambda self: self.members)
    @rule(data=st.data(), quiet=st.booleans())
    def close(self, data: st.DataObject, quiet: bool) -> None:
        self._close(self._member(data), quiet)

    def _close(self, m: MemberModel, quiet: bool) -> None:
        if not quiet:
            self.tell_all()
        m.consumer.close()
        del self.members[m.member_id]
        self.sync()
        if not quiet:
            self.tell_all()

    @precondition(lambda self: self.group_exists and not self.members)
    @rule(data=st.data(), how=st.sampled_from(["earliest", "latest", "id", "past", "time"]))
    def reset(self, data: st.DataObject, how: str) -> None:
        to: str | MessageId | int
        end = self.end_id()
        if how in ("earliest", "latest") or not self.messages:
            to = how if how in ("earliest", "latest") else "earliest"
            position = ZERO if to == "earliest" or end is None else end
        elif how == "past":
            to = MessageId(end.publish_ts + 1000, 0, 0, 0) if end is not None else ZERO
            position = end if end is not None else ZERO
        else:
            target = data.draw(st.sampled_from(self.messages))
            if how == "id":
                to, position = target.id, target.id
            else:
                to = target.publish_time
                first = next(x for x in self.messages if x.publish_time >= to)
                position = first.id.previous()
        self.client.reset_group(self.topic, GROUP, to)
        self.committed = dict.fromkeys(range(PARTITIONS), position)

    @precondition(lambda self: self.group_exists and not self.members)
    @rule()
    def delete(self) -> None:
        self.client.delete_group(self.topic, GROUP)
        self.group_exists = False
        self.committed.clear()
        self.origin.clear()
        self.owner = {}
        self.since.clear()
        # A group made again counts its generations from the start.
        self.generation = 0
        self.gen_owner.clear()
        self.delivered.clear()

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def check_describe(self) -> None:
        if not self.group_exists:
            assert GROUP not in self.client.groups(self.topic)
            return
        info = self.client.describe_group(self.topic, GROUP)
        assert info.start == self.start
        assert info.partition_count == PARTITIONS
        assert info.generation == self.generation
        positions = {p.partition: p.position for p in info.partitions if p.position}
        assert positions == self.committed
        for part in info.partitions:
            p = part.partition
            assert part.owner == self.owner.get(p)
            if p in self.committed or self.start == "earliest":
                want: int | None = len(self.after(p, self.committed.get(p)))
            else:
                want = None
            assert part.lag == want, (p, part, self.committed.get(p))
            assert part.lag_exact
        lags = [p.lag for p in info.partitions if p.lag is not None]
        assert info.lag == (sum(lags) if lags else None)
        assert self.client.stats(self.topic).group_lags.get(GROUP) == info.lag


def run_machine(url: str, **options: object) -> None:
    """Run the machine against the server at ``url`` with hypothesis ``options``."""
    GroupsMachine.url = url
    config = settings(
        deadline=None,
        suppress_health_check=list(HealthCheck),
        **options,  # type: ignore[arg-type]
    )
    run_state_machine_as_test(GroupsMachine, settings=config)


def test_groups_model(server: ServerProcess) -> None:
    # A few seconds here; run it longer while changing groups (more examples and steps).
    run_machine(server.url, max_examples=20, stateful_step_count=20)


def test_groups_model_on_postgres(pg_server: ServerProcess) -> None:
    run_machine(pg_server.url, max_examples=5, stateful_step_count=15)


class _Drawn:
    """Stands in for hypothesis' ``data`` in a run written out by hand."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> object:
        return self.values.pop(0)


def test_groups_model_partition_away_and_back(server: ServerProcess) -> None:
    # The steps random runs seldom meet: a partition moves away and back while its
    # member, holding positions of it, hears nothing; its commit is fenced, then it
    # commits what it kept. The machine checks each step as in a random run.
    GroupsMachine.url = server.url
    machine = GroupsMachine()
    try:
        machine.choose_start("earliest")
        machine.add_member(100, quiet=True)
        machine.publish(8, 8)
        machine.poll(_Drawn("m001"))  # type: ignore[arg-type]
        machine.add_member(100, quiet=True)
        machine.close(_Drawn("m002"), quiet=True)  # type: ignore[arg-type]
        member = machine.members["m001"]
        assert machine._fenced(member)
        for name in ("m001", "m001"):
            machine.commit(_Drawn(name))  # type: ignore[arg-type]
            machine.check_describe()
        assert not machine._fenced(member)
    finally:
        machine.teardown()

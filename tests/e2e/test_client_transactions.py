"""Client transactions against a real server: concurrent producers with random aborts,
and TransactionContext with participants that fail or conflict."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client, TransactionConflict, TransactionFailure
from tidings.structs import Message, Transaction

pytestmark = pytest.mark.e2e

PRODUCERS = 4
TRANSACTIONS = 25


@dataclass
class KeyedParticipant:
    """A participant with change keys (so concurrent ones conflict) that may fail."""

    keys: list[bytes]
    fail_commit: bool = False
    name: str = "participant"
    steps: list[str] = field(default_factory=list)

    def start(self, transaction: Transaction) -> None:
        self.steps.append("start")

    def changes(self) -> Iterable[bytes]:
        return self.keys

    def commit(self) -> None:
        self.steps.append("commit")
        if self.fail_commit:
            raise OSError("the participant's store is gone")

    def post_commit(self) -> None:
        self.steps.append("post_commit")

    def rollback(self) -> None:
        self.steps.append("rollback")


class UserAbort(Exception):
    pass


def producer(
    url: str, topics: tuple[str, str], n: int, seed: int, committed: dict[str, bool]
) -> None:
    rng = random.Random(seed)
    with Client(url) as client:
        for i in range(TRANSACTIONS):
            keys = [b"k%d" % rng.randrange(3)] if rng.random() < 0.5 else []
            fail_commit = rng.random() < 0.1
            user_abort = rng.random() < 0.15
            participant = KeyedParticipant(keys, fail_commit)
            # A third of the transactions take the payload path (store as they go).
            threshold = 0 if rng.random() < 0.33 else 1 << 20
            tag = f"p{n}-t{i}"
            try:
                with client.transaction(participant, payload_threshold=threshold) as tx:
                    for topic in topics:
                        count = rng.randint(1, 3) if topic == topics[0] else rng.randint(0, 2)
                        if count:
                            tx.publish(topic, [f"{tag}-{topic}-{j}" for j in range(count)])
                        time.sleep(rng.random() * 0.005)
                    if user_abort:
                        raise UserAbort
                committed[tag] = True
            except (UserAbort, TransactionConflict, TransactionFailure):
                committed[tag] = False


def tag_of(message: Message) -> str:
    return message.payload.decode().split("-", 2)[0] + "-" + message.payload.decode().split("-")[1]


def test_concurrent_transactional_producers_and_a_read_committed_consumer(
    server: ServerProcess, topic: str
) -> None:
    topics = (topic, topic + "-b")
    with Client(server.url) as admin:
        for t in topics:
            admin.create_topic(t)
        # The server is shared: other tests may have left transactions open on purpose.
        open_before = set(admin.transactions().in_progress)
    committed: dict[str, bool] = {}
    seen: list[Message] = []
    done = threading.Event()

    def consume() -> None:
        with Client(server.url) as client:
            consumer = client.consume(topic, wait=1, committed_wait=0.05)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                seen.extend(consumer.poll())
                if done.is_set():
                    expected = {t for t, ok in committed.items() if ok}
                    if expected <= {tag_of(m) for m in seen} and not consumer.poll():
                        return

    reader = threading.Thread(target=consume)
    reader.start()
    writers = [
        threading.Thread(target=producer, args=(server.url, topics, n, 1000 + n, committed))
        for n in range(PRODUCERS)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    done.set()
    reader.join()

    assert len(committed) == PRODUCERS * TRANSACTIONS
    ok = {t for t, c in committed.items() if c}
    assert ok and len(ok) < len(committed), "expected both commits and aborts"
    # Never an aborted (or never-committed) message; every committed one; one order.
    assert {tag_of(m) for m in seen} == ok
    ids = [m.id for m in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # A transaction's messages on a topic are contiguous and in publish order.
    payloads = [m.payload.decode() for m in seen]
    for tag in ok:
        mine = [i for i, p in enumerate(payloads) if p.startswith(tag + "-")]
        assert mine == list(range(mine[0], mine[0] + len(mine)))
        assert [payloads[i] for i in mine] == sorted(payloads[i] for i in mine)
    with Client(server.url) as client:
        # Another consumer, later, sees exactly the same sequence.
        again = list(client.consume(topic, follow=False))
        assert [m.id for m in again] == ids
        # The other topic holds exactly the committed transactions' messages too.
        other = {tag_of(m) for m in client.consume(topics[1], follow=False)}
        assert other <= ok
        uncommitted = {tag_of(m) for m in client.consume(topic, transactional=False, follow=False)}
        assert ok <= uncommitted
        assert set(client.transactions().in_progress) <= open_before  # none of ours


def test_participant_commit_failure_rolls_back_and_aborts(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        participant = KeyedParticipant([b"row"], fail_commit=True)
        ctx = client.transaction(participant)
        with pytest.raises(TransactionFailure) as info, ctx:
            ctx.publish(topic, b"never")
        assert isinstance(info.value.__cause__, OSError)
        assert participant.steps == ["start", "commit", "rollback"]
        assert ctx.state == "aborted"
        state = client.transactions()
        assert ctx.write_pointer not in state.in_progress
        assert ctx.write_pointer not in state.invalid
        assert list(client.consume(topic, transactional=False, follow=False)) == []


def test_conflicting_changes_raise_and_roll_everything_back(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        first, second = KeyedParticipant([b"row"]), KeyedParticipant([b"row"])
        ctx1, ctx2 = client.transaction(first), client.transaction(second)
        ctx1.start()
        ctx2.start()
        ctx2.publish(topic, [b"loser-1", b"loser-2"])
        ctx1.publish(topic, b"winner")
        ctx1.finish()
        with pytest.raises(TransactionConflict):
            ctx2.finish()
        assert second.steps == ["start", "commit", "rollback"]
        assert ctx2.state == "aborted"
        # The loser's entries were published, then rolled back: never visible.
        assert [m.payload for m in client.consume(topic, follow=False)] == [b"winner"]
        everything = [m.payload for m in client.consume(topic, transactional=False, follow=False)]
        assert sorted(everything) == [b"loser-1", b"loser-2", b"winner"]
        assert ctx2.write_pointer not in client.transactions().in_progress

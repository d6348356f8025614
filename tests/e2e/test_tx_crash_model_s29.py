"""Transactions across kill -9, timeouts and concurrent clients, against a model.

Several threads, each with its own sync client, run random transactions on two topics
of one server (begins plain or under a shared transactional id, publishes, commits with
change keys that conflict across threads, rollback + abort, transactions left to time
out, transactions left open, registrations that fence the other threads' epochs) and
idempotent publishes, until the server is killed with SIGKILL at a random moment and
restarted on the same data dir. After each restart:

* every transaction the server still has in progress is one whose end was never
  acknowledged, and the last stable position of each topic is its oldest one's first
  entry;
* committing one left open at the kill commits it (then it shows whole) or is refused
  as docs/transactions.md says (invalid when its begin was not durable, timed out);
* a read-committed reader sees every acknowledged commit whole and exactly once, never
  anything of an aborted, timed-out, fenced or conflicting one, one whose answer was
  lost whole or not at all, and a later read extends the earlier one;
* ended transactions answer how they ended (410 committed, aborted, timed out,
  invalid), a fenced epoch stays fenced and registering the id again moves its epoch
  on, new write pointers are above every one handed out, and an idempotent publish
  retried after the restart is not written twice.

Sometimes the restarted server is killed again while it recovers. The run is random:
its seed is printed on failure (thread timing makes a replay similar, not identical).
When hunting bugs, ``TIDINGS_TX_CRASH_SEED`` sets the seed, ``TIDINGS_TX_CRASH_ROUNDS``
and ``TIDINGS_TX_CRASH_WORKERS`` run more kills and clients, and
``TIDINGS_TX_CRASH_STORE=postgres`` keeps the store and the log in PostgreSQL.
"""

from __future__ import annotations

import base64
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess
from tidings import Client
from tidings.errors import (
    ProducerFenced,
    TidingsError,
    TransactionAborted,
    TransactionCommitted,
    TransactionConflict,
    TransactionInvalid,
    TransactionTimedOut,
)
from tidings.structs import ProducerInfo, RollbackInfo

pytestmark = pytest.mark.e2e

ROUNDS = int(os.environ.get("TIDINGS_TX_CRASH_ROUNDS", "3"))
SEED = int(os.environ.get("TIDINGS_TX_CRASH_SEED", str(random.randrange(1 << 30))))
WORKERS = int(os.environ.get("TIDINGS_TX_CRASH_WORKERS", "3"))
TOPICS = ("a", "b")
TIDS = ("tid0", "tid1")
KEYS = (b"k0", b"k1", b"k2")
#: Long enough that only the transactions meant to time out do.
LONG = 120.0
SHORT = 0.3

COMMITTED, ABORTED, TIMED_OUT, FENCED, CONFLICT = (
    "committed",
    "aborted",
    "timedOut",
    "fenced",
    "conflict",
)
#: Ended for sure with nothing visible.
GONE = (ABORTED, TIMED_OUT, FENCED, CONFLICT)
OPEN, UNKNOWN = "open", "unknown"


@dataclass(eq=False)
class Tx:
    tag: str
    wp: int
    producer: ProducerInfo | None
    status: str = UNKNOWN
    #: Acknowledged publishes: topic, what to roll back, payloads.
    published: list[tuple[str, RollbackInfo, list[bytes]]] = field(default_factory=list)
    #: A publish whose answer was lost: (topic, payloads); it is there whole or not at all.
    in_flight: tuple[str, list[bytes]] | None = None
    #: Its rollback began: a commit is no longer the client's to send.
    aborting: bool = False
    #: A client block's: what it published is not known here, so it cannot be rolled back.
    block: bool = False
    #: How many of ``published`` were rolled back, acknowledged.
    rolled_back: int = 0

    def payloads(self, topic: str) -> list[bytes]:
        return [p for t, _, ps in self.published if t == topic for p in ps]


@dataclass
class Model:
    lock: threading.Lock = field(default_factory=threading.Lock)
    txs: dict[str, Tx] = field(default_factory=dict)
    #: Every epoch each transactional id was acknowledged, in order.
    epochs: dict[str, list[ProducerInfo]] = field(default_factory=lambda: defaultdict(list))
    #: (producer id, topic) -> (sequence, payload) of the last acknowledged publish.
    idempotent: dict[tuple[str, str], tuple[int, bytes]] = field(default_factory=dict)
    #: (producer id, topic, sequence, payload) sent when the server died.
    idempotent_lost: list[tuple[str, str, int, bytes]] = field(default_factory=list)
    plain: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    pointers: set[int] = field(default_factory=set)
    surprises: list[str] = field(default_factory=list)
    killed: threading.Event = field(default_factory=threading.Event)


def _idempotent_publish(
    url: str, topic: str, pid: str, sequence: int, payload: bytes
) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/namespaces/default/topics/{topic}/publish",
        # A batch of two: a retry must write neither again.
        json={"messages": [base64.b64encode(p).decode() for p in (payload, payload + b"+")]},
        headers={"Tidings-Producer-Id": pid, "Tidings-Sequence": str(sequence)},
        timeout=10,
    )


def _worker(url: str, n: int, rnd: int, model: Model, seed: int) -> None:
    rng = random.Random(seed)
    pid = f"{n:02x}{rnd:02x}" + "ab" * 14
    sequences: dict[str, int] = {}
    with Client(url) as client:
        for i in range(10_000):  # bounded; the kill ends it long before
            if model.killed.is_set():
                return
            tag = f"r{rnd}w{n}i{i}"
            try:
                roll = rng.random()
                if roll < 0.1:
                    tid = rng.choice(TIDS)
                    info = client.register_producer(tid)
                    with model.lock:
                        model.epochs[tid].append(info)
                elif roll < 0.25:
                    topic = rng.choice(TOPICS)
                    sequence = sequences.get(topic, -1) + 1
                    payload = f"{tag}:idem".encode()
                    with model.lock:
                        model.idempotent_lost.append((pid, topic, sequence, payload))
                    answer = _idempotent_publish(url, topic, pid, sequence, payload)
                    if answer.status_code != 200:
                        with model.lock:
                            model.surprises.append(f"{tag}: idempotent {answer.text}")
                        continue
                    with model.lock:
                        model.idempotent_lost.pop()
                        model.idempotent[(pid, topic)] = (sequence, payload)
                        model.plain[topic] += [payload, payload + b"+"]
                    sequences[topic] = sequence
                elif roll < 0.3:
                    topic = rng.choice(TOPICS)
                    payload = f"{tag}:plain".encode()
                    client.publish(topic, payload)
                    with model.lock:
                        model.plain[topic].append(payload)
                elif roll < 0.45:
                    _block(client, rng, tag, model)
                else:
                    _transaction(client, rng, tag, model)
            except (TidingsError, OSError, httpx.HTTPError) as exc:
                if model.killed.is_set():
                    return
                with model.lock:
                    model.surprises.append(f"{tag}: {exc!r}")


def _block(client: Client, rng: random.Random, tag: str, model: Model) -> None:
    # The client's block; with the begin deferred, one request begins, publishes and
    # commits (its commit carried by the store's write).
    tx = Tx(tag, 0, None, block=True)
    batches = [
        (rng.choice(TOPICS), [f"{tag}:{j}.{k}".encode() for k in range(rng.randint(1, 2))])
        for j in range(rng.randint(1, 3))
    ]
    for topic, payloads in batches:
        tx.published.append((topic, None, payloads))  # type: ignore[arg-type]
    with model.lock:
        model.txs[tag] = tx
    deferred = rng.random() < 0.7
    with client.transaction(timeout=LONG, defer_begin=deferred) as block:
        if not deferred:
            tx.wp = block.write_pointer
            with model.lock:
                model.pointers.add(tx.wp)
        for topic, payloads in batches:
            block.publish(topic, payloads)
    tx.wp = block.write_pointer
    tx.status = COMMITTED


def _transaction(client: Client, rng: random.Random, tag: str, model: Model) -> None:
    producer = None
    if rng.random() < 0.4:
        with model.lock:
            epochs = model.epochs[rng.choice(TIDS)]
            producer = epochs[-1] if epochs else None
    how = rng.choice(["commit", "commit", "commit", "abort", "timeout", "open"])
    creds: dict[str, object] = {}
    if producer is not None:
        creds = {"transactional_id": producer.transactional_id, "epoch": producer.epoch}
    try:
        begun = client.begin(SHORT if how == "timeout" else LONG, **creds)  # type: ignore[arg-type]
    except ProducerFenced:
        return  # another thread registered the id again
    tx = Tx(tag, begun.write_pointer, producer)
    with model.lock:
        model.txs[tag] = tx
        model.pointers.add(tx.wp)
    for j in range(rng.randint(1, 3)):
        topic = rng.choice(TOPICS)
        payloads = [f"{tag}:{j}.{k}".encode() for k in range(rng.randint(1, 2))]
        tx.in_flight = (topic, payloads)
        try:
            info = client.publish(topic, payloads, write_pointer=tx.wp)
        except TransactionInvalid:
            if model.killed.is_set():
                raise
            tx.in_flight = None
            tx.status = FENCED  # its id was registered again: the begin's epoch is old
            return
        except TransactionTimedOut:
            if how != "timeout":
                raise
            tx.in_flight = None
            tx.status = TIMED_OUT  # a busy machine: the short timeout passed already
            return
        tx.in_flight = None
        tx.published.append((topic, info, payloads))
    if how == "open":
        tx.status = OPEN
        return
    if how == "timeout":
        time.sleep(rng.choice([SHORT + 0.02, SHORT + 0.3]))
        if rng.random() < 0.3:
            # Rolled back, then aborted: before the sweep that aborts; after it, the
            # answer says it had timed out, and nothing shows either way.
            tx.aborting = True
            for topic, info, _ in tx.published:
                client.rollback(topic, info)
                tx.rolled_back += 1
            try:
                end = client.abort(tx.wp, **creds)  # type: ignore[arg-type]
            except ProducerFenced:
                tx.status = FENCED
                return
            if (end.outcome, end.already) == ("aborted", False):
                tx.status = ABORTED
            elif (end.outcome, end.already) == ("timedOut", True):
                tx.status = TIMED_OUT
            else:
                tx.status = FENCED
                with model.lock:
                    model.surprises.append(f"{tag}: abort past its timeout: {end}")
            return
        try:
            client.commit(tx.wp, **creds)  # type: ignore[arg-type]
        except TransactionTimedOut:
            tx.status = TIMED_OUT
        except ProducerFenced:
            tx.status = FENCED
        else:
            with model.lock:
                model.surprises.append(f"{tag}: committed past its timeout")
            tx.status = COMMITTED
        return
    if how == "commit":
        keys = set(rng.sample(KEYS[:2], rng.randint(0, 2)))
        time.sleep(rng.choice([0, 0, 0.02]))
        try:
            client.commit(tx.wp, keys, **creds)  # type: ignore[arg-type]
            tx.status = COMMITTED
            return
        except ProducerFenced:
            tx.status = FENCED
            return
        except TransactionConflict:
            pass  # roll back and abort, as the client's block does
    tx.aborting = True
    for topic, info, _ in tx.published:
        client.rollback(topic, info)
        tx.rolled_back += 1
    try:
        client.abort(tx.wp, **creds)  # type: ignore[arg-type]
    except ProducerFenced:
        tx.status = FENCED
        return
    tx.status = ABORTED if how == "abort" else CONFLICT


def _tag(payload: bytes) -> str:
    return payload.split(b":")[0].decode()


def _read(client: Client, topic: str) -> list[bytes]:
    return [m.payload for m in client.poll(topic, isolation="read_committed", limit=10_000)]


def _check_after_restart(url: str, model: Model, earlier: dict[str, list[bytes]]) -> None:
    with Client(url) as client:
        state = client.transactions()
        assert min(state.in_progress, default=state.read_pointer + 1) > 0
        assert state.last_write_pointer >= max(model.pointers, default=0)
        by_wp = {tx.wp: tx for tx in model.txs.values()}
        for wp in state.in_progress:
            tx = by_wp.get(wp)
            if tx is not None:
                assert tx.status in (OPEN, UNKNOWN), (tx.tag, tx.status)
        # The last stable position: the first entry of the oldest transaction open.
        for topic in TOPICS:
            everything = client.poll(topic, limit=10_000)
            # Entries rolled back hold nothing back; one whose rollback's answer was
            # lost may or may not, and a transaction whose timeout is about to pass or
            # has passed may have been swept since.
            now = time.time() * 1000
            holding, maybe = [], []
            for m in everything:
                tx = model.txs.get(_tag(m.payload))
                if tx is None or tx.wp not in state.in_progress:
                    continue
                at = [i for i, (_, _, ps) in enumerate(tx.published) if m.payload in ps]
                if at and at[0] < tx.rolled_back:
                    continue
                if (at and at[0] == tx.rolled_back and tx.aborting) or (
                    state.in_progress[tx.wp] < now + 1000
                ):
                    maybe.append(m.id)
                else:
                    holding.append(m.id)
            got = client.end(topic).last_stable_id
            if got is None:
                assert not holding, topic
            else:
                assert got in maybe or got == holding[0], topic
                assert not holding or got <= holding[0], topic
            if not maybe:
                assert client.stats(topic).last_stable_id == got, topic
        # A transaction open at the kill shows nothing until it commits.
        for topic in TOPICS:
            seen = set(_read(client, topic))
            for tx in model.txs.values():
                if tx.status in (OPEN, UNKNOWN) and tx.wp in state.in_progress:
                    assert not seen & set(tx.payloads(topic)), tx.tag
        # Fenced epochs stay fenced.
        for tid, epochs in model.epochs.items():
            for old in epochs[:-1]:
                with pytest.raises(ProducerFenced):
                    client.begin(LONG, transactional_id=tid, epoch=old.epoch)
        # Settle every transaction left open, or whose end is not known.
        rng = random.Random(len(model.txs))
        for tx in list(model.txs.values()):
            if tx.status not in (OPEN, UNKNOWN):
                continue
            if tx.wp not in state.in_progress:
                if tx.status == OPEN:
                    # No commit was sent: its begin was not durable (docs/transactions.md,
                    # "Durability"), or its id was registered again.
                    assert tx.wp in state.invalid, tx.tag
                    if tx.producer is None:
                        with pytest.raises(TransactionInvalid):
                            client.commit(tx.wp)
                        end = client.abort(tx.wp)
                        assert end.already and end.outcome in ("unlogged", "fenced"), end
                    tx.status = FENCED
                continue  # it ended (committed or not): the read below tells which
            creds: dict[str, object] = {}
            if tx.producer is not None:
                creds = {"transactional_id": tx.producer.transactional_id}
                creds["epoch"] = tx.producer.epoch
            if state.in_progress[tx.wp] < time.time() * 1000 - 50:
                # Its timeout passed while the server was down: it times out as usual.
                with pytest.raises(TransactionTimedOut):
                    client.commit(tx.wp, **creds)  # type: ignore[arg-type]
                tx.status = TIMED_OUT
                continue
            try:
                if not (tx.aborting or tx.block) and rng.random() < 0.5:
                    client.commit(tx.wp, **creds)  # type: ignore[arg-type]
                    tx.status = COMMITTED
                elif tx.in_flight is not None or tx.block:
                    # What a lost publish wrote cannot be rolled back: invalidate.
                    client.invalidate(tx.wp)
                    tx.status = FENCED
                else:
                    for topic, info, _ in tx.published:
                        client.rollback(topic, info)
                    client.abort(tx.wp, **creds)  # type: ignore[arg-type]
                    tx.status = ABORTED
            except (TransactionInvalid, TransactionTimedOut, ProducerFenced):
                tx.status = FENCED
        for wp in client.transactions().in_progress:
            assert wp not in by_wp or by_wp[wp].status == UNKNOWN, wp
            client.invalidate(wp)  # a begin whose answer was lost
        # Ended transactions answer how they ended, also after the restart.
        ended = {
            COMMITTED: TransactionCommitted,
            ABORTED: TransactionAborted,
            CONFLICT: TransactionAborted,
            TIMED_OUT: TransactionTimedOut,
        }
        for tx in model.txs.values():
            if tx.producer is not None or tx.wp <= 0 or tx.block:
                continue
            if tx.status in ended:
                with pytest.raises(ended[tx.status]):
                    client.commit(tx.wp)
            elif tx.status == FENCED:
                # Invalidated (also as unlogged by a restart), or timed out meanwhile.
                with pytest.raises((TransactionInvalid, TransactionTimedOut)):
                    client.commit(tx.wp)
                assert client.abort(tx.wp).already
        # Registering again after the restart fences every earlier epoch.
        for tid, epochs in model.epochs.items():
            if epochs:
                info = client.register_producer(tid)
                assert info.producer_id == epochs[-1].producer_id
                assert info.epoch > epochs[-1].epoch
                epochs.append(info)
        fresh = client.begin(LONG)
        assert fresh.write_pointer > max(model.pointers | {state.last_write_pointer})
        client.abort(fresh)
        # Idempotent retries after the restart are not written twice.
        for (pid, topic), (sequence, payload) in model.idempotent.items():
            answer = _idempotent_publish(url, topic, pid, sequence, payload)
            assert answer.status_code == 200, answer.text
        for pid, topic, sequence, payload in model.idempotent_lost:
            answer = _idempotent_publish(url, topic, pid, sequence, payload)
            assert answer.status_code == 200, answer.text
            model.idempotent[(pid, topic)] = (sequence, payload)
            model.plain[topic] += [payload, payload + b"+"]
        model.idempotent_lost.clear()

        for topic in TOPICS:
            read = _read(client, topic)
            assert client.end(topic).last_stable_id is None
            assert read[: len(earlier[topic])] == earlier[topic], topic
            earlier[topic] = read
            assert len(read) == len(set(read)), "a message shows twice"
            tags: dict[str, list[bytes]] = defaultdict(list)
            for payload in read:
                tags[_tag(payload)].append(payload)
            for payload in set(model.plain[topic]):
                assert payload in read, payload
            for tx in model.txs.values():
                shown = [
                    p for p in tags.get(tx.tag, []) if not p.endswith((b"plain", b"idem", b"idem+"))
                ]
                acked = tx.payloads(topic)
                extra = tx.in_flight[1] if tx.in_flight and tx.in_flight[0] == topic else []
                if tx.status == COMMITTED:
                    assert shown in (acked, acked + extra), (tx.tag, shown, acked)
                elif tx.status in GONE:
                    assert shown == [], (tx.tag, tx.status, shown)
                else:
                    assert shown in ([], acked, acked + extra), (tx.tag, shown, acked)
        assert not [tx for tx in model.txs.values() if tx.status == OPEN]


def test_transactions_survive_kill_9_with_concurrent_clients(
    start_server: Callable[..., ServerProcess], request: pytest.FixtureRequest
) -> None:
    print(f"TIDINGS_TX_CRASH_SEED={SEED}")
    rng = random.Random(SEED)
    env = {
        "TIDINGS_TX_SWEEP_INTERVAL": "0.1",
        "TIDINGS_TX_SNAPSHOT_EVERY": str(rng.choice([7, 30, 10_000])),
    }
    if os.environ.get("TIDINGS_TX_CRASH_STORE") == "postgres":
        # The log in PostgreSQL's rows (docs/transactions.md, "In the store instead");
        # each restart waits for the killed one's lease, so only when asked for.
        url = fresh_database(request.getfixturevalue("postgres_url"))
        args = ["--store", url, "--lease-seconds", "2"]
        srv = LeadingServerProcess(request.getfixturevalue("tmp_path") / "pg", args, env)
        srv.start()
    else:
        srv = start_server(**env)
    with Client(srv.url) as admin:
        for topic in TOPICS:
            admin.create_topic(topic)
    model = Model()
    earlier: dict[str, list[bytes]] = {t: [] for t in TOPICS}
    for rnd in range(ROUNDS):
        model.killed.clear()
        workers = [
            threading.Thread(target=_worker, args=(srv.url, n, rnd, model, rng.randrange(1 << 30)))
            for n in range(WORKERS)
        ]
        for w in workers:
            w.start()
        time.sleep(rng.uniform(0.6, 1.8))
        model.killed.set()
        srv.kill()
        for w in workers:
            w.join(20)
        assert not any(w.is_alive() for w in workers)
        assert not model.surprises, (SEED, model.surprises)
        if rng.random() < 0.3:
            # Killed again while it recovers (rewrites its snapshot, starts a new log).
            srv = type(srv)(srv.data_dir, srv.args, srv.env).launch()
            time.sleep(rng.uniform(0.2, 0.8))
            srv.kill()
        srv = type(srv)(srv.data_dir, srv.args, srv.env).start()
        try:
            _check_after_restart(srv.url, model, earlier)
        except BaseException:
            print(f"TIDINGS_TX_CRASH_SEED={SEED} round {rnd}")
            srv.kill()
            raise
    srv.stop()
    statuses: dict[str, int] = defaultdict(int)
    for tx in model.txs.values():
        statuses[tx.status] += 1
    print(dict(statuses))
    assert statuses[COMMITTED] > 5, statuses

"""Idempotent producers against a model: several producers (the sync and async
clients, the background publisher, and a raw HTTP producer that sends its own
``Tidings-Producer-Id`` / ``Tidings-Sequence``) publish to a few topics through a
proxy that loses requests and answers, while the server is killed, restarted,
forgets idle producers (a short ``producer_expiry``) and sees its topics deleted and
made again. Whatever was acknowledged is in its topic once and in its producer's
order; a retried batch writes nothing new; a gap is refused and changes nothing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.conftest import fresh_database
from tests.e2e.faultproxy import Fault, FaultProxy
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess
from tidings import AsyncClient, Client, RetryPolicy
from tidings.errors import TidingsError

pytestmark = pytest.mark.e2e

#: Hunting bugs locally: TIDINGS_IDEM_EXAMPLES=200 runs far more programs.
EXAMPLES = int(os.environ.get("TIDINGS_IDEM_EXAMPLES", "2"))
STEPS = int(os.environ.get("TIDINGS_IDEM_STEPS", "12"))
#: The server's producer_expiry and cleanup_interval (seconds): short, so that a
#: producer is forgotten within a test.
EXPIRY = 2.0
CLEANUP = 0.2
#: A record written less than this ago is surely still there (a second's room for a
#: slow machine). Whether one is gone the model learns from the server's count.
SURELY_KEPT = EXPIRY - 1.0
MAX_RESTARTS = int(os.environ.get("TIDINGS_IDEM_RESTARTS", "2"))
MAX_EXPIRIES = int(os.environ.get("TIDINGS_IDEM_EXPIRIES", "1"))
TIMEOUT = 0.25
DELAY = 0.35  # longer than TIMEOUT: a delayed request arrives after its retry may have
RETRY = RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.02)
NS = "default"
#: Prints each step's time and how often each path of the model was taken.
TIMING = bool(os.environ.get("TIDINGS_IDEM_TIMING"))
SEEN: Counter[str] = Counter()


def event(label: str) -> None:
    SEEN[label] += 1
    hypothesis_event(label)


CLIENT_FAULTS = [
    Fault.PASS,
    Fault.DROP_BEFORE,
    Fault.DROP_AFTER,
    Fault.DELAY,
    Fault.CUT_REQUEST,
    Fault.CUT_MID,
    Fault.CUT_BODY,
    Fault.CLOSE_AFTER,
]
schedules = st.lists(st.sampled_from(CLIENT_FAULTS), max_size=4)


@pytest.fixture(scope="module")
def own_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server of this module's own: the model kills and restarts it.
    TIDINGS_IDEM_STORE=postgres runs it on the session's PostgreSQL instead."""
    # TIDINGS_IDEM_DIR keeps the server's data and log where a long hunt can read them.
    kept = os.environ.get("TIDINGS_IDEM_DIR")
    base = Path(kept) / uuid.uuid4().hex[:8] if kept else tmp_path_factory.mktemp("idem-model")
    base.mkdir(parents=True, exist_ok=True)
    data = base / "data"
    env = {"TIDINGS_PRODUCER_EXPIRY": str(EXPIRY), "TIDINGS_CLEANUP_INTERVAL": str(CLEANUP)}
    if os.environ.get("TIDINGS_IDEM_STORE") == "postgres":
        url = fresh_database(request.getfixturevalue("postgres_url"))
        args = ["--store", url, "--lease-seconds", "2"]
        proc: ServerProcess = LeadingServerProcess(data, args, env).start()
    else:
        proc = ServerProcess(data, env=env).start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def idem_proxy(own_server: ServerProcess) -> Iterator[FaultProxy]:
    port = urlsplit(own_server.url).port
    assert port is not None
    with FaultProxy(port, delay=DELAY, matches=lambda line: b"/publish" in line) as p:
        yield p


class RawTopic:
    """What the raw producer knows of its record on one topic."""

    def __init__(self) -> None:
        #: The producer id it uses on this topic (a new one once the model lost track).
        self.id = uuid.uuid4().hex
        #: The server's last sequence of the producer here, None: no record.
        self.last: int | None = None
        #: When (monotonic) the record was last written, at the earliest.
        self.sent_at = 0.0
        #: The server surely forgot it (its count of records fell to none since).
        self.forgotten = False
        #: A batch whose answer was lost: (sequence, payloads, written).
        self.pending: tuple[int, list[bytes], bool] | None = None

    def kept(self) -> bool:
        return self.last is not None and time.monotonic() - self.sent_at < SURELY_KEPT

    def gone(self) -> bool:
        return self.last is None or self.forgotten

    def wrote(self, seq: int, sent_at: float) -> None:
        self.last = seq
        self.sent_at = sent_at
        self.forgotten = False


class IdempotentModel(RuleBasedStateMachine):
    server: ServerProcess
    proxy: FaultProxy

    def __init__(self) -> None:
        super().__init__()
        self.topics = ["im-" + uuid.uuid4().hex[:10] for _ in range(2)]
        self.direct = Client(self.server.url, retry=RETRY)
        for topic in self.topics:
            self.direct.create_topic(topic)
        self.sync = Client(self.proxy.url, timeout=TIMEOUT, retry=RETRY)
        self.loop = asyncio.new_event_loop()
        self.aclient = AsyncClient(self.proxy.url, timeout=TIMEOUT, retry=RETRY)
        self.publisher = self.sync.publisher(retry=RETRY, max_batch_messages=2)
        self.raw: dict[str, RawTopic] = {t: RawTopic() for t in self.topics}
        #: Per topic: each producer's acknowledged payloads, in acknowledgement order.
        self.acked: dict[str, dict[str, list[bytes]]] = {t: {} for t in self.topics}
        #: Per topic: payloads whose publish failed (there once, or not at all).
        self.maybe: dict[str, set[bytes]] = {t: set() for t in self.topics}
        #: Per topic: payloads written twice, as documented (a retry after expiry).
        self.twice: dict[str, set[bytes]] = {t: set() for t in self.topics}
        self.maybe_twice: dict[str, set[bytes]] = {t: set() for t in self.topics}
        self.counter = 0
        #: The slow rules, bounded per program: the suite's time is short.
        self.restarts = 0
        self.expiries = 0

    def teardown(self) -> None:
        self.proxy.load([])
        with contextlib.suppress(TimeoutError):
            self.publisher.close(timeout=10)
        self.sync.close()
        self.loop.run_until_complete(self.aclient.close())
        self.loop.close()
        for topic in self.topics:
            with contextlib.suppress(TidingsError):
                self.direct.delete_topic(topic)
        self.direct.close()

    # ---- helpers

    def payloads(self, who: str, n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            self.counter += 1
            out.append(f"{who}-{self.counter}".encode())
        return out

    def ack(self, topic: str, who: str, payloads: list[bytes]) -> None:
        self.acked[topic].setdefault(who, []).extend(payloads)

    def faulted(self, schedule: list[Fault]) -> None:
        self.proxy.load(schedule)

    def settle(self) -> None:
        self.proxy.wait_idle()
        self.proxy.load([])

    def raw_send(
        self, topic: str, seq: int, payloads: list[bytes], *, via_proxy: bool = True
    ) -> httpx.Response:
        base = self.proxy.url if via_proxy else self.server.url
        return httpx.post(
            f"{base}/v1/namespaces/{NS}/topics/{topic}/publish",
            json={"messages": [_b64(p) for p in payloads]},
            headers={"Tidings-Producer-Id": self.raw[topic].id, "Tidings-Sequence": str(seq)},
            timeout=5,
        )

    def producer_records(self) -> int:
        metrics = httpx.get(self.server.url + "/metrics", timeout=5).text
        line = next(
            x for x in metrics.splitlines() if x.startswith("tidings_idempotent_producers ")
        )
        return int(float(line.split()[1]))

    def contents(self, topic: str) -> list[bytes]:
        return [m.payload for m in self.direct.consume(topic, follow=False, batch_size=1000)]

    # ---- producers through the clients

    @rule(topic=st.integers(0, 1), n=st.integers(1, 3), schedule=schedules)
    def sync_publish(self, topic: int, n: int, schedule: list[Fault]) -> None:
        t = self.topics[topic]
        payloads = self.payloads("sync", n)
        self.faulted(schedule)
        try:
            self.sync.publish(t, payloads)
        except TidingsError:
            self.maybe[t].update(payloads)
            event("a client publish failed")
        else:
            self.ack(t, "sync", payloads)
        self.settle()

    @rule(topic=st.integers(0, 1), n=st.integers(1, 3), schedule=schedules)
    def async_publish(self, topic: int, n: int, schedule: list[Fault]) -> None:
        t = self.topics[topic]
        payloads = self.payloads("async", n)
        self.faulted(schedule)
        try:
            self.loop.run_until_complete(self.aclient.publish(t, payloads))
        except TidingsError:
            self.maybe[t].update(payloads)
            event("a client publish failed")
        else:
            self.ack(t, "async", payloads)
        self.settle()

    @rule(topic=st.integers(0, 1), n=st.integers(1, 4), schedule=schedules)
    def background_publish(self, topic: int, n: int, schedule: list[Fault]) -> None:
        t = self.topics[topic]
        payloads = self.payloads("bg", n)
        self.faulted(schedule)
        futures = [self.publisher.send(t, p) for p in payloads]
        self.publisher.flush(timeout=20)
        for payload, future in zip(payloads, futures, strict=True):
            if future.exception(timeout=0) is None:
                self.ack(t, "bg", [payload])
            else:
                self.maybe[t].add(payload)
                event("a client publish failed")
        self.settle()

    @rule(topic=st.integers(0, 1), n=st.integers(1, 2), schedule=schedules)
    def one_request_transaction(self, topic: int, n: int, schedule: list[Fault]) -> None:
        t = self.topics[topic]
        payloads = self.payloads("tx", n)
        self.faulted(schedule)
        try:
            self.sync.publish_transaction({t: payloads})
        except TidingsError:
            self.maybe[t].update(payloads)
            event("a client publish failed")
        else:
            self.ack(t, "tx", payloads)
        self.settle()
        # A transaction whose answer was lost may stay open until its timeout: end it
        # now, so that it holds nothing back.
        for wp in self.direct.transactions().in_progress:
            with contextlib.suppress(TidingsError):
                self.direct.invalidate(wp)

    @rule(topic=st.integers(0, 1))
    def one_request_transaction_with_a_sequence(self, topic: int) -> None:
        # Not deduplicated by producer sequence, so the headers are refused.
        t = self.topics[topic]
        state = self.raw[t]
        seq = 0 if state.last is None else state.last + 1
        answer = httpx.post(
            f"{self.server.url}/v1/namespaces/{NS}/transactions/publish",
            json={"topics": [{"topic": t, "messages": [_b64(p) for p in self.payloads("rtx", 1)]}]},
            headers={"Tidings-Producer-Id": self.raw[t].id, "Tidings-Sequence": str(seq)},
            timeout=5,
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["type"] == "BadRequest"

    # ---- the raw producer: its own sequence numbers, faults one at a time

    @precondition(lambda self: all(r.pending is None for r in self.raw.values()))
    @rule(
        topic=st.integers(0, 1),
        n=st.integers(1, 2),
        fault=st.sampled_from([Fault.PASS, Fault.DROP_BEFORE, Fault.DROP_AFTER]),
    )
    def raw_publish(self, topic: int, n: int, fault: Fault) -> None:
        t = self.topics[topic]
        state = self.raw[t]
        seq = 0 if state.last is None else state.last + 1
        payloads = self.payloads("raw", n)
        self.faulted([fault])
        sent_at = time.monotonic()
        try:
            answer = self.raw_send(t, seq, payloads)
        except httpx.HTTPError:
            assert fault is not Fault.PASS
            state.pending = (seq, payloads, fault is Fault.DROP_AFTER)
            if fault is Fault.DROP_AFTER:
                state.wrote(seq, sent_at)
                self.ack(t, "raw", payloads)
        else:
            assert fault is Fault.PASS
            assert answer.status_code == 200, answer.text
            state.wrote(seq, sent_at)
            self.ack(t, "raw", payloads)
        self.settle()

    @precondition(lambda self: any(r.pending is not None for r in self.raw.values()))
    @rule()
    def raw_retry(self) -> None:
        t, state = next((t, r) for t, r in self.raw.items() if r.pending is not None)
        assert state.pending is not None
        seq, payloads, written = state.pending
        event(f"retry of a batch {'written' if written else 'not written'}")
        gone = state.gone()
        if written and not state.kept() and not gone:
            # Maybe forgotten since: written again or not, the model cannot tell.
            state.pending = None
            return
        sent_at = time.monotonic()
        answer = self.raw_send(t, seq, payloads)
        assert answer.status_code == 200, answer.text
        state.pending = None
        if not written:
            state.wrote(seq, sent_at)
            self.ack(t, "raw", payloads)
        elif gone:
            # The producer was forgotten (it expired): the retry is written again, as
            # documented (docs/api.md), a second copy after the first.
            self.twice[t].update(payloads)
            state.wrote(seq, sent_at)
            event("retry after expiry written again")
        elif not state.kept():
            # It expired while the retry was on its way: one copy or two.
            self.maybe_twice[t].update(payloads)
            self.raw[t] = RawTopic()  # goes on as a new producer, as a client would

    @precondition(lambda self: all(r.pending is None for r in self.raw.values()))
    @rule(topic=st.integers(0, 1), back=st.integers(0, 3))
    def raw_resend_old(self, topic: int, back: int) -> None:
        # An older batch sent again (with other contents, even): answered as done,
        # nothing written. (What the model knows of the record depends on time, so
        # it is looked at only after everything is drawn.)
        t = self.topics[topic]
        state = self.raw[t]
        if state.last is None or not state.kept():
            return
        seq = max(0, state.last - back)
        payloads = self.payloads("old", 1)
        answer = self.raw_send(t, seq, payloads, via_proxy=False)
        assert answer.status_code == 200, answer.text
        event("older batch sent again")
        if not state.kept():
            # It expired while the request was on its way: written, or not.
            self.maybe[t].update(payloads)
            self.raw[t] = RawTopic()  # goes on as a new producer, as a client would

    @precondition(lambda self: all(r.pending is None for r in self.raw.values()))
    @rule(topic=st.integers(0, 1), skip=st.integers(2, 5))
    def raw_gap(self, topic: int, skip: int) -> None:
        t = self.topics[topic]
        state = self.raw[t]
        gone = state.gone()
        seq = (0 if state.last is None else state.last) + skip
        payloads = self.payloads("gap", 1)
        before = self.direct.stats(t)
        sent_at = time.monotonic()
        answer = self.raw_send(t, seq, payloads, via_proxy=False)
        kept = state.kept()  # still kept once answered: kept all along
        event(f"gap answered {answer.status_code}")
        if answer.status_code == 409:
            assert not gone, "a gap refused for a producer the server forgot"
            body = answer.json()
            assert body["type"] == "OutOfOrderSequence" and "error" in body, body
            after = self.direct.stats(t)
            assert after.message_count == before.message_count
            assert after.messages_published == before.messages_published
        else:
            assert answer.status_code == 200, answer.text
            assert not kept, "a gap written after the producer's last batch"
            state.wrote(seq, sent_at)
            self.ack(t, "raw", payloads)

    # ---- the server: restarts, expiry, topics made again

    @precondition(lambda self: self.restarts < MAX_RESTARTS)
    @rule(kill=st.booleans())
    def restart(self, kill: bool) -> None:
        self.restarts += 1
        self.settle()
        if kill:
            self.server.kill()
        else:
            assert self.server.stop() == 0
        self.server.start()

    @precondition(lambda self: self.expiries < MAX_EXPIRIES)
    @rule()
    def let_producers_expire(self) -> None:
        self.expiries += 1
        time.sleep(EXPIRY + CLEANUP)
        # Every producer is idle: the cleaner forgets them all (the server is this
        # model's own). Each then publishes on, and is written.
        deadline = time.monotonic() + 20
        while (left := self.producer_records()) and time.monotonic() < deadline:
            time.sleep(CLEANUP)
        assert left == 0, f"{left} idle producers kept past the expiry"
        for state in self.raw.values():
            state.forgotten = True

    @rule(topic=st.integers(0, 1))
    def recreate_topic(self, topic: int) -> None:
        t = self.topics[topic]
        self.settle()
        self.direct.delete_topic(t)
        self.direct.create_topic(t)
        self.acked[t] = {}
        self.maybe[t] = set()
        self.twice[t] = set()
        self.maybe_twice[t] = set()
        old = self.raw[t]
        self.raw[t] = RawTopic()
        self.raw[t].id = old.id  # the same producer, which the new topic does not know
        pending = old.pending
        if pending is not None:
            # The new topic knows no producer: the retry of a batch written to the
            # deleted one is written to it (docs/api.md).
            self.raw[t].pending = (pending[0], pending[1], False)
            event("retry pending across a re-created topic")

    # ---- what must hold

    @invariant()
    def acknowledged_once_in_order(self) -> None:
        if TIMING:
            now = time.monotonic()
            print(f"step took {now - getattr(self, '_t', now):.2f}s")
            self._t = now
        for t in self.topics:
            got = self.contents(t)
            twice = self.twice[t]
            for p in twice:
                assert got.count(p) == 2, f"a retry after expiry not written again: {p!r}"
            for p in self.maybe_twice[t]:
                assert got.count(p) in (1, 2), p
            once = [p for p in got if p not in twice and p not in self.maybe_twice[t]]
            assert len(once) == len(set(once)), f"a message is there twice: {got}"
            got = list(dict.fromkeys(got))  # the first copy of each, in order
            acked = {p for ps in self.acked[t].values() for p in ps}
            known = acked | self.maybe[t]
            assert set(got) <= known, f"messages nobody sent or acked: {set(got) - known}"
            assert acked <= set(got), f"acknowledged, and lost: {acked - set(got)}"
            for who, payloads in self.acked[t].items():
                mine = set(payloads)
                assert [p for p in got if p in mine] == payloads, who


def _b64(payload: bytes) -> str:
    return base64.b64encode(payload).decode()


def test_idempotent_producers_keep_their_word(
    own_server: ServerProcess, idem_proxy: FaultProxy
) -> None:
    IdempotentModel.server = own_server
    IdempotentModel.proxy = idem_proxy
    run_state_machine_as_test(
        IdempotentModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    if TIMING:
        print(dict(SEEN))

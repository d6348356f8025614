"""``tidings backup`` under a random mix of load, each copy restored and checked
against a model of what was acknowledged before that backup began.

Worker threads publish (plain and idempotent), run transactions (in one request, and of
several calls committed, aborted or left open), commit consumer-group positions inside
and outside transactions, pop, ack and nack a queue (acks also inside one-request
transactions), create and delete topics and publish to a topic with a short retention,
while the real ``tidings backup`` command runs one or more times at random moments.
Each copy then starts as a server (docs/operations.md, "Backup and restore") and:

* holds every message, committed transaction, topic, group position and queue ack
  acknowledged before its backup began, and nothing of a transaction aborted before;
* shows every transaction whole or not at all, has none open (a transaction open at
  the backup is invalidated in the copy) and refuses to commit one;
* keeps group positions within the restored data;
* answers idempotent producers as documented: a batch sent again is not written
  twice, and the next one is written or refused with ``OutOfOrderSequence``;
* hands out write pointers above every one begun before the backup, and a new
  transaction shows nothing but its own messages;
* answers every request without a 500.

The run is random: its seed is printed on failure. When hunting bugs,
``TIDINGS_BACKUP_MODEL_SEED`` sets the seed, ``TIDINGS_BACKUP_MODEL_ROUNDS`` runs more
rounds (a fresh live server each), ``TIDINGS_BACKUP_MODEL_BACKUPS`` takes more backups
per round, ``TIDINGS_BACKUP_MODEL_WORKERS`` runs more clients and
``TIDINGS_BACKUP_MODEL_SNAPSHOT_EVERY`` sets the live server's ``tx_snapshot_every``
(else drawn from the seed).
"""

from __future__ import annotations

import base64
import copy
import errno
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import tidings.backup
from tests.e2e.serverproc import ServerProcess
from tidings.cli import main
from tidings.store.backends.lmdb import LmdbStore
from tidings.tx.log import HEADER, frame, read_log, tail_index, tail_key

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("TIDINGS_BACKUP_MODEL_SEED", str(random.randrange(1 << 30))))
ROUNDS = int(os.environ.get("TIDINGS_BACKUP_MODEL_ROUNDS", "1"))
BACKUPS = int(os.environ.get("TIDINGS_BACKUP_MODEL_BACKUPS", "2"))
WORKERS = int(os.environ.get("TIDINGS_BACKUP_MODEL_WORKERS", "3"))
TOPICS = ("a", "b")
QUEUE = "q"
#: Long enough that no transaction of the run times out by itself.
LONG = 600
NS = "/v1/namespaces/default"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hex_id(b64_id: str) -> str:
    return base64.b64decode(b64_id).hex()


@dataclass
class Model:
    """What the live server acknowledged; a copy is taken as each backup begins."""

    #: Payloads of acknowledged non-transactional publishes, per topic.
    plain: dict[str, list[bytes]] = field(default_factory=lambda: {t: [] for t in TOPICS})
    #: Transactions (by tag) whose commit / abort was acknowledged.
    committed: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    #: Transactions that published nothing (a group position or acks only).
    silent: set[str] = field(default_factory=set)
    #: Write pointers of transactions whose begin was acknowledged, by tag.
    pointers: dict[str, int] = field(default_factory=dict)
    #: (producer id, topic) -> last acknowledged sequence and its payload.
    idempotent: dict[tuple[str, str], tuple[int, bytes]] = field(default_factory=dict)
    #: Group -> the last acknowledged committed position (hex id).
    positions: dict[str, str] = field(default_factory=dict)
    #: Queue messages acked for good (hex ids), and by which consumer.
    acked: dict[str, str] = field(default_factory=dict)
    #: Topics created (and published to) and not yet asked to be deleted; deleted ones.
    created: dict[str, bytes] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)


@dataclass
class Run:
    url: str
    model: Model = field(default_factory=Model)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    surprises: list[str] = field(default_factory=list)


class Surprise(Exception):
    pass


def _ok(answer: httpx.Response, *expected: int) -> httpx.Response:
    if answer.status_code >= 500 or (expected and answer.status_code not in expected):
        raise Surprise(
            f"{answer.request.method} {answer.request.url.path}: "
            f"{answer.status_code} {answer.text[:300]}"
        )
    return answer


def _worker(run: Run, n: int, seed: int) -> None:
    rng = random.Random(seed)
    pid = f"{n:02x}" + "cd" * 15
    sequences: dict[str, int] = {}
    group = f"g{n}"
    consumer = f"w{n}"
    leased: list[str] = []  # b64 ids of queue messages this worker holds
    with httpx.Client(base_url=run.url + NS, timeout=30) as http:
        member = _ok(http.post("/topics/b/groups/" + group + "/join", json={"partitions": 1}), 200)
        member_id = member.json()["memberId"]
        for i in range(100_000):  # bounded; the stop event ends it long before
            if run.stop.is_set():
                return
            tag = f"w{n}i{i}"
            try:
                _step(run, http, rng, tag, pid, sequences, group, member_id, consumer, leased)
            except (Surprise, httpx.HTTPError) as exc:
                with run.lock:
                    run.surprises.append(f"{tag}: {exc!r}")
                return


def _step(
    run: Run,
    http: httpx.Client,
    rng: random.Random,
    tag: str,
    pid: str,
    sequences: dict[str, int],
    group: str,
    member_id: str,
    consumer: str,
    leased: list[str],
) -> None:
    model = run.model
    roll = rng.random()
    if roll < 0.12:
        topic = rng.choice(TOPICS)
        payload = f"{tag}:plain".encode()
        _ok(http.post(f"/topics/{topic}/publish", json={"messages": [b64(payload)]}), 200)
        with run.lock:
            model.plain[topic].append(payload)
    elif roll < 0.27:
        topic = rng.choice(TOPICS)
        sequence = sequences.get(topic, -1) + 1
        payload = f"{tag}:idem:{sequence}".encode()
        _ok(
            http.post(
                f"/topics/{topic}/publish",
                json={"messages": [b64(payload)]},
                headers={"Tidings-Producer-Id": pid, "Tidings-Sequence": str(sequence)},
            ),
            200,
        )
        sequences[topic] = sequence
        with run.lock:
            model.plain[topic].append(payload)
            model.idempotent[(pid, topic)] = (sequence, payload)
    elif roll < 0.42:
        # A transaction of several calls: begin, publish to both topics, then end it.
        began = _ok(httpx.post(run.url + "/v1/transactions", json={"timeout": LONG}), 200)
        wp = began.json()["writePointer"]
        with run.lock:
            model.pointers[tag] = wp
        answers: list[tuple[str, httpx.Response]] = []
        # Some only move a group position or ack: no message names their pointer.
        silent = rng.random() < 0.25
        if silent:
            with run.lock:
                model.silent.add(tag)
        for topic in () if silent else TOPICS:
            body = {"messages": [b64(f"{tag}:tx:{topic}".encode())], "transactionWritePointer": wp}
            answers.append((topic, _ok(http.post(f"/topics/{topic}/publish", json=body), 200)))
        # Its group position and queue acks count if and only if it commits.
        changes: list[str] = []
        position = None
        if rng.random() < 0.4:
            poll = {"memberId": member_id, "limit": 5}
            page = _ok(http.post(f"/topics/b/groups/{group}/poll", json=poll), 200).json()
            if page:
                position = page[-1]["id"]
                commit = {
                    "memberId": member_id,
                    "positions": [{"partition": 0, "id": position}],
                    "transactionWritePointer": wp,
                }
                answer = _ok(http.post(f"/topics/b/groups/{group}/commit", json=commit), 200)
                changes += answer.json()["changes"]
        acks = leased[: rng.randint(0, 2)] if rng.random() < 0.4 else []
        if acks:
            del leased[: len(acks)]
            ack = {"consumerId": consumer, "ids": acks, "transactionWritePointer": wp}
            _ok(http.post(f"/topics/a/queues/{QUEUE}/ack", json=ack), 200)
        end = rng.random()
        if end < 0.6:
            commit_body = {"changes": changes}
            _ok(httpx.post(f"{run.url}/v1/transactions/{wp}/commit", json=commit_body), 200)
            with run.lock:
                model.committed.add(tag)
                if position is not None:
                    model.positions[group] = hex_id(position)
                for m in acks:
                    model.acked[hex_id(m)] = consumer
        elif end < 0.85 or position is not None:
            # As the clients do: roll back first, else the abort shows the entries.
            for topic, answer in answers:
                _ok(http.post(f"/topics/{topic}/rollback", content=answer.content), 200)
            rollback = {"transactionWritePointer": wp, "memberId": member_id}
            _ok(http.post(f"/topics/b/groups/{group}/rollback", json=rollback), 200)
            if acks:
                rollback = {"transactionWritePointer": wp}
                _ok(http.post(f"/topics/a/queues/{QUEUE}/rollback", json=rollback), 200)
            _ok(httpx.post(f"{run.url}/v1/transactions/{wp}/abort", json={}), 200)
            with run.lock:
                model.aborted.add(tag)
        # else: left open (never with a group position: it would hold the partition).
    elif roll < 0.55:
        # A transaction in one request, with a group commit and/or queue acks.
        body: dict[str, Any] = {
            "topics": [{"topic": t, "messages": [b64(f"{tag}:tx:{t}".encode())]} for t in TOPICS],
            "timeout": LONG,
        }
        position = None
        if rng.random() < 0.5:
            page = _ok(
                http.post(
                    f"/topics/b/groups/{group}/poll", json={"memberId": member_id, "limit": 5}
                ),
                200,
            )
            if page.json():
                position = page.json()[-1]["id"]
                body["groupCommits"] = [
                    {
                        "topic": "b",
                        "group": group,
                        "memberId": member_id,
                        "positions": [{"partition": 0, "id": position}],
                    }
                ]
        acks = leased[: rng.randint(0, 2)] if rng.random() < 0.5 else []
        if acks:
            body["acks"] = [{"topic": "a", "queue": QUEUE, "consumerId": consumer, "ids": acks}]
        answer = _ok(httpx.post(f"{run.url}{NS}/transactions/publish", json=body, timeout=30), 200)
        del leased[: len(acks)]
        with run.lock:
            model.pointers[tag] = answer.json()["writePointer"]
            model.committed.add(tag)
            if position is not None:
                model.positions[group] = hex_id(position)
            for ack in acks:
                model.acked[hex_id(ack)] = consumer
    elif roll < 0.65:
        page = _ok(
            http.post(f"/topics/b/groups/{group}/poll", json={"memberId": member_id, "limit": 5}),
            200,
        )
        if page.json():
            position = page.json()[-1]["id"]
            commit = {"memberId": member_id, "positions": [{"partition": 0, "id": position}]}
            _ok(http.post(f"/topics/b/groups/{group}/commit", json=commit), 200)
            with run.lock:
                model.positions[group] = hex_id(position)
    elif roll < 0.82:
        popped = _ok(
            http.post(
                f"/topics/a/queues/{QUEUE}/pop",
                json={"consumerId": consumer, "maxMessages": 3, "ackTimeoutMs": LONG * 1000},
            ),
            200,
        )
        leased.extend(m["id"] for m in popped.json())
        if leased and rng.random() < 0.6:
            ids = leased[: rng.randint(1, len(leased))]
            del leased[: len(ids)]
            if rng.random() < 0.7:
                _ok(
                    http.post(
                        f"/topics/a/queues/{QUEUE}/ack", json={"consumerId": consumer, "ids": ids}
                    ),
                    200,
                )
                with run.lock:
                    for m in ids:
                        model.acked[hex_id(m)] = consumer
            else:
                _ok(
                    http.post(
                        f"/topics/a/queues/{QUEUE}/nack", json={"consumerId": consumer, "ids": ids}
                    ),
                    200,
                )
    elif roll < 0.92:
        with run.lock:
            mine = [t for t in model.created if t.startswith(f"c-{consumer}-")]
        if mine and rng.random() < 0.5:
            topic = rng.choice(mine)
            with run.lock:
                del model.created[topic]
                model.deleting.add(topic)
            _ok(http.delete(f"/topics/{topic}"), 200)
            with run.lock:
                model.deleted.add(topic)
        else:
            topic = f"c-{consumer}-{tag}"
            _ok(http.put(f"/topics/{topic}"), 200)
            payload = f"{tag}:churn".encode()
            _ok(http.post(f"/topics/{topic}/publish", json={"messages": [b64(payload)]}), 200)
            with run.lock:
                model.created[topic] = payload
    else:
        _ok(http.post("/topics/r/publish", json={"messages": [b64(f"{tag}:ttl".encode())]}), 200)


def _read_all(http: httpx.Client, topic: str) -> list[bytes]:
    """Every committed message of the topic, in order."""
    got: list[bytes] = []
    after: str | None = None
    for _ in range(10_000):
        body: dict[str, Any] = {"limit": 1000}
        if after is not None:
            body.update(startFrom=after, inclusive=False)
        page = _ok(http.post(f"/topics/{topic}/poll?isolation=read_committed", json=body), 200)
        page = page.json()
        if not page:
            return got
        got += [base64.b64decode(m["payload"]) for m in page]
        after = page[-1]["id"]
    raise AssertionError("the topic does not end")


def _check_copy(restored: ServerProcess, before: Model, during: Model, after: Model) -> list[str]:
    """What the copy breaks of the model: ``before`` as the backup began, ``during``
    as it ended, ``after`` at the end of the run."""
    wrong: list[str] = []
    url = restored.url
    with httpx.Client(base_url=url + NS, timeout=30) as http:
        _ok(httpx.get(url + "/readyz"), 200)
        state = _ok(httpx.get(url + "/v1/transactions"), 200).json()
        # Open ones are invalidated in the copy: what they published after the backup
        # is not in it.
        if state["inProgress"]:
            wrong.append(f"open in the copy: {state['inProgress'][:5]}")

        left_open = set(before.pointers) - after.committed - after.aborted
        for tag in sorted(left_open)[:5]:
            wp = before.pointers[tag]
            answer = _ok(httpx.post(f"{url}/v1/transactions/{wp}/commit", json={}), 410)
            if answer.json().get("type") != "TransactionInvalid":
                wrong.append(f"commit of {tag}, open at the backup: {answer.text}")

        seen = {t: _read_all(http, t) for t in TOPICS}
        for topic in TOPICS:
            counts = Counter(seen[topic])
            twice = [p for p, c in counts.items() if c > 1]
            if twice:
                wrong.append(f"{topic}: written twice: {twice[:5]}")
            missing = [p for p in before.plain[topic] if p not in counts]
            if missing:
                wrong.append(f"{topic}: acknowledged before the backup, missing: {missing[:5]}")
        shown = {t: {p.split(b":tx:")[0].decode() for p in seen[t] if b":tx:" in p} for t in TOPICS}
        half = shown["a"] ^ shown["b"]
        if half:
            wrong.append(f"half a transaction: {sorted(half)[:5]}")
        lost = before.committed - before.silent - shown["a"]
        if lost:
            wrong.append(f"committed before the backup, missing: {sorted(lost)[:5]}")
        back = before.aborted & (shown["a"] | shown["b"])
        if back:
            wrong.append(f"aborted before the backup, visible: {sorted(back)[:5]}")
        never = (shown["a"] | shown["b"]) - after.committed
        if never:
            wrong.append(f"visible, never committed: {sorted(never)[:5]}")

        newest_b = _ok(http.get("/topics/b/end"), 200).json()["newestId"]
        for group, position in before.positions.items():
            info = _ok(http.get(f"/topics/b/groups/{group}"), 200).json()
            now = info["partitions"][0]["position"]
            if now is None or now < position:
                wrong.append(
                    f"group {group}: position {now} before the acknowledged {position}: {info}"
                )
            elif newest_b is None or now > newest_b:
                wrong.append(f"group {group}: position {now} past the newest message {newest_b}")

        # Acks acknowledged before the backup stay acked: never delivered again, and
        # an ack sent again is answered as done.
        redelivered: list[str] = []
        for _ in range(200):
            popped = _ok(
                http.post(
                    f"/topics/a/queues/{QUEUE}/pop",
                    json={"consumerId": "checker", "maxMessages": 100, "ackTimeoutMs": 600_000},
                ),
                200,
            ).json()
            if not popped:
                break
            redelivered += [hex_id(m["id"]) for m in popped if hex_id(m["id"]) in before.acked]
        if redelivered:
            wrong.append(f"acked before the backup, delivered again: {redelivered[:5]}")
        for ack, consumer in list(before.acked.items())[:20]:
            again = {"consumerId": consumer, "ids": [b64(bytes.fromhex(ack))]}
            answer = http.post(f"/topics/a/queues/{QUEUE}/ack", json=again)
            if answer.status_code != 200:
                wrong.append(f"ack of {ack} sent again: {answer.status_code} {answer.text}")

        for topic, payload in before.created.items():
            if topic in during.deleting:
                continue
            if _read_all(http, topic) != [payload]:
                wrong.append(f"topic {topic} created before the backup: not as it was")
        for topic in before.deleted:
            if http.get(f"/topics/{topic}").status_code != 404:
                wrong.append(f"topic {topic} deleted before the backup is back")
        _ok(http.post("/topics/r/poll", json={"limit": 10}), 200)

        # Idempotent producers: a batch acknowledged before the backup, sent again, is
        # not written again; the next after the last the run sent is written, or
        # refused with OutOfOrderSequence (the copy's record is older) and not written.
        extra: dict[str, list[bytes]] = {t: [] for t in TOPICS}
        for (pid, topic), (sequence, payload) in before.idempotent.items():
            headers = {"Tidings-Producer-Id": pid, "Tidings-Sequence": str(sequence)}
            body = {"messages": [b64(payload)]}
            _ok(http.post(f"/topics/{topic}/publish", json=body, headers=headers), 200)
            last = after.idempotent[(pid, topic)][0]
            headers["Tidings-Sequence"] = str(last + 1)
            nxt = f"next:{pid}:{topic}".encode()
            answer = _ok(
                http.post(
                    f"/topics/{topic}/publish", json={"messages": [b64(nxt)]}, headers=headers
                ),
                200,
                409,
            )
            if answer.status_code == 200:
                extra[topic].append(nxt)
            elif answer.json().get("type") != "OutOfOrderSequence":
                wrong.append(f"next idempotent publish: {answer.text}")

        # New transactions get pointers above every one begun before the backup, and
        # show nothing but their own messages.
        highest = max(before.pointers.values(), default=0)
        for i in range(20):
            wp = _ok(httpx.post(url + "/v1/transactions", json={"timeout": LONG}), 200).json()[
                "writePointer"
            ]
            if wp <= highest:
                wrong.append(f"write pointer {wp} handed out again (one begun before: {highest})")
            for topic in TOPICS:
                body = {
                    "messages": [b64(f"after{i}:tx:{topic}".encode())],
                    "transactionWritePointer": wp,
                }
                _ok(http.post(f"/topics/{topic}/publish", json=body), 200)
                extra[topic].append(f"after{i}:tx:{topic}".encode())
            _ok(httpx.post(f"{url}/v1/transactions/{wp}/commit", json={}), 200)
        for topic in TOPICS:
            now = _read_all(http, topic)
            if now != seen[topic] + extra[topic]:
                wrong.append(
                    f"{topic}: after new transactions: {set(now) ^ set(seen[topic] + extra[topic])}"
                )
    return wrong


def _backup(data_dir: Path, dest: Path, pause: float | None) -> tuple[int, str, str]:
    """The real command: in its own process, or (``pause``) in this one, pausing that
    long between copying the log and copying the store, as a large store's copy takes
    time while the server goes on."""
    if pause is None:
        done = subprocess.run(
            [sys.executable, "-m", "tidings", "backup", str(data_dir), str(dest)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        return done.returncode, done.stdout, done.stderr
    copy_tx = tidings.backup._copy_tx_files

    def slow_copy(source: Path, target: Path) -> dict[int, int]:
        logs = copy_tx(source, target)
        time.sleep(pause)
        return logs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tidings.backup, "_copy_tx_files", slow_copy)
        result = CliRunner().invoke(main, ["backup", str(data_dir), str(dest)])
    return result.exit_code, result.stdout, f"{result.stderr} {result.exception!r}"


def _round(start_server: Callable[..., ServerProcess], tmp_path: Path, seed: int) -> list[str]:
    rng = random.Random(seed)
    tmp_path.mkdir(parents=True)
    # Small values roll the log over to new generations (and delete the old files)
    # while the backups copy it.
    every = os.environ.get("TIDINGS_BACKUP_MODEL_SNAPSHOT_EVERY") or str(
        rng.choice((20, 100, 10_000))
    )
    live = start_server(data_dir=tmp_path / "live", TIDINGS_TX_SNAPSHOT_EVERY=every)
    for topic in TOPICS:
        _ok(httpx.put(f"{live.url}{NS}/topics/{topic}"), 200)
    _ok(httpx.put(f"{live.url}{NS}/topics/r", json={"ttl": 1}), 200)
    run = Run(live.url)
    workers = [
        threading.Thread(target=_worker, args=(run, n, rng.randrange(1 << 30)), daemon=True)
        for n in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    copies: list[tuple[Path, Model, Model]] = []
    try:
        for k in range(BACKUPS):
            # Sometimes at once: the log is copied before the first begin, whose
            # pointer then follows the clock, far above the log's last one.
            time.sleep(0.0 if k == 0 and rng.random() < 0.3 else rng.uniform(0.2, 1.5))
            with run.lock:
                before = copy.deepcopy(run.model)
            dest = tmp_path / f"copy{k}"
            pause = None if rng.random() < 0.4 else rng.uniform(0.0, 0.8)
            code, out, err = _backup(live.data_dir, dest, pause)
            with run.lock:
                during = copy.deepcopy(run.model)
            assert code == 0, f"seed {SEED}: {err}"
            assert "backed up" in out, out
            copies.append((dest, before, during))
        time.sleep(rng.uniform(0.0, 0.5))
    finally:
        run.stop.set()
        for worker in workers:
            worker.join(60)
    assert not run.surprises, run.surprises[:5]
    wrong: list[str] = []
    for dest, before, during in copies:
        restored = start_server(data_dir=dest)
        wrong += [f"{dest.name}: {w}" for w in _check_copy(restored, before, during, run.model)]
        restored.stop()
        log = restored.log_path.read_text() if restored.log_path else ""
        if "Traceback" in log:
            wrong.append(f"{dest.name}: the restored server logged a traceback: {log[-2000:]}")
    live.stop()
    return wrong


def test_backups_under_load_restore_what_was_acknowledged(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    for r in range(ROUNDS):
        wrong = _round(start_server, tmp_path / f"round{r}", SEED + r)
        assert not wrong, f"seed {SEED} round {r}: {wrong}"


# --- a backup that cannot be written -------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data directory with a store and a transaction log, its server stopped."""
    live = ServerProcess(tmp_path_factory.mktemp("backup-source") / "data").start()
    try:
        _ok(httpx.put(f"{live.url}{NS}/topics/a"), 200)
        body = {"messages": [b64(b"x")]}
        _ok(httpx.post(f"{live.url}{NS}/topics/a/publish", json=body), 200)
        began = _ok(httpx.post(live.url + "/v1/transactions", json={}), 200)
        wp = began.json()["writePointer"]
        _ok(httpx.post(f"{live.url}/v1/transactions/{wp}/commit", json={}), 200)
    finally:
        live.stop()
    yield live.data_dir


def _out_of_space(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("fails", ["_copy_tx_files", "_trim_carried", "_fence_unknown_pointers"])
@pytest.mark.parametrize("existing", [False, True])
def test_a_backup_that_runs_out_of_space_leaves_nothing_that_looks_whole(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str, existing: bool
) -> None:
    dest = tmp_path / "dest"
    if existing:
        dest.mkdir()  # an empty directory (a mount point, say) is kept, empty
    real = getattr(tidings.backup, fails)

    def fail_after(*args: Any) -> Any:
        real(*args)  # what it wrote stays behind unless the command clears it
        _out_of_space()

    monkeypatch.setattr(tidings.backup, fails, fail_after)
    result = CliRunner().invoke(main, ["backup", str(data_dir), str(dest)])
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stderr.startswith("Error: cannot back up")
    assert "No space left on device" in result.stderr and "Traceback" not in result.output
    assert (list(dest.iterdir()) == []) if existing else not dest.exists()

    # Nothing is in the way of the next attempt, and that one is whole.
    monkeypatch.setattr(tidings.backup, fails, real)
    again = CliRunner().invoke(main, ["backup", str(data_dir), str(dest)])
    assert again.exit_code == 0, (again.output, again.exception)
    assert sorted(p.name for p in dest.iterdir()) == ["store", "tx"]


def test_a_backup_into_a_place_it_cannot_write_says_so(data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(main, ["backup", str(data_dir), str(tmp_path / "file" / "dest")])
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stderr.startswith("Error: cannot back up") and "Traceback" not in result.output
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_backup_into_a_read_only_directory_says_so(data_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    dest.chmod(0o555)
    try:
        result = CliRunner().invoke(main, ["backup", str(data_dir), str(dest)])
    finally:
        dest.chmod(0o755)
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stderr.startswith("Error: cannot back up") and "Traceback" not in result.output
    assert list(dest.iterdir()) == []


def test_an_interrupted_backup_is_not_taken_for_a_whole_one(data_dir: Path, tmp_path: Path) -> None:
    # Killed before the copy was whole (kill -9, power loss: nothing cleans up), here
    # just before its last step: DEST holds no store/ or tx/ a server would start on
    # as a backup, and a new backup into it refuses.
    dest = tmp_path / "dest"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys, tidings.backup as b, tidings.cli as c\n"
            "b._fence_unknown_pointers = lambda *a: os._exit(9)\n"
            "c.main(['backup', sys.argv[1], sys.argv[2]])\n",
            str(data_dir),
            str(dest),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert killed.returncode == 9, killed.stderr
    assert not (dest / "store").exists() and not (dest / "tx").exists()
    result = CliRunner().invoke(main, ["backup", str(data_dir), str(dest)])
    assert result.exit_code == 2 and "is not empty" in result.stderr


# --- transactions the copied log does not know -------------------------------------


def test_group_positions_and_acks_of_a_transaction_begun_during_the_backup_stay_uncommitted(
    start_server: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A transaction that began after the log was copied, past the log's reservation of
    # pointers, and wrote no message, only a group position and queue acks: the store
    # copy holds them under a pointer the copied log never names. The restored server
    # counted them as committed (the group moved on, the messages were never delivered
    # again) though the transaction never committed anywhere.
    live = start_server(data_dir=tmp_path / "live")
    url = live.url + NS
    _ok(httpx.put(url + "/topics/t"), 200)
    body = {"messages": [b64(b"m%d" % i) for i in range(3)]}
    _ok(httpx.post(url + "/topics/t/publish", json=body), 200)
    join = _ok(httpx.post(url + "/topics/t/groups/g/join", json={"partitions": 1}), 200)
    member = join.json()["memberId"]
    page = _ok(httpx.post(url + "/topics/t/groups/g/poll", json={"memberId": member}), 200)
    pop = {"consumerId": "w", "maxMessages": 3, "ackTimeoutMs": 500}
    popped = _ok(httpx.post(url + "/topics/t/queues/q/pop", json=pop), 200).json()
    assert len(page.json()) == 3 and len(popped) == 3
    copy_tx = tidings.backup._copy_tx_files

    def copy_then_transact(source: Path, target: Path) -> dict[int, int]:
        logs = copy_tx(source, target)
        # Past the pointers the copied log reserved: those recovery invalidates anyway.
        for _ in range(200):
            wp = _ok(httpx.post(live.url + "/v1/transactions", json={}), 200).json()
            _ok(httpx.post(f"{live.url}/v1/transactions/{wp['writePointer']}/commit"), 200)
        began = _ok(httpx.post(live.url + "/v1/transactions", json={"timeout": LONG}), 200)
        wp = began.json()["writePointer"]
        position = [{"partition": 0, "id": page.json()[-1]["id"]}]
        commit = {"memberId": member, "positions": position, "transactionWritePointer": wp}
        _ok(httpx.post(url + "/topics/t/groups/g/commit", json=commit), 200)
        ids = [m["id"] for m in popped]
        ack = {"consumerId": "w", "ids": ids, "transactionWritePointer": wp}
        _ok(httpx.post(url + "/topics/t/queues/q/ack", json=ack), 200)
        return logs

    monkeypatch.setattr(tidings.backup, "_copy_tx_files", copy_then_transact)
    result = CliRunner().invoke(main, ["backup", str(live.data_dir), str(tmp_path / "copy")])
    assert result.exit_code == 0, (result.output, result.exception)

    restored = start_server(data_dir=tmp_path / "copy")
    url = restored.url + NS
    # A transaction committed after the restore: the old pointer is not taken for one.
    began = _ok(httpx.post(restored.url + "/v1/transactions", json={}), 200).json()
    _ok(httpx.post(f"{restored.url}/v1/transactions/{began['writePointer']}/commit"), 200)
    group = _ok(httpx.get(url + "/topics/t/groups/g"), 200).json()
    assert group["partitions"][0]["position"] is None
    time.sleep(0.6)  # the leases run out: the messages are the queue's again
    pop = {"consumerId": "x", "maxMessages": 3}
    again = _ok(httpx.post(url + "/topics/t/queues/q/pop", json=pop), 200).json()
    assert sorted(m["id"] for m in again) == sorted(m["id"] for m in popped)


def test_a_copy_of_a_quiet_server_starts_after_a_transaction_began_during_its_backup(
    start_server: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No transaction since the server started: the first one's pointer follows the
    # clock, far above the last one the copied log names. The copy fenced every pointer
    # in between, and the restored server, invalidating them one by one, ran out of
    # memory and did not start.
    live = start_server(data_dir=tmp_path / "live")
    url = live.url + NS
    _ok(httpx.put(url + "/topics/t"), 200)
    copy_tx = tidings.backup._copy_tx_files
    began: list[int] = []

    def copy_then_begin(source: Path, target: Path) -> dict[int, int]:
        logs = copy_tx(source, target)
        answer = _ok(httpx.post(live.url + "/v1/transactions", json={"timeout": LONG}), 200)
        began.append(answer.json()["writePointer"])
        body = {"messages": [b64(b"during")], "transactionWritePointer": began[0]}
        _ok(httpx.post(url + "/topics/t/publish", json=body), 200)
        return logs

    monkeypatch.setattr(tidings.backup, "_copy_tx_files", copy_then_begin)
    result = CliRunner().invoke(main, ["backup", str(live.data_dir), str(tmp_path / "copy")])
    assert result.exit_code == 0, (result.output, result.exception)

    restored = start_server(data_dir=tmp_path / "copy")
    state = _ok(httpx.get(restored.url + "/v1/transactions"), 200).json()
    assert began[0] in state["invalid"] and state["lastWritePointer"] >= began[0]
    answer = _ok(httpx.post(restored.url + "/v1/transactions", json={}), 200).json()
    assert answer["writePointer"] > began[0]
    _ok(httpx.post(f"{restored.url}/v1/transactions/{answer['writePointer']}/commit"), 200)
    with httpx.Client(base_url=restored.url + NS) as http:
        assert _read_all(http, "t") == []


def test_a_group_position_committed_again_during_the_backup_is_not_lost(
    start_server: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The position committed before the backup began was replaced in the live store
    # by a newer one while the store was being copied; the newer one's transaction is
    # one the copied log does not know, so it does not count in the copy. The restored
    # group had no position at all and its consumers read the topic again from the
    # start.
    live = start_server(data_dir=tmp_path / "live")
    url = live.url + NS
    _ok(httpx.put(url + "/topics/t"), 200)
    body = {"messages": [b64(b"m%d" % i) for i in range(4)]}
    _ok(httpx.post(url + "/topics/t/publish", json=body), 200)
    join = _ok(httpx.post(url + "/topics/t/groups/g/join", json={"partitions": 1}), 200)
    member = join.json()["memberId"]
    poll = {"memberId": member, "limit": 2}
    first = _ok(httpx.post(url + "/topics/t/groups/g/poll", json=poll), 200).json()
    commit = {"memberId": member, "positions": [{"partition": 0, "id": first[-1]["id"]}]}
    _ok(httpx.post(url + "/topics/t/groups/g/commit", json=commit), 200)
    copy_tx = tidings.backup._copy_tx_files

    def copy_then_commit(source: Path, target: Path) -> dict[int, int]:
        logs = copy_tx(source, target)
        later = _ok(httpx.post(url + "/topics/t/groups/g/poll", json=poll), 200).json()
        commit = {"memberId": member, "positions": [{"partition": 0, "id": later[-1]["id"]}]}
        _ok(httpx.post(url + "/topics/t/groups/g/commit", json=commit), 200)
        # The next commit's write drops the replaced record (as any later group write).
        _ok(httpx.post(url + "/topics/t/groups/g/commit", json=commit), 200)
        return logs

    monkeypatch.setattr(tidings.backup, "_copy_tx_files", copy_then_commit)
    result = CliRunner().invoke(main, ["backup", str(live.data_dir), str(tmp_path / "copy")])
    assert result.exit_code == 0, (result.output, result.exception)

    restored = start_server(data_dir=tmp_path / "copy")
    group = _ok(httpx.get(restored.url + NS + "/topics/t/groups/g"), 200).json()
    assert group["partitions"][0]["position"] == hex_id(first[-1]["id"])


def test_a_transaction_open_at_the_backup_cannot_commit_half_of_itself_in_the_copy(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # Open when the backup was taken; it published again afterwards, which the copy
    # lacks. The restored server took the commit and showed the first half alone.
    live = start_server(data_dir=tmp_path / "live")
    url = live.url + NS
    _ok(httpx.put(url + "/topics/t"), 200)
    began = _ok(httpx.post(live.url + "/v1/transactions", json={"timeout": LONG}), 200)
    wp = began.json()["writePointer"]
    first = {"messages": [b64(b"first")], "transactionWritePointer": wp}
    _ok(httpx.post(url + "/topics/t/publish", json=first), 200)
    result = CliRunner().invoke(main, ["backup", str(live.data_dir), str(tmp_path / "copy")])
    assert result.exit_code == 0, (result.output, result.exception)
    second = {"messages": [b64(b"second")], "transactionWritePointer": wp}
    _ok(httpx.post(url + "/topics/t/publish", json=second), 200)

    restored = start_server(data_dir=tmp_path / "copy")
    commit = httpx.post(f"{restored.url}/v1/transactions/{wp}/commit", json={})
    assert commit.status_code == 410 and commit.json()["type"] == "TransactionInvalid"
    with httpx.Client(base_url=restored.url + NS) as http:
        assert _read_all(http, "t") == []


def test_a_commit_the_log_file_got_only_after_it_was_copied_survives_a_new_generation(
    start_server: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A transaction in one request, acknowledged before the backup began: its commit
    # was durable as a record the store carried, the log file getting it at a later
    # flush, after the file was copied (here: the copied file is cut back to before
    # it). Then the log started a new generation, which dropped the carried records
    # from the live store, before the store was copied. The copy lost the commit.
    live = start_server(data_dir=tmp_path / "live", TIDINGS_TX_SNAPSHOT_EVERY="5")
    url = live.url + NS
    _ok(httpx.put(url + "/topics/t"), 200)
    one = {"topics": [{"topic": "t", "messages": [b64(b"acked")]}]}
    _ok(httpx.post(url + "/transactions/publish", json=one), 200)
    copy_tx = tidings.backup._copy_tx_files

    def copy_lagging_file(source: Path, target: Path) -> dict[int, int]:
        logs = copy_tx(source, target)
        newest = max(logs)
        path = target / f"wal-{newest:020d}.log"
        store = LmdbStore(source.parent / "store", readonly=True)
        with store.read() as view:
            scan = view.scan("tx", tail_key(newest, 0), tail_key(newest + 1, 0))
            carried = [tail_index(bytes(key))[1] for key, _ in scan]
        store.close()
        assert carried
        # The file as it was before the flush that wrote the carried records.
        records = list(read_log(path))[: min(carried) - 1]
        path.write_bytes(HEADER + b"".join(frame(r) for r in records))
        later = {"topics": [{"topic": "t", "messages": [b64(b"later")]}]}
        for _ in range(10):  # past tx_snapshot_every: a new generation
            _ok(httpx.post(url + "/transactions/publish", json=later), 200)
        return {**logs, newest: len(records)}

    monkeypatch.setattr(tidings.backup, "_copy_tx_files", copy_lagging_file)
    result = CliRunner().invoke(main, ["backup", str(live.data_dir), str(tmp_path / "copy")])
    assert result.exit_code == 0, (result.output, result.exception)

    restored = start_server(data_dir=tmp_path / "copy")
    with httpx.Client(base_url=restored.url + NS) as http:
        assert b"acked" in _read_all(http, "t")

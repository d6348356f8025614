"""kill -9 of a server during a stream of one-request transactions, whose commits are
made durable by the store write of their messages (one fsync, not two).

Acknowledged transactions must be whole and committed after the restart, although the
transaction log file may lack their commit records (store writes carried them); no
transaction may show in part.
A reader checks that nothing shows in part while the server lives.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import TidingsError
from tidings.store.backends.lmdb import LmdbStore
from tidings.tx.log import TAIL_PREFIX, read_log
from tidings.tx.records import Commit, decode_record

#: Messages per transaction on each topic.
PER_TOPIC = 3


def _stream(
    url: str, n: int, outcomes: dict[str, str], pointers: dict[str, int], stop: threading.Event
) -> None:
    with Client(url) as client:
        for i in range(100_000):  # bounded; the kill ends it long before
            if stop.is_set():
                return
            tag = f"w{n}-{i}"
            outcomes[tag] = "unknown"  # until the server answers
            try:
                # No participants of the client's own: the whole transaction is one
                # request (begin, publish both topics, commit on the server).
                with client.transaction() as tx:
                    tx.publish("a", [f"{tag}:a{j}".encode() for j in range(PER_TOPIC)])
                    tx.publish("b", [f"{tag}:b{j}".encode() for j in range(PER_TOPIC)])
                outcomes[tag] = "committed"
                pointers[tag] = tx.write_pointer
            except (TidingsError, OSError):
                return  # the server is gone: this one's outcome stays unknown


def _by_tag(client: Client, topic: str, *, transactional: bool = True) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = defaultdict(list)
    for message in client.consume(topic, follow=False, wait=0.5, transactional=transactional):
        out[message.payload.split(b":")[0].decode()].append(message.payload)
    return out


def _expected(tag: str, topic: str) -> list[bytes]:
    return [f"{tag}:{topic}{j}".encode() for j in range(PER_TOPIC)]


def test_kill_9_during_one_request_transactions(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server()
    with Client(srv.url) as admin:
        admin.create_topic("a")
        admin.create_topic("b")
    outcomes: dict[str, str] = {}
    pointers: dict[str, int] = {}
    stop = threading.Event()
    workers = [
        threading.Thread(target=_stream, args=(srv.url, n, outcomes, pointers, stop))
        for n in range(4)
    ]
    for w in workers:
        w.start()
    time.sleep(1.0)
    # While it runs: a read-committed reader sees each transaction whole or not at all
    # (a commit shown before its messages are durable, or on one topic only, fails
    # here). "b" is read after "a", so what was committed for the one is for the other.
    with Client(srv.url) as reader:
        seen_a = _by_tag(reader, "a")
        seen_b = _by_tag(reader, "b")
    assert len(seen_a) > 5, seen_a
    assert set(seen_a) <= set(seen_b), set(seen_a) - set(seen_b)
    for tag, got in seen_a.items():
        assert got == _expected(tag, "a"), (tag, got)
    for tag, got in seen_b.items():
        assert got == _expected(tag, "b"), (tag, got)
    time.sleep(1.0)
    srv.kill()
    stop.set()
    for w in workers:
        w.join(15)
    assert not any(w.is_alive() for w in workers)
    committed = sum(1 for o in outcomes.values() if o == "committed")
    assert committed > 20, outcomes
    # The process died with records only store writes may hold: a role without the
    # store must not start from this directory (it would lose them).
    assert (srv.data_dir / "tx" / "TAIL-IN-STORE").exists()
    in_file = {
        record.write_pointer
        for path in sorted((srv.data_dir / "tx").glob("wal-*.log"))
        for record in map(decode_record, read_log(path))
        if isinstance(record, Commit)
    }
    with LmdbStore(str(srv.data_dir / "store"), readonly=True) as store:
        carried = {
            record.write_pointer
            for _, payload in store.scan_list("tx", TAIL_PREFIX, TAIL_PREFIX + b"\xff")
            for record in [decode_record(bytes(payload))]
            if isinstance(record, Commit)
        }
    # The commits went through the store writes of their messages...
    assert carried, "no commit record was carried by a store write"
    # ... and each acknowledged one is in the file or in the store.
    assert set(pointers.values()) <= in_file | carried
    only_in_store = set(pointers.values()) - in_file

    again = ServerProcess(srv.data_dir).start()
    try:
        with Client(again.url) as client:
            state = client.transactions()
            for wp in state.in_progress:  # what was left open will never commit
                client.invalidate(wp)
            # Everything written, and what a read-committed reader sees.
            on_a = _by_tag(client, "a", transactional=False)
            on_b = _by_tag(client, "b", transactional=False)
            committed_a, committed_b = _by_tag(client, "a"), _by_tag(client, "b")
    finally:
        again.stop()

    assert set(on_a) | set(on_b) <= set(outcomes), "a message nobody published"
    for tag, outcome in outcomes.items():
        whole = on_a.get(tag) == _expected(tag, "a") and on_b.get(tag) == _expected(tag, "b")
        absent = tag not in on_a and tag not in on_b
        visible = committed_a.get(tag) == _expected(tag, "a") and committed_b.get(tag) == _expected(
            tag, "b"
        )
        invisible = tag not in committed_a and tag not in committed_b
        if outcome == "committed":
            # Acknowledged: written and committed (a read-committed reader sees it).
            assert whole and visible, (
                tag,
                pointers[tag] in only_in_store,
                on_a.get(tag),
                committed_a.get(tag),
            )
        else:
            assert whole or absent, (tag, on_a.get(tag), on_b.get(tag))
            assert visible or invisible, (tag, committed_a.get(tag), committed_b.get(tag))

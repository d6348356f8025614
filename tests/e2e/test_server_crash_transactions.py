"""kill -9 of a server in the middle of transactions over two topics.

After a restart every acknowledged commit shows whole on both topics, nothing of an
aborted transaction shows, a transaction whose answer was lost with the server shows
whole or not at all, and no write pointer is handed out again. Half the transactions
take the one-request path (begin, publish both topics, commit on the server), half
begin explicitly; both rely on begins answered before their log record is durable.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import TidingsError


class UserAbort(Exception):
    pass


A_MESSAGES, B_MESSAGES = 3, 2


def _transact(url: str, n: int, outcomes: dict[str, str], pointers: list[int]) -> None:
    rng = random.Random(n)
    with Client(url) as client:
        for i in range(100_000):  # bounded; the kill ends it long before
            tag = f"w{n}-{i}"
            explicit = rng.random() < 0.5
            outcomes[tag] = "unknown"  # until the server answers
            try:
                with client.transaction(defer_begin=not explicit) as tx:
                    tx.publish("a", [f"{tag}:a{j}".encode() for j in range(A_MESSAGES)])
                    tx.publish("b", [f"{tag}:b{j}".encode() for j in range(B_MESSAGES)])
                    if rng.random() < 0.2:
                        raise UserAbort
                outcomes[tag] = "committed"
                pointers.append(tx.write_pointer)
            except UserAbort:
                outcomes[tag] = "aborted"
            except (TidingsError, OSError):
                return  # the server is gone: this one's outcome stays unknown


def _by_tag(client: Client, topic: str) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = defaultdict(list)
    for message in client.consume(topic, follow=False, wait=0.5):
        out[message.payload.split(b":")[0].decode()].append(message.payload)
    return out


def test_kill_9_keeps_transactions_whole(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    with Client(srv.url) as admin:
        admin.create_topic("a")
        admin.create_topic("b")
    outcomes: dict[str, str] = {}
    pointers: list[int] = []
    workers = [
        threading.Thread(target=_transact, args=(srv.url, n, outcomes, pointers)) for n in range(4)
    ]
    for w in workers:
        w.start()
    time.sleep(2.0)
    srv.kill()
    for w in workers:
        w.join(15)
    assert not any(w.is_alive() for w in workers)
    counted = defaultdict(int)
    for outcome in outcomes.values():
        counted[outcome] += 1
    assert counted["committed"] > 20 and counted["aborted"] > 2, counted

    again = ServerProcess(srv.data_dir).start()
    try:
        with Client(again.url) as client:
            state = client.transactions()
            # An operator's step after a crash: what was left open will never commit.
            for wp in state.in_progress:
                client.invalidate(wp)
            fresh = client.begin().write_pointer
            assert fresh > max([state.last_write_pointer, *pointers])
            on_a, on_b = _by_tag(client, "a"), _by_tag(client, "b")
    finally:
        again.stop()

    assert set(on_a) | set(on_b) <= set(outcomes), "a message nobody published"
    for tag, outcome in outcomes.items():
        whole = on_a.get(tag) == [f"{tag}:a{j}".encode() for j in range(A_MESSAGES)] and on_b.get(
            tag
        ) == [f"{tag}:b{j}".encode() for j in range(B_MESSAGES)]
        absent = tag not in on_a and tag not in on_b
        if outcome == "committed":
            assert whole, (tag, on_a.get(tag), on_b.get(tag))
        elif outcome == "aborted":
            assert absent, (tag, on_a.get(tag), on_b.get(tag))
        else:
            assert whole or absent, (tag, on_a.get(tag), on_b.get(tag))

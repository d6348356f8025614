"""The idempotent producers' records the server keeps show in /metrics, and their
expiry bounds them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e

GAUGE = re.compile(r"^tidings_idempotent_producers (\S+)$", re.MULTILINE)


def producers(server: ServerProcess) -> int:
    found = GAUGE.search(httpx.get(f"{server.url}/metrics").text)
    assert found is not None, "no tidings_idempotent_producers in /metrics"
    return int(float(found.group(1)))


def wait_for(server: ServerProcess, expected: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    seen = producers(server)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = producers(server)
    assert seen == expected


def test_producer_records_are_counted_and_expire(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # Each producer id that publishes costs a record per topic until it has been idle
    # for producer_expiry; an operator could not see them pile up (a client made per
    # request makes one per request).
    server = start_server(TIDINGS_PRODUCER_EXPIRY="4", TIDINGS_CLEANUP_INTERVAL="0.2")
    assert producers(server) == 0
    with Client(server.url) as client:
        client.create_topic(topic)
        client.create_topic(topic + "-b")

        def publish(name: str, producer: str, sequence: int) -> None:
            answer = httpx.post(
                f"{server.url}/v1/namespaces/default/topics/{name}/publish",
                json={"messages": ["eA=="]},
                headers={"Tidings-Producer-Id": producer, "Tidings-Sequence": str(sequence)},
            )
            assert answer.status_code == 200, answer.text

        for producer in ("a1" * 16, "b2" * 16, "c3" * 16):
            publish(topic, producer, 0)
        publish(topic, "a1" * 16, 1)  # the same record, moved on
        publish(topic + "-b", "a1" * 16, 0)  # one record per topic
        wait_for(server, 4, 3.5)
        # Idle past the expiry, every record goes: the count falls back to zero.
        wait_for(server, 0, 10.0)
        publish(topic, "a1" * 16, 1)  # forgotten: written again, as a new producer
        assert len(client.poll(topic)) == 5
        wait_for(server, 1, 2.5)

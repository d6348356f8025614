"""A following consumer and a 503 that is an outage (a store out of reach, a cluster
between leaders), not the server saying it takes no snapshots."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from tests.test_client_consumer import FakeClient, messages
from tidings.client import Client, Consumer
from tidings.client.api import PollPage
from tidings.errors import RoleUnavailable, ServiceUnavailable


class FlakyClient(FakeClient):
    """Answers the first ``failures`` polls with ``error``."""

    def __init__(self, error: Exception, failures: int, server_snapshots: bool) -> None:
        super().__init__(messages(3))
        self.error = error
        self.failures = failures
        self.server_snapshots = server_snapshots

    def poll_page(self, topic: str, start: Any, **kw: Any) -> PollPage:
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().poll_page(topic, start, **kw)


@pytest.mark.parametrize("server_snapshots", [True, False])
def test_a_following_consumer_waits_out_a_503_and_keeps_its_snapshots(
    server_snapshots: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidings.client.consumer")
    error = ServiceUnavailable("no instance leads the cluster right now; retry shortly")
    client = FlakyClient(error, 2, server_snapshots)
    consumer = Consumer(cast(Client, client), "t", batch_size=10)
    # Raised at once with client-side snapshots, before (fall_back had nothing to
    # fall back to); with server snapshots, it switched to client-side ones for good.
    assert next(consumer).payload == b"0"
    assert client.polls[-1]["isolation"] == ("read_committed" if server_snapshots else None)
    assert (client.polls[-1]["transaction"] is None) == server_snapshots
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    consumer.close()


def test_a_role_without_snapshots_is_an_answer_not_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tidings.client.consumer")
    client = FlakyClient(RoleUnavailable("no transaction service here"), 1, True)
    consumer = Consumer(cast(Client, client), "t", batch_size=10)
    assert next(consumer).payload == b"0"
    assert client.polls[-1]["transaction"] is not None  # its own snapshots from now on
    assert caplog.records == []  # nothing to warn of
    consumer.close()


def test_an_outage_warns_once_then_each_minute_and_says_when_it_ends(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidings.client import outage as module
    from tidings.errors import TidingsConnectionError

    now = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger="tidings.client.consumer")
    outage = module.Outage("consumer of topic 't'")
    waits = []
    for _ in range(40):  # 40 tries, 5 s apart once the backoff is at its cap
        waits.append(outage.failed(TidingsConnectionError("refused")))
        now[0] += waits[-1]
    assert waits[:3] == [0.1, 0.2, 0.4] and max(waits) == 5.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    elapsed = now[0] - 100.0
    assert len(warnings) == 1 + int(elapsed // module.REMIND_EVERY)
    assert "consumer of topic 't'" in warnings[0] and "refused" in warnings[0]
    assert "still failing after" in warnings[1]
    outage.ended()
    outage.ended()  # once per outage
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "answers again" in infos[0]
    assert outage.failed(TidingsConnectionError("refused")) == 0.1  # a new outage

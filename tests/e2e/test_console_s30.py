"""The web console's Topics page when a row's figures are refused (the driver and page
helpers of test_console.py; skipped without Chromium)."""

from __future__ import annotations

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_console import (  # noqa: F401 (driver, shots: fixtures)
    Console,
    driver,
    shots,
)
from tests.e2e.test_console_s29 import (  # noqa: F401 (console, namespace: fixtures)
    _refusing,
    _stop_refusing,
    console,
    namespace,
)
from tidings import Client

pytestmark = pytest.mark.e2e


def test_a_topic_row_whose_figures_are_refused_shows_the_status(
    console: Console,  # noqa: F811
    server: ServerProcess,
    namespace: str,  # noqa: F811
) -> None:
    """A row of the Topics page whose figures were refused (403) or not available for
    a moment (503) showed the server's message without its status, unlike the
    Consumer groups and Queues sections; a topic deleted meanwhile showed as an error
    row rather than left out."""
    with Client(server.url, namespace) as client:
        for topic in ("open", "locked", "busy", "gone"):
            client.create_topic(topic)
            client.publish(topic, [b"one"])
    identifier = _refusing(
        console,
        (r"/topics/locked/stats$", 403, "Forbidden", "principal 'p' may not consume 'locked'"),
        (r"/topics/busy$", 503, "ServiceUnavailable", "the store is busy"),
        (r"/topics/gone$", 404, "TopicNotFound", "topic gone does not exist"),
    )
    try:
        console.open("#/topics")
        assert "1" in console.wait_for("tr[data-topic=open]").text
        locked = console.find("tr[data-topic=locked] .notice.error").text
        assert locked == "principal 'p' may not consume 'locked' (403)", locked
        busy = console.find("tr[data-topic=busy] .notice.error").text
        assert busy == "the store is busy (503)", busy
        assert console.all("tr[data-topic=gone]") == []
        assert f"3 in {namespace}" in console.text()  # the topics listed
        assert console.find("tr[data-topic=locked] a").text == "locked"  # still a link
        console.shot("s30-topic-rows-refused")
    finally:
        _stop_refusing(console, identifier)
    console.errors()

"""The web console's message browser on payloads at the edges, in a real browser
(the driver and page helpers of test_console.py; skipped without Chromium)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_console import Console, driver, shots  # noqa: F401 (fixtures)
from tidings import Client

pytestmark = pytest.mark.e2e

#: Digits a JavaScript number cannot hold: JSON.parse rounds it to ...67000.
BIG = "12345678901234567890"
PRECISE = "0.10000000000000000555"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("console-review") / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def console(driver: object, server: ServerProcess, shots: Path) -> Console:  # noqa: F811
    return Console(driver, server.url, shots)  # type: ignore[arg-type]


def test_json_payloads_show_their_numbers_as_written(
    console: Console, server: ServerProcess
) -> None:
    """A JSON payload is indented, not re-encoded: a 64-bit id or a decimal with many
    digits used to be shown rounded, so the page showed a value the message does not
    hold."""
    payload = f'{{"id":{BIG},"amount":{PRECISE},"tags":[],"meta":{{}},"s":"a\\"}}b"}}'
    with Client(server.url) as client:
        client.create_topic("numbers")
        client.publish("numbers", [payload.encode()])
    console.open("#/topic/numbers/messages")
    shown = console.wait_for("#messages .payload").text
    assert shown == (
        "{\n"
        f'  "id": {BIG},\n'
        f'  "amount": {PRECISE},\n'
        '  "tags": [],\n'
        '  "meta": {},\n'
        '  "s": "a\\"}b"\n'
        "}"
    )
    assert console.find("#messages .badge.json").text == "JSON"
    console.check_clean("review-json-numbers")

"""The web console at the edges, in a real browser (the driver and page helpers of
test_console.py; skipped without Chromium): JSON payloads with numbers a JavaScript
number cannot hold, a login token the browser cannot send."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_console import (  # noqa: F401 (driver, shots: fixtures)
    WAIT,
    Console,
    Select,
    driver,
    patient_wait,
    shots,
)
from tidings import Client

if TYPE_CHECKING:  # selenium may be missing: test_console then skips this module
    from selenium.webdriver.remote.webdriver import WebDriver

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
def console(driver: WebDriver, server: ServerProcess, shots: Path) -> Console:  # noqa: F811
    return Console(driver, server.url, shots)


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


TOKEN = "console-review-token-0123"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("console-review-auth")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    (where / "auth.toml").write_text(
        f'[[principal]]\nname = "ops"\ntoken_sha256 = "{digest}"\nadmin = true\n'
    )
    srv = ServerProcess(where / "data", ["--auth-file", str(where / "auth.toml")]).start()
    try:
        yield srv
    finally:
        srv.stop()


def _submit_token(console: Console, token: str) -> None:
    console.wait_for("#login-form")
    field = console.find("#token")
    field.clear()
    field.send_keys(token)
    console.find("#login").click()
    console.settled()


def test_a_token_the_browser_cannot_send_is_refused_at_login(
    driver: WebDriver,  # noqa: F811
    secured: ServerProcess,
    shots: Path,  # noqa: F811
) -> None:
    """A token with a character past U+00FF cannot go in a header: it used to be kept,
    and every request (the page's first included, after a reload) failed with "The
    server did not answer" until the tab was closed."""
    console = Console(driver, secured.url, shots)
    console.open("#/topics")
    _submit_token(console, "tok\u20acn")
    assert "This is no token" in console.wait_for("#main .notice.error").text
    assert driver.execute_script("return sessionStorage.getItem('tidings.token')") is None
    console.open("#/topics")
    console.wait_for("#login-form")
    assert "did not answer" not in console.text()

    # One kept by an older page is dropped at the next load, too.
    driver.execute_script("sessionStorage.setItem('tidings.token', 'tok\\u20acn')")
    console.open("#/topics")
    console.wait_for("#login-form")
    assert "did not answer" not in console.text()

    _submit_token(console, TOKEN)
    assert "ops" in console.wait_for("#who b").text
    console.check_clean("review-login-unsendable-token")


def test_a_date_alone_is_midnight_in_the_browser_s_time_zone(
    console: Console, server: ServerProcess
) -> None:
    """``2026-03-01`` in the Date-time field is the start of that day where the
    browser is, as ``2026-03-01 00:00`` is (and as the CLI reads it): it used to be
    taken as UTC midnight, nine hours off in Tokyo."""
    with Client(server.url) as client:
        client.create_topic("days")
        client.publish("days", [b"one"])
    console.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"}
    )
    try:
        console.open("#/topic/days/messages")
        Select(console.find("#start-kind")).select_by_value("time")
        console.find("#start-value").send_keys("2026-03-01")
        console.find("#browse-go").click()
        patient_wait(console.driver, WAIT).until(lambda d: "from=time" in d.current_url)
        console.settled()
        value = parse_qs(urlsplit(console.driver.current_url).fragment.split("?", 1)[1])
        tokyo = timezone(timedelta(hours=9))  # no daylight saving time there
        assert value["value"] == [str(int(datetime(2026, 3, 1, tzinfo=tokyo).timestamp() * 1000))]
        assert "2026-03-01 00:00:00.000" in console.find("#page-where").text
        console.check_clean("review-date-alone")
    finally:
        console.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
            "Emulation.setTimezoneOverride", {"timezoneId": ""}
        )


def test_the_rates_scale_labels_are_distinct_and_even(
    console: Console, server: ServerProcess
) -> None:
    """One message in a quiet namespace is 1/60 messages per second, on a scale up to
    0.02: its quarter lines (0.005, 0.01, 0.015) used to be labelled to two decimals,
    three of them "0.01"."""
    with Client(server.url, "quiet") as client:
        client.create_topic("once")
        client.publish("once", [b"one"])
    console.open("#/topics")  # the console's origin, whose storage the page reads
    console.driver.execute_script("localStorage.setItem('tidings.namespace', 'quiet')")
    try:
        console.open("#/rates")
        console.wait_for("#rates-chart polyline[data-series=publish]")
        # The scale's labels stand left of the plot (x = 48); the time axis' below it.
        labels = [t.text for t in console.all("#rates-chart text.tick[x='48']")]
        values = [float(label) for label in labels]
        assert len(set(labels)) == len(labels) == 5, labels
        steps = [b - a for a, b in itertools.pairwise(values)]
        assert max(steps) - min(steps) <= values[-1] * 0.01, labels
        console.check_clean("review-rates-scale")
    finally:
        console.driver.execute_script("localStorage.removeItem('tidings.namespace')")

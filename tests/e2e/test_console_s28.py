"""The web console against what other users do meanwhile, in a real browser (the driver
and page helpers of test_console.py; skipped without Chromium)."""

from __future__ import annotations

import base64
import hashlib
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_console import (  # noqa: F401 (driver, shots: fixtures)
    WAIT,
    Console,
    driver,
    patient_wait,
    shots,
)
from tidings import Client

By = pytest.importorskip("selenium.webdriver.common.by", reason="needs selenium").By

if TYPE_CHECKING:  # selenium may be missing: test_console then skips this module
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/default"
#: What the console shows for a missing figure (an en dash).
NO_VALUE = "\u2013"

#: Deletes something right after the page listed it, as another user might: each
#: (list the page asks for, what is deleted once that list has been answered).
DELETE_AFTER_LISTING = f"""
(() => {{
  const real = window.fetch;
  const doom = [
    [/\\/namespaces\\/default\\/topics$/, "{NS}/topics/vanishing"],
    [/\\/topics\\/shelf\\/groups$/, "{NS}/topics/shelf/groups/doomed"],
    [/\\/namespaces\\/default\\/queues$/, "{NS}/topics/shelf/queues/doomed-q"],
  ];
  window.fetch = async (path, init) => {{
    const answer = await real(path, init);
    for (const [list, victim] of doom) {{
      if (list.test(String(path))) await real(victim, {{ method: "DELETE" }});
    }}
    return answer;
  }};
}})();
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("console-s28") / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def console(driver: WebDriver, server: ServerProcess, shots: Path) -> Console:  # noqa: F811
    return Console(driver, server.url, shots)


def test_groups_and_queues_deleted_while_the_page_loads_are_left_out(
    console: Console, server: ServerProcess
) -> None:
    """A group, queue or topic deleted between the list that named it and the request
    for its figures used to fail the whole Consumer groups or Queues page with "does
    not exist (404)", hiding every other group and queue."""
    with Client(server.url) as client:
        for topic in ("shelf", "vanishing"):
            client.create_topic(topic)
            client.publish(topic, [b"one", b"two"])
        for topic, group in (("shelf", "keep"), ("shelf", "doomed"), ("vanishing", "gone")):
            consumer = client.consume(topic, group=group, follow=False)
            next(iter(consumer))
            consumer.commit()
            consumer.close()
        late = client.consume("shelf", group="late", follow=False, start="latest")
        assert list(late) == []  # joined at the end: no position to count a lag from
        late.close()
        for name in ("keep-q", "doomed-q"):
            queue = client.queue("shelf", name)
            queue.pop(1)
            queue.close()
    script = console.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Page.addScriptToEvaluateOnNewDocument", {"source": DELETE_AFTER_LISTING}
    )
    try:
        console.open("#/groups")
        assert console.all("#main .notice.error") == [], console.text()
        assert console.wait_for("[data-group=keep]")
        assert console.all("[data-group=doomed]") == console.all("[data-group=gone]") == []
        # No lag is NO_VALUE, neither 0 nor "null" nor NaN, for the group and each partition.
        rows = console.all("table")[0].find_elements(By.CSS_SELECTOR, "tbody tr")
        groups = {r.find_elements(By.TAG_NAME, "td")[1].text: r for r in rows}
        assert set(groups) == {"keep", "late"}
        assert groups["keep"].text.endswith(" 1") and groups["late"].text.endswith(" " + NO_VALUE)
        lags = console.all("[data-group=late] table")[1].find_elements(By.CSS_SELECTOR, "tbody tr")
        assert [r.find_elements(By.TAG_NAME, "td")[-1].text for r in lags] == [NO_VALUE] * len(lags)
        console.open("#/queues")
        assert console.all("#main .notice.error") == [], console.text()
        assert console.wait_for("tr[data-queue=keep-q]")
        assert console.all("tr[data-queue=doomed-q]") == []
    finally:
        console.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]}
        )
    with Client(server.url) as client:  # the deletions did happen, on the server
        assert client.list_topics() == ["shelf"]
    assert console.errors(lambda e: "404 (Not Found)" in e["message"]) == []


TOKENS = {"admin": "console-s28-admin-token", "publisher": "console-s28-publisher-token"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("console-s28-auth")
    rights = {"admin": "admin = true", "publisher": 'publish = ["orders"]'}
    (where / "auth.toml").write_text(
        "\n".join(
            f'[[principal]]\nname = "{name}"\n'
            f'token_sha256 = "{hashlib.sha256(TOKENS[name].encode()).hexdigest()}"\n'
            f"{rights[name]}\n"
            for name in TOKENS
        )
    )
    srv = ServerProcess(where / "data", ["--auth-file", str(where / "auth.toml")]).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_a_principal_that_may_only_publish_is_not_offered_the_message_browser(
    driver: WebDriver,  # noqa: F811
    secured: ServerProcess,
    shots: Path,  # noqa: F811
) -> None:
    """Reading messages takes consume rights: the Topics and topic pages used to offer
    **Browse** to a principal that may only publish, whose every click ended in "may
    not consume". Opened by ``localhost`` (a name a server on 127.0.0.1 answers)."""
    with Client(secured.url, token=TOKENS["admin"]) as client:
        client.create_topic("orders")
        client.publish("orders", [b"one"])
    console = Console(driver, f"http://localhost:{secured.port}", shots)
    console.open("#/topics")
    console.wait_for("#login-form")
    console.find("#token").send_keys(TOKENS["publisher"])
    console.find("#login").click()
    console.settled()
    row = console.wait_for("tr[data-topic=orders]")
    assert row.find_elements("css selector", "td")[1].text == "1"  # its figures
    assert "Browse" not in row.text
    console.open("#/topic/orders")
    assert "Groups and queues need consume rights" in console.text()
    assert "Browse messages" not in console.find("main .head").text
    console.check_clean("s28-publisher-topic")


def _ids_shown(console: Console) -> list[str]:
    return [c.get_attribute("data-id") or "" for c in console.all("article.message")]


def test_an_empty_page_past_the_end_offers_older(console: Console, server: ServerProcess) -> None:
    """Newer from the last read-committed page before an open transaction, or a
    date-time after the newest message, shows "No messages here.": both buttons used
    to be disabled there, a dead end; Older now goes to the latest page."""
    with Client(server.url) as client:
        client.create_topic("ledger")
        client.publish("ledger", [b"one", b"two"])
        open_tx = client.begin(600)
        answer = httpx.post(
            f"{server.url}{NS}/topics/ledger/publish",
            json={
                "transactionWritePointer": open_tx.write_pointer,
                "messages": [base64.b64encode(b"pending").decode()],
            },
        )
        assert answer.status_code == 200, answer.text
        committed = [m.id.hex for m in client.poll("ledger", limit=10)][:2]
    console.open("#/topic/ledger/messages?from=earliest&size=10&isolation=committed")
    assert _ids_shown(console) == committed
    console.find("#page-newer").click()
    patient_wait(console.driver, WAIT).until(lambda d: "from=after" in d.current_url)
    console.settled()
    assert "No messages here." in console.text() and _ids_shown(console) == []
    assert console.find("#page-older").is_enabled()
    console.find("#page-older").click()
    patient_wait(console.driver, WAIT).until(lambda d: "from=latest" in d.current_url)
    console.settled()
    assert _ids_shown(console) == committed

    console.open("#/topic/ledger/messages?from=time&value=99999999999999&size=10")
    assert _ids_shown(console) == []
    assert console.find("#page-older").is_enabled()
    console.find("#page-older").click()
    patient_wait(console.driver, WAIT).until(lambda d: "from=latest" in d.current_url)
    console.settled()
    assert len(_ids_shown(console)) == 3  # the open transaction's too, read uncommitted
    assert console.errors() == []


def test_logging_out_of_the_live_rates_and_a_withdrawn_token(
    driver: WebDriver,  # noqa: F811
    secured: ServerProcess,
    shots: Path,  # noqa: F811
) -> None:
    """Logging out of the Live rates page left its refresh running: each tick, refused,
    put up the login page again, wiping the token being typed every 3 seconds. And a
    token withdrawn while a page was open (the auth file reloaded) brought up the login
    page without saying why."""
    console = Console(driver, f"http://localhost:{secured.port}", shots)
    console.open("#/rates")
    driver.execute_script("sessionStorage.clear()")  # logged in by an earlier test
    console.open("#/rates")
    console.wait_for("#login-form")
    console.find("#token").send_keys(TOKENS["publisher"])
    console.find("#login").click()
    console.wait_for("#rates-chart polyline")
    console.find("#logout").click()
    console.wait_for("#login-form")
    console.find("#token").send_keys("half-typed")
    time.sleep(3.5)  # past the rates' next refresh
    assert console.find("#token").get_attribute("value") == "half-typed"

    console.find("#token").clear()
    console.find("#token").send_keys(TOKENS["publisher"])
    console.find("#login").click()
    console.wait_for("#rates-chart polyline")
    console.open("#/topics")
    assert "publisher" in console.wait_for("#who b").text
    auth_file = Path(secured.args[secured.args.index("--auth-file") + 1])
    kept = auth_file.read_text()
    try:
        auth_file.write_text(kept.split('[[principal]]\nname = "publisher"')[0])
        assert secured.proc is not None
        secured.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            headers = {"Authorization": f"Bearer {TOKENS['publisher']}"}
            if httpx.get(f"{secured.url}{NS}/topics", headers=headers).status_code == 401:
                break
            time.sleep(0.1)
        console.find("main button.quiet").click()  # Refresh
        assert "No principal has this token." in console.wait_for("#main .notice.error").text
        assert console.all("#login-form")
    finally:
        auth_file.write_text(kept)
        assert secured.proc is not None
        secured.proc.send_signal(signal.SIGHUP)
    assert console.errors(lambda e: "401 (Unauthorized)" in e["message"]) == []


def test_a_server_that_stopped_answering_is_named_not_a_script_error(
    driver: WebDriver,  # noqa: F811
    start_server: Callable[..., ServerProcess],
    shots: Path,  # noqa: F811
) -> None:
    """With the server gone, every page showed the browser's "TypeError: Failed to
    fetch" as its error."""
    gone = start_server()
    console = Console(driver, gone.url, shots)
    console.open("#/topics")
    console.wait_for("main button.quiet")
    gone.kill()
    console.find("main button.quiet").click()  # Refresh
    shown = console.wait_for("#main .notice.error").text
    assert shown.startswith("The server did not answer") and "TypeError" not in shown
    assert console.errors(lambda e: "ERR_CONNECTION_REFUSED" in e["message"]) == []


def test_a_hand_edited_date_time_in_the_address_is_refused(console: Console) -> None:
    """``from=time&value=`` with no number (an address edited by hand) used to show the
    messages from the earliest under the heading "from NaN-NaN-NaN NaN:NaN"."""
    with Client(console.url) as client:
        client.create_topic("edited")
        client.publish("edited", [b"one"])
    console.open("#/topic/edited/messages?from=time&value=yesterday&size=10")
    assert "not a date-time: yesterday" in console.find("#main .notice.error").text
    assert console.all("article.message") == [] and "NaN" not in console.text()
    assert console.find("#start-value").get_attribute("value") == "yesterday"
    assert console.errors() == []

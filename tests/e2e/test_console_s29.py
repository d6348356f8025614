"""The web console when part of what it asks for is refused, in a real browser (the
driver and page helpers of test_console.py; skipped without Chromium). The refusals
come from a stubbed ``fetch``, as a second server behind the same address with another
auth file, or a server briefly overloaded, would answer."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_console import (  # noqa: F401 (driver, shots: fixtures)
    Console,
    driver,
    shots,
)
from tidings import Client

if TYPE_CHECKING:  # selenium may be missing: test_console then skips this module
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.e2e

#: Answers ``answers`` ([path pattern, status, error type, error text]) in place of the
#: server, and counts the page's whoami requests in ``window.whoamis``.
REFUSE = """
(() => {
  const real = window.fetch;
  const answers = %s;
  window.whoamis = 0;
  window.fetch = async (path, init) => {
    if (/\\/v1\\/whoami$/.test(String(path))) window.whoamis += 1;
    for (const [pattern, status, type, error] of answers) {
      if (new RegExp(pattern).test(String(path))) {
        return new Response(JSON.stringify({ error, type }), {
          status, headers: { "Content-Type": "application/json" },
        });
      }
    }
    return real(path, init);
  };
})();
"""


@pytest.fixture
def namespace() -> str:
    """A namespace of its own, so the pages list only this test's topics."""
    return "c-" + uuid.uuid4().hex[:10]


@pytest.fixture
def console(
    driver: WebDriver,  # noqa: F811
    server: ServerProcess,
    shots: Path,  # noqa: F811
    namespace: str,
) -> Iterator[Console]:
    page = Console(driver, server.url, shots)
    page.open("#/topics")
    driver.execute_script(f"localStorage.setItem('tidings.namespace', '{namespace}')")
    yield page
    driver.execute_script("localStorage.removeItem('tidings.namespace')")


def _refusing(console: Console, *answers: tuple[str, int, str, str]) -> str:
    script = console.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Page.addScriptToEvaluateOnNewDocument", {"source": REFUSE % json.dumps(answers)}
    )
    return str(script["identifier"])


def _stop_refusing(console: Console, identifier: str) -> None:
    console.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Page.removeScriptToEvaluateOnNewDocument", {"identifier": identifier}
    )


def test_a_topic_whose_groups_are_refused_leaves_the_rest_of_the_page(
    console: Console, server: ServerProcess, namespace: str
) -> None:
    """A 403 or 503 for one topic's group list showed only that error, in place of the
    whole Consumer groups page, and on the topic page in place of its queues too; one
    queue's, in place of the whole Queues page."""
    with Client(server.url, namespace) as client:
        for topic in ("open", "locked", "busy"):
            client.create_topic(topic)
            client.publish(topic, [b"one"])
            with client.consume(topic, group=f"{topic}-g", follow=False) as consumer:
                next(iter(consumer))
                consumer.commit()
        client.queue("locked", "work").pop(1)
        client.queue("busy", "late").pop(1)
    identifier = _refusing(
        console,
        (r"/topics/locked/groups$", 403, "Forbidden", "principal 'p' may not consume 'locked'"),
        (r"/topics/busy/groups$", 503, "ServiceUnavailable", "the group service is starting"),
        (r"/topics/busy/queues/late$", 503, "ServiceUnavailable", "the queue service is starting"),
    )
    try:
        console.open("#/groups")
        assert console.wait_for("[data-group=open-g]")
        assert console.all("[data-group=locked-g]") == console.all("[data-group=busy-g]") == []
        refused = {e.get_attribute("data-topic"): e.text for e in console.all(".notice.error")}
        assert set(refused) == {"locked", "busy"}, console.text()
        assert "may not consume 'locked' (403)" in refused["locked"]
        assert "starting (503)" in refused["busy"]

        console.open("#/topic/locked")
        groups, queues = console.find("#groups-panel"), console.find("#queues-panel")
        assert "may not consume 'locked' (403)" in groups.text
        assert "work" in queues.text and "(403)" not in queues.text
        assert "Oldest message" in console.text()  # the rest of the page
        console.shot("s29-groups-refused")

        console.open("#/queues")
        assert console.wait_for("tr[data-queue=work]")
        assert console.all("tr[data-queue=late]") == []
        refused = {e.get_attribute("data-queue"): e.text for e in console.all(".notice.error")}
        assert set(refused) == {"late"} and "starting (503)" in refused["late"], console.text()
    finally:
        _stop_refusing(console, identifier)
    console.errors()  # the stubbed refusals are logged as failed requests


def test_a_token_refused_by_another_server_at_the_address_is_said_not_looped(
    console: Console, server: ServerProcess, namespace: str
) -> None:
    """A 401 on a page's request made the console ask whoami again and, the token being
    accepted there (another server behind the same address, with another auth file),
    load the page again: refused again, for ever, the page flickering."""
    with Client(server.url, namespace) as client:
        client.create_topic("anything")
    identifier = _refusing(
        console,
        (r"/namespaces/[^/]+/topics$", 401, "Unauthorized", "no principal has this token"),
    )
    try:
        console.open("#/topics")
        shown = console.wait_for("#main .notice.error").text
        asked = console.driver.execute_script("return window.whoamis")
        time.sleep(1.5)  # a loop asks whoami hundreds of times meanwhile
        assert asked == 2 == console.driver.execute_script("return window.whoamis")
        shown = console.find("#main .notice.error").text
        assert "no principal has this token (401)" in shown and "auth file" in shown, shown
        console.shot("s29-token-refused")
        console.find("main button.quiet").click()  # Refresh: tried again, by hand
        console.settled()
        time.sleep(0.5)
        assert "(401)" in console.find("#main .notice.error").text
        assert console.driver.execute_script("return window.whoamis") == 3
    finally:
        _stop_refusing(console, identifier)
    console.open("#/topics")  # the server itself still answers
    assert console.wait_for("tr[data-topic=anything]")
    console.errors()


def test_a_token_refused_by_another_server_is_said_for_a_named_principal(
    driver: WebDriver,  # noqa: F811
    start_server: Callable[..., ServerProcess],
    shots: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The same behind an auth file: this server knows the token, the other does not."""
    token = "console-s29-reader-token"
    auth = tmp_path / "auth.toml"
    auth.write_text(
        '[[principal]]\nname = "reader"\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
        'consume = ["*"]\n'
    )
    secured = start_server("--auth-file", str(auth))
    console = Console(driver, f"http://localhost:{secured.port}", shots)
    identifier = _refusing(
        console,
        (r"/namespaces/[^/]+/topics$", 401, "Unauthorized", "no principal has this token"),
    )
    try:
        console.open("#/topics")
        console.wait_for("#login-form")
        console.find("#token").send_keys(token)
        console.find("#login").click()
        shown = console.wait_for("#main .notice.error").text
        asked = console.driver.execute_script("return window.whoamis")
        time.sleep(1.0)
        # The page's, the login's, the refusal's: and no more.
        assert asked == 3 == console.driver.execute_script("return window.whoamis")
        assert "accepts it for reader" in shown and "auth file" in shown, shown
        assert "reader" in console.find("#who").text  # still signed in: the token is good
    finally:
        _stop_refusing(console, identifier)
        console.driver.execute_script("sessionStorage.clear()")
    console.errors()

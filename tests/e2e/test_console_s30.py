"""The web console with several servers behind one address whose auth files differ, and
a Topics page row whose figures are refused (the browser driver and the page object of
test_console.py; skipped without Chromium)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.faultproxy import FaultProxy, _close
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

if TYPE_CHECKING:  # selenium may be missing: test_console then skips this module
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.e2e

TOKENS = {"reader": "console-s30-reader-token", "admin": "console-s30-admin-token"}


class SwitchingProxy(FaultProxy):
    """One address in front of one server at a time, as a load balancer that sends the
    browser to another instance: :meth:`switch` cuts every open connection, so the next
    request (on a new one) goes to the other server."""

    def switch(self, port: int) -> None:
        self._upstream = port
        for sock in list(self._socks):
            _close(sock)


def _auth_file(path: Path, *names: str) -> Path:
    rights = {"reader": 'consume = ["*"]', "admin": "admin = true"}
    path.write_text(
        "\n".join(
            f'[[principal]]\nname = "{name}"\n'
            f'token_sha256 = "{hashlib.sha256(TOKENS[name].encode()).hexdigest()}"\n'
            f"{rights[name]}\n"
            for name in names
        )
    )
    return path


@pytest.fixture
def two_servers(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess, SwitchingProxy]]:
    """Two servers, one address: the first knows the reader, the second does not."""
    knows = start_server("--auth-file", str(_auth_file(tmp_path / "a.toml", "reader", "admin")))
    lacks = start_server("--auth-file", str(_auth_file(tmp_path / "b.toml", "admin")))
    for srv in (knows, lacks):
        with Client(srv.url, token=TOKENS["admin"]) as client:
            client.create_topic("shared")
    with SwitchingProxy(knows.port) as proxy:
        yield knows, lacks, proxy


def test_a_server_lacking_the_principal_keeps_the_session_for_the_others(
    driver: WebDriver,  # noqa: F811
    shots: Path,  # noqa: F811
    two_servers: tuple[ServerProcess, ServerProcess, SwitchingProxy],
) -> None:
    """Signed in through one server, the page then answered by another whose auth file
    lacks the principal (whoami: no principal for the token) dropped the token: logged
    out of every server at the address, without a word about why. Now it says that
    the server that answered refuses the token, and keeps it to try again."""
    knows, lacks, proxy = two_servers
    page = Console(driver, proxy.url, shots)

    def kept() -> object:
        return driver.execute_script("return sessionStorage.getItem('tidings.token')")

    try:
        page.open("#/topics")
        page.wait_for("#login-form")
        page.find("#token").send_keys(TOKENS["reader"])
        page.find("#login").click()
        page.wait_for("tr[data-topic=shared]")
        assert "reader" in page.find("#who").text

        # A page's request answered by the other server: refused (401), whoami too.
        proxy.switch(lacks.port)
        page.find("main button.quiet").click()  # Refresh
        shown = page.wait_for("#main .notice.error").text
        assert "No principal has this token." in shown, shown
        assert "server that answered" in shown and "accepted it for reader" in shown, shown
        assert kept() == TOKENS["reader"]
        assert "reader" in page.find("#who").text and page.find("#logout").is_displayed()
        page.shot("s30-token-refused-by-one-server")

        # A new load of the page, answered by it again: the same, the token still kept.
        page.open("#/topics")
        assert "accepted it for reader" in page.wait_for("#main .notice.error").text
        assert kept() == TOKENS["reader"]

        # Back on the server that knows it: Try again signs in, no token typed.
        proxy.switch(knows.port)
        page.find("#retry-token").click()
        page.wait_for("tr[data-topic=shared]")
        assert "Signed in as reader" in page.find("#who").text

        # Log out, from the refused state too, drops the token.
        proxy.switch(lacks.port)
        page.open("#/topics")
        page.wait_for("#retry-token")
        page.find("#logout").click()
        page.wait_for("#login-form")
        assert kept() is None and page.all("#retry-token") == []
        assert not page.find("#logout").is_displayed()

        # A token no server at the address has accepted in this tab is dropped at once,
        # as before.
        page.find("#token").send_keys(TOKENS["reader"])
        page.find("#login").click()
        assert "No principal has this token." in page.wait_for("#main .notice.error").text
        assert kept() is None and page.all("#retry-token") == []
    finally:
        driver.execute_script("sessionStorage.clear()")
    page.errors()  # the refused requests are logged as failed ones


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


def test_the_other_refusals_on_the_topic_pages_show_their_status_too(
    console: Console,  # noqa: F811
    server: ServerProcess,
    namespace: str,  # noqa: F811
) -> None:
    """Creating a topic that exists, deleting one gone meanwhile, a message page or the
    live rates refused: each showed the server's message without its status."""
    with Client(server.url, namespace) as client:
        for topic in ("kept", "doomed"):
            client.create_topic(topic)
            client.publish(topic, [b"one"])
    console.open("#/topics")
    console.find("#new-topic").send_keys("kept")
    console.find("#create-topic").click()
    assert console.wait_for("form .badge.bad").text.endswith("(409)")

    with Client(server.url, namespace) as client:
        client.delete_topic("doomed")  # while the page still lists it
    console.find("tr[data-topic=doomed] [data-action=delete]").click()
    console.wait_for("dialog#confirm[open]")
    console.find("#confirm-ok").click()
    shown = console.wait_for("#main > .notice.error").text
    assert shown.startswith("Could not delete doomed: ") and shown.endswith("(404)"), shown

    identifier = _refusing(
        console,
        (r"/topics/kept/(poll|messages)", 503, "ServiceUnavailable", "the store is busy"),
        (r"/namespaces/[^/]+/topics$", 503, "ServiceUnavailable", "the store is busy"),
    )
    try:
        console.open("#/topic/kept/messages?from=earliest&size=10")
        assert "the store is busy (503)" in console.find("#main .notice.error").text
        console.open("#/rates")
        assert console.wait_for("#rates-stamp .badge.bad").text == "the store is busy (503)"
    finally:
        _stop_refusing(console, identifier)
    console.errors()

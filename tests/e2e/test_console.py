"""The web console (docs/console.md) in a real browser against a real server.

Headless Chromium (Debian's ``chromium`` and ``chromium-driver``; skipped without
them) loads each page of ``/console/`` from a ``tidings serve`` the module filled
through the Python client, and every page must show that data with no error in the
browser's console. A screenshot of each page goes to ``$TIDINGS_CONSOLE_SCREENSHOTS``,
or to a directory under pytest's temporary path (printed at the end of the module).
One browser serves the whole module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client, Record

pytestmark = pytest.mark.e2e

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait as _Wait  # noqa: E402


def patient_wait(driver: WebDriver, timeout: float) -> _Wait[WebDriver]:
    """A wait that tries again when the page re-rendered the element under it."""
    return _Wait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
)
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "the console's browser tests need Chromium and its driver "
        "(Debian: apt-get install chromium chromium-driver; .ci/run installs them)",
        allow_module_level=True,
    )

TOKENS = {"admin": "console-admin-token-0123", "reader": "console-reader-token-0123"}
WAIT = 15.0


# ---------------------------------------------------------------------------------
# the server, its data, the browser


@dataclass
class Data:
    """What the module published, to look for on the pages."""

    found_id: str  # hex id of the message the browser looks up by id
    found_item: str
    marker_time: int  # ms: every message of `orders` from here on is a marker
    newest_orders: str
    payments_lso: str
    open_wp: int
    invalid_wp: int


def _publish_raw(url: str, topic: str, payloads: list[bytes], wp: int) -> None:
    body = {
        "transactionWritePointer": wp,
        "messages": [base64.b64encode(p).decode() for p in payloads],
    }
    answer = httpx.post(f"{url}/v1/namespaces/default/topics/{topic}/publish", json=body)
    answer.raise_for_status()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("console") / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def data(server: ServerProcess) -> Iterator[Data]:
    with Client(server.url) as client:
        client.create_topic("orders", ttl=3600)
        client.create_topic("payments")
        client.create_topic("sensor-raw")
        client.create_topic("scratch")
        client.publish(
            "orders",
            [
                Record(
                    json.dumps({"order": i, "item": f"item-{i}", "qty": i % 4 + 1}).encode(),
                    key=f"customer-{i % 5}".encode(),
                    headers={"source": b"web", "trace": f"t{i:04d}".encode()},
                )
                for i in range(40)
            ],
        )
        client.publish("orders", ["plain text: order 40 was cancelled by phone"])
        time.sleep(0.05)
        marker_time = int(time.time() * 1000)
        time.sleep(0.05)
        client.publish("orders", [json.dumps({"marker": i}).encode() for i in range(3)])
        client.publish("sensor-raw", [bytes(range(0, 256, 7)), b"\x00\x01\x02binary\xff"])
        orders = client.poll("orders", limit=100)
        found = orders[17]

        # A group with a member and committed positions, a queue with a dead letter.
        consumer = client.consume("orders", group="billing", follow=False, partitions=4)
        for read, _ in enumerate(consumer, 1):
            if read == 25:
                break
        consumer.commit()
        queue = client.queue("orders", "shipping", max_deliveries=1)
        popped = queue.pop(3)
        queue.ack(popped[:1])
        queue.nack(popped[1:2])
        queue.pop(2)  # the nacked message was delivered its one time: dead letter

        # Committed and open transactions on payments, one invalid transaction.
        client.publish("payments", [b'{"amount": 12.5, "currency": "EUR"}'])
        producer = client.register_producer("checkout-1")
        with client.transaction() as tx:
            tx.publish("payments", b'{"amount": 30, "currency": "EUR"}')
        open_tx = client.begin(600, transactional_id="checkout-1", epoch=producer.epoch)
        _publish_raw(
            server.url, "payments", [b'{"amount": 99, "pending": true}'], open_tx.write_pointer
        )
        invalid = client.begin(600)
        client.invalidate(invalid)
        end = client.end("payments")
        assert end.last_stable_id is not None
        yield Data(
            found_id=found.id.hex,
            found_item=json.loads(found.payload)["item"],
            marker_time=marker_time,
            newest_orders=orders[-1].id.hex,
            payments_lso=end.last_stable_id.hex,
            open_wp=open_tx.write_pointer,
            invalid_wp=invalid.write_pointer,
        )
        consumer.close()
        queue.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    chosen = os.environ.get("TIDINGS_CONSOLE_SCREENSHOTS")
    where = Path(chosen) if chosen else tmp_path_factory.mktemp("console-screenshots")
    where.mkdir(parents=True, exist_ok=True)
    yield where
    print(f"\nconsole screenshots: {where}")


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()


class Console:
    """The browser on one server's console: open pages, wait, check, take pictures."""

    def __init__(self, driver: WebDriver, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots
        self.loads = 0

    def open(self, hash_: str = "#/topics") -> None:
        """A fresh load of the page at ``hash_``, waited for until it has rendered."""
        self.loads += 1
        self.driver.get(f"{self.url}/console/?load={self.loads}{hash_}")
        self.settled()

    def settled(self) -> None:
        """Wait until the page on screen has finished rendering."""
        patient_wait(self.driver, WAIT).until(
            lambda d: d.execute_script(
                "return document.readyState === 'complete' && "
                "!document.getElementById('main').hasAttribute('aria-busy') && "
                "(document.body.dataset.ready !== undefined || "
                "document.getElementById('login-form') !== null)"
            )
        )

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait_for(self, css: str) -> WebElement:
        try:
            return patient_wait(self.driver, WAIT).until(
                lambda d: d.find_element(By.CSS_SELECTOR, css)
            )
        except TimeoutException:
            raise AssertionError(f"{css} never showed: {self.text()[:2000]}") from None

    def text(self) -> str:
        return self.find("main").text

    def errors(self, allow: Callable[[dict[str, Any]], bool] = lambda e: False) -> list[str]:
        """The severe entries of the browser's console since the last call."""
        logs = self.driver.get_log("browser")
        return [e["message"] for e in logs if e["level"] == "SEVERE" and not allow(e)]

    def shot(self, name: str) -> Path:
        """A screenshot of the whole page (the window grows to the page's height)."""
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1400, max(900, min(int(height) + 140, 5000)))
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(1400, 1000)
        return path

    def check_clean(self, name: str) -> None:
        assert self.errors() == [], name
        assert self.shot(name).stat().st_size > 10_000


@pytest.fixture(scope="module")
def console(driver: WebDriver, server: ServerProcess, data: Data, shots: Path) -> Console:
    return Console(driver, server.url, shots)


# ---------------------------------------------------------------------------------
# pages


def test_console_redirects_and_serves_its_files(server: ServerProcess) -> None:
    answer = httpx.get(server.url + "/console", follow_redirects=False)
    assert answer.status_code in (301, 307, 308)
    assert answer.headers["location"].endswith("/console/")
    page = httpx.get(server.url + "/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    script = httpx.get(server.url + "/console/console.js")
    assert script.headers["content-type"].startswith("text/javascript")
    missing = httpx.get(server.url + "/console/other.js")
    assert missing.status_code == 404 and missing.json()["type"] == "NotFound"


def test_topics_page_lists_the_topics_with_their_figures(console: Console) -> None:
    console.open("#/topics")
    row = console.wait_for("tr[data-topic=orders]")
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "orders"
    assert cells[1] == "44"  # messages
    assert cells[3] == "1 h"  # ttl 3600 s
    assert "ago" in cells[6]  # last message
    payments = console.find("tr[data-topic=payments]").text
    assert "transaction open" in payments
    assert {r.get_attribute("data-topic") for r in console.all("tr[data-topic]")} >= {
        "orders",
        "payments",
        "sensor-raw",
        "scratch",
        "orders-dlq",
    }
    console.check_clean("01-topics")


def test_topic_page_shows_stats_properties_lso_groups_and_queues(
    console: Console, data: Data
) -> None:
    console.open("#/topic/payments")
    text = console.text()
    assert data.payments_lso in text  # the last stable offset
    assert "the first message of the oldest transaction still open" in text
    console.check_clean("03-topic-payments")

    console.open("#/topic/orders")
    text = console.text()
    for expected in ("MESSAGES", "44", "ttl", "3600 s (1 h)", "billing", "shipping", "orders-dlq"):
        assert expected in text, expected
    assert "none: no transaction is open" in text
    console.check_clean("02-topic-orders")


def test_message_browser_finds_a_message_by_id(console: Console, data: Data) -> None:
    console.open("#/topic/orders/messages")
    assert len(console.all("article.message")) == 20
    Select(console.find("#start-kind")).select_by_value("id")
    console.find("#start-value").send_keys(data.found_id)
    console.find("#browse-go").click()
    console.wait_for(f"article.message.found[data-id='{data.found_id}']")
    console.settled()
    first = console.all("article.message")[0]
    assert first.get_attribute("data-id") == data.found_id
    payload = first.find_element(By.CSS_SELECTOR, "pre.payload").text
    # Pretty-printed JSON, with the key and headers beside it.
    assert f'"item": "{data.found_item}"' in payload and "\n" in payload
    assert first.find_element(By.CSS_SELECTOR, ".badge").text == "JSON"
    assert "customer-2" in first.text and "source: web" in first.text
    console.check_clean("05-messages-by-id")


def test_message_browser_finds_messages_by_time(console: Console, data: Data) -> None:
    console.open("#/topic/orders/messages")
    Select(console.find("#start-kind")).select_by_value("time")
    when = datetime.fromtimestamp(data.marker_time / 1000, UTC)
    console.find("#start-value").send_keys(when.isoformat(timespec="milliseconds"))
    console.find("#browse-go").click()
    console.wait_for("#page-where")
    patient_wait(console.driver, WAIT).until(lambda d: "from " in console.find("#page-where").text)
    console.settled()
    cards = console.all("article.message")
    assert [c.find_element(By.CSS_SELECTOR, "pre").text for c in cards] == [
        '{\n  "marker": 0\n}',
        '{\n  "marker": 1\n}',
        '{\n  "marker": 2\n}',
    ]
    console.check_clean("06-messages-by-time")


def test_message_browser_pages_forward_and_back(console: Console, data: Data) -> None:
    console.open("#/topic/orders/messages?from=earliest&size=10")
    first_page = [c.get_attribute("data-id") for c in console.all("article.message")]
    assert len(first_page) == 10
    assert console.find("#page-older").get_attribute("disabled") is not None  # the oldest
    console.find("#page-newer").click()
    console.settled()
    patient_wait(console.driver, WAIT).until(
        lambda d: console.all("article.message")[0].get_attribute("data-id") not in first_page
    )
    second_page = [c.get_attribute("data-id") for c in console.all("article.message")]
    assert len(second_page) == 10 and second_page[0] > first_page[-1]
    console.find("#page-older").click()
    console.settled()
    patient_wait(console.driver, WAIT).until(
        lambda d: [c.get_attribute("data-id") for c in console.all("article.message")] == first_page
    )

    console.open("#/topic/orders/messages?from=latest&size=10")
    latest = [c.get_attribute("data-id") for c in console.all("article.message")]
    assert len(latest) == 10 and latest[-1] == data.newest_orders
    assert console.find("#page-newer").get_attribute("disabled") is not None
    assert "order 40 was cancelled" in console.text()  # shown as text
    console.check_clean("07-messages-latest")


def test_message_browser_shows_binary_as_hex(console: Console) -> None:
    console.open("#/topic/sensor-raw/messages")
    badges = [b.text for b in console.all("article.message .badge")]
    assert badges == ["binary (hex)", "binary (hex)"]
    assert "00000000  00 01 02 62 69 6e 61 72 79 ff" in console.text()
    console.check_clean("08-messages-binary")


def test_message_browser_read_committed_toggle(console: Console) -> None:
    console.open("#/topic/payments/messages")
    assert len(console.all("article.message")) == 3  # the open transaction's too
    console.find("#read-committed").click()
    console.find("#browse-go").click()
    patient_wait(console.driver, WAIT).until(lambda d: "read committed" in console.text())
    console.settled()
    payloads = [p.text for p in console.all("article.message pre")]
    assert len(payloads) == 2 and not any("pending" in p for p in payloads)
    console.check_clean("09-messages-read-committed")


def test_groups_page_shows_members_partitions_positions_and_lag(
    console: Console, server: ServerProcess
) -> None:
    with Client(server.url) as client:
        member = client.consume("orders", group="billing", follow=False)
        next(iter(member))  # joins; positions move only on a commit
        try:
            console.open("#/groups")
            rows = console.all("[data-group=billing] table")[0].find_elements(
                By.CSS_SELECTOR, "tbody tr"
            )
            owned = [r.find_elements(By.TAG_NAME, "td")[1].text.split(", ") for r in rows]
            assert sorted(int(p) for ps in owned for p in ps) == [0, 1, 2, 3]
            _check_groups_page(console)
        finally:
            member.close()


def _check_groups_page(console: Console) -> None:
    section = console.wait_for("[data-group=billing]")
    text = section.text
    assert "MEMBERS" in text and "PARTITIONS" in text
    lags = console.all("[data-group=billing] table")[1].find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(lags) == 4  # one row per partition
    total = sum(int(r.find_elements(By.TAG_NAME, "td")[-1].text.lstrip("≥ ")) for r in lags)
    assert total == 44 - 25
    console.check_clean("10-groups")


def test_queues_page_shows_depth_pending_redelivered_and_dead_letters(console: Console) -> None:
    console.open("#/queues")
    row = console.wait_for("tr[data-queue=shipping]")
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "orders" and cells[1] == "shipping"
    assert cells[7] == "1"  # dead letters
    assert "orders-dlq" in cells[8] and "(1 message)" in cells[8]
    assert int(cells[3]) >= 1  # pending: leased, not acked
    console.check_clean("11-queues")


def test_transactions_page_shows_open_invalid_and_producers(console: Console, data: Data) -> None:
    console.open("#/transactions")
    row = console.wait_for(f"tr[data-wp='{data.open_wp}']")
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "checkout-1" and cells[2] == "0"
    assert cells[5] == "10 min"  # timeout
    assert cells[6].startswith("in ")
    assert str(data.invalid_wp) in console.find("#invalid-list").text
    assert "checkout-1" in console.all("section.panel")[-1].text  # producers
    console.check_clean("12-transactions")


def test_rates_page_draws_a_chart_that_refreshes(console: Console, server: ServerProcess) -> None:
    console.open("#/rates")
    stamp = console.wait_for("#rates-chart polyline[data-series=publish]")
    first = stamp.get_attribute("points")
    with Client(server.url) as client:
        client.publish("orders", [b"{}"] * 5)
    patient_wait(console.driver, 10).until(
        lambda d: (
            console.find("#rates-chart polyline[data-series=publish]").get_attribute("points")
            != first
        )
    )
    points = console.find("#rates-chart polyline[data-series=publish]").get_attribute("points")
    assert len(points.split()) >= 2
    assert "orders" in console.text()
    console.check_clean("13-rates")


def test_deleting_a_topic_asks_first(console: Console, server: ServerProcess) -> None:
    console.open("#/topics")
    console.find("tr[data-topic=scratch] [data-action=delete]").click()
    dialog = console.wait_for("dialog#confirm[open]")
    assert "Delete topic scratch?" in dialog.text
    console.shot("04-delete-confirmation")
    console.find("#confirm-cancel").click()
    assert httpx.get(f"{server.url}/v1/namespaces/default/topics/scratch").status_code == 200
    assert console.all("dialog#confirm[open]") == []

    console.find("tr[data-topic=scratch] [data-action=delete]").click()
    console.wait_for("dialog#confirm[open]")
    console.find("#confirm-ok").click()
    patient_wait(console.driver, WAIT).until(lambda d: not console.all("tr[data-topic=scratch]"))
    assert httpx.get(f"{server.url}/v1/namespaces/default/topics/scratch").status_code == 404
    assert console.errors() == []


def test_creating_a_topic(console: Console, server: ServerProcess) -> None:
    console.open("#/topics")
    console.find("#new-topic").send_keys("created-here")
    console.find("#new-ttl").send_keys("120")
    console.find("#create-topic").click()
    row = console.wait_for("tr[data-topic=created-here]")
    assert "2 min" in row.text
    answer = httpx.get(f"{server.url}/v1/namespaces/default/topics/created-here").json()
    assert answer["properties"]["ttl"] == "120"
    assert console.errors() == []


# ---------------------------------------------------------------------------------
# authentication


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("console-auth")
    lines = []
    for name, extra in (("admin", "admin = true"), ("reader", 'consume = ["shop-*"]')):
        digest = hashlib.sha256(TOKENS[name].encode()).hexdigest()
        lines.append(f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n{extra}\n')
    (where / "auth.toml").write_text("\n".join(lines))
    srv = ServerProcess(where / "data", ["--auth-file", str(where / "auth.toml")]).start()
    try:
        with Client(srv.url, token=TOKENS["admin"]) as client:
            for topic in ("shop-orders", "internal"):
                client.create_topic(topic)
                client.publish(topic, [b'{"hello": "world"}'])
        yield srv
    finally:
        srv.stop()


def _log_in(console: Console, token: str) -> None:
    console.open("#/topics")
    console.wait_for("#login-form")
    console.find("#token").send_keys(token)
    console.find("#login").click()
    console.settled()


def test_login_with_a_token_and_admin_actions_hidden_for_others(
    driver: WebDriver, secured: ServerProcess, shots: Path
) -> None:
    console = Console(driver, secured.url, shots)
    console.open("#/topics")
    console.wait_for("#login-form")
    console.check_clean("14-login")

    _log_in(console, "not-a-token-of-anyone")
    assert "No principal has this token." in console.wait_for("#main .notice.error").text

    _log_in(console, TOKENS["reader"])
    row = console.wait_for("tr[data-topic=shop-orders]")
    assert "reader" in console.find("#who").text
    assert console.all("[data-action=delete]") == [] and console.all("#create-topic") == []
    # A topic the reader may neither publish to nor consume is not listed to it at all.
    assert console.all("tr[data-topic=internal]") == []
    assert not console.find("#nav-transactions").is_displayed()
    assert "1" in row.text
    console.check_clean("15-topics-as-reader")
    console.open("#/transactions")
    assert "Only an admin" in console.text()
    # And the server refuses it, whatever the page shows.
    status = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/v1/namespaces/default/topics/shop-orders', {method: 'DELETE', headers: "
        "{Authorization: 'Bearer ' + sessionStorage.getItem('tidings.token')}})"
        ".then(r => done(r.status));"
    )
    assert status == 403
    assert all("403" in e for e in console.errors())

    console.find("#logout").click()
    console.wait_for("#login-form")
    _log_in(console, TOKENS["admin"])
    console.wait_for("tr[data-topic=internal] [data-action=delete]")
    assert console.find("#nav-transactions").is_displayed()
    console.check_clean("16-topics-as-admin")

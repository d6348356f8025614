"""Security edges of the HTTP server, through the real server and the real client:
what a topic's stats show to whom, a standby's ``/metrics``, and the ``Host``
allowlist against DNS rebinding (docs/security.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness
from tests.e2e.test_security import TOKENS, auth_file, bearer
from tidings import AsyncClient, Client
from tidings.cli import main

pytestmark = pytest.mark.e2e


def test_topic_stats_show_groups_only_to_who_may_consume(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    srv = start_server("--auth-file", str(auth_file(tmp_path / "auth.toml")))
    with Client(srv.url, token=TOKENS["admin"]) as admin:
        admin.create_topic("t-stats")
        admin.publish("t-stats", [b"a", b"b", b"c"])
    with Client(srv.url, token=TOKENS["reader"]) as reader:
        consumer = reader.consume("t-stats", group="billing-secret", follow=False, batch_size=1)
        consumer.poll()
        consumer.commit()
        consumer.close()
        assert reader.stats("t-stats").group_lags == {"billing-secret": 2}
    with Client(srv.url, token=TOKENS["admin"]) as admin:
        assert admin.stats("t-stats").group_lags == {"billing-secret": 2}
    with Client(srv.url, token=TOKENS["writer"]) as writer:
        stats = writer.stats("t-stats")
        assert stats.group_lags == {}
        assert stats.message_count == 3  # the rest of the stats as before
    path = "/v1/namespaces/default/topics/t-stats/stats"
    raw = httpx.get(srv.url + path, headers=bearer("writer"))
    assert raw.status_code == 200
    assert raw.json()["groupLag"] == {}  # the field stays, empty
    assert "billing-secret" not in raw.text


@pytest.fixture
def pg_instances(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Instances on one PostgreSQL database, each with its own data dir and extra
    arguments and environment; all killed afterwards."""
    made: list[ServerProcess] = []

    def make(url: str, *args: str, **env: str) -> ServerProcess:
        proc = ServerProcess(
            tmp_path / f"node{len(made)}", ["--store", url, "--lease-seconds", "2", *args], env
        )
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.kill()


def test_a_standbys_metrics_need_a_token_as_the_leaders_do(
    pg_instances: Callable[..., ServerProcess], postgres_url: str, tmp_path: Path
) -> None:
    url = fresh_database(postgres_url)
    path = str(auth_file(tmp_path / "auth.toml"))
    leader = pg_instances(url, "--auth-file", path, TIDINGS_METRICS_AUTH="true")
    standby = pg_instances(url, "--auth-file", path, TIDINGS_METRICS_AUTH="true")
    assert readiness(leader) == "ready" and readiness(standby) == "forwarding"
    for node in (leader, standby):
        refused = httpx.get(node.url + "/metrics")
        assert refused.status_code == 401, (node.url, refused.text)
        assert refused.json()["type"] == "Unauthorized"
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.get(node.url + "/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.get(node.url + "/metrics", headers=bearer("nobody")).status_code == 200
        assert httpx.get(node.url + "/healthz").status_code == 200  # still open
    # Without metrics_auth, a standby's /metrics stays open, as the leader's does.
    url = fresh_database(postgres_url)
    pg_instances(url, "--auth-file", path)
    open_standby = pg_instances(url, "--auth-file", path)
    assert readiness(open_standby) == "forwarding"
    assert httpx.get(open_standby.url + "/metrics").status_code == 200


# --- the Host allowlist (DNS rebinding) ------------------------------------------------

EVIL = "evil.example"


def _publish(srv: ServerProcess, topic: str, host: str | None) -> httpx.Response:
    """A publish as a page of ``host`` whose name was rebound to 127.0.0.1 sends it:
    its own host in ``Host`` and in ``Origin``, so the origin check passes."""
    headers = {} if host is None else {"Host": host, "Origin": f"http://{host}"}
    return httpx.post(
        f"{srv.url}/v1/namespaces/default/topics/{topic}/publish",
        content=b'{"messages": ["cmViaW5k"]}',  # "rebind"
        headers=headers,
    )


def _assert_refused(answer: httpx.Response) -> None:
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["type"] == "BadRequest" and "allowed_hosts" in body["error"]


def test_a_rebound_page_can_neither_read_nor_write(server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"secret"])
    evil = f"{EVIL}:{server.port}"
    _assert_refused(_publish(server, topic, evil))
    reads = [
        "/v1/namespaces/default/topics",
        f"/v1/namespaces/default/topics/{topic}/messages",
        "/metrics",
        "/console/",
        "/v1/whoami",
    ]
    for path in reads:
        answer = httpx.get(server.url + path, headers={"Host": evil})
        _assert_refused(answer)
        assert "secret" not in answer.text
    polled = httpx.post(
        f"{server.url}/v1/namespaces/default/topics/{topic}/poll",
        content=b"{}",
        headers={"Host": evil, "Content-Type": "application/json"},
    )
    _assert_refused(polled)
    # A name that merely starts like a loopback one is another name.
    for host in ("localhost.evil.example", "127.0.0.1.evil.example", f"{EVIL}:8470"):
        _assert_refused(httpx.get(server.url + "/v1/whoami", headers={"Host": host}))
    # Liveness and readiness answer whatever a probe calls the instance.
    for path in ("/healthz", "/readyz"):
        assert httpx.get(server.url + path, headers={"Host": evil}).status_code == 200
    with Client(server.url) as client:
        assert [m.payload for m in client.poll(topic)] == [b"secret"]  # nothing published


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.2", None],
)
def test_loopback_names_are_answered(server: ServerProcess, topic: str, host: str | None) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
    named = None if host is None else host.format(port=server.port)
    assert _publish(server, topic, named).status_code == 200
    with Client(server.url) as client:
        assert [m.payload for m in client.poll(topic)] == [b"rebind"]


def test_clients_and_the_cli_reach_a_loopback_server_by_name(
    server: ServerProcess, topic: str
) -> None:
    by_name = f"http://localhost:{server.port}"
    with Client(by_name) as client:
        client.create_topic(topic)
        client.publish(topic, [b"sync"])
        with client.transaction() as tx:
            tx.publish(topic, [b"tx"])
    result = CliRunner().invoke(main, ["topics", "list"], env={"TIDINGS_URL": by_name})
    assert result.exit_code == 0 and topic in result.stdout.split(), result.output

    async def use_async() -> list[bytes]:
        async with AsyncClient(by_name) as client:
            await client.publish(topic, [b"async"])
            return [m.payload for m in await client.poll(topic)]

    assert asyncio.run(use_async()) == [b"sync", b"tx", b"async"]
    assert httpx.get(by_name + "/console/").status_code == 200


def test_allowed_hosts_adds_names_to_a_loopback_server(
    start_server: Callable[..., ServerProcess],
) -> None:
    srv = start_server("--allowed-hosts", "tidings.example,Proxy.Example.")
    with Client(srv.url) as client:
        client.create_topic("t")
    for host in ("tidings.example", f"tidings.example:{srv.port}", "proxy.example:443"):
        assert _publish(srv, "t", host).status_code == 200, host
    assert _publish(srv, "t", f"localhost:{srv.port}").status_code == 200
    _assert_refused(_publish(srv, "t", f"{EVIL}:{srv.port}"))
    with Client(srv.url) as client:
        assert len(client.poll("t")) == 4
    anything = start_server(TIDINGS_ALLOWED_HOSTS="*")
    answer = httpx.get(anything.url + "/v1/namespaces/default/topics", headers={"Host": EVIL})
    assert answer.status_code == 200


def test_a_bad_allowed_hosts_stops_the_server_at_start(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "data", ["--allowed-hosts", "tidings.example:8470"])
    with pytest.raises(RuntimeError, match="without a port"):
        proc.start(timeout=10)
    assert proc.proc is not None and proc.proc.wait(5) == 2


def test_a_standby_answers_the_hosts_the_leader_does_and_forwards(
    pg_instances: Callable[..., ServerProcess], postgres_url: str
) -> None:
    url = fresh_database(postgres_url)
    leader = pg_instances(url, "--allowed-hosts", "tidings.example")
    standby = pg_instances(url, "--allowed-hosts", "tidings.example")
    assert readiness(leader) == "ready" and readiness(standby) == "forwarding"
    # Clients through the standby: the hop to the leader names the leader's address.
    with Client(standby.url) as client, Client(f"http://localhost:{standby.port}") as by_name:
        client.create_topic("t-hosts")
        client.publish("t-hosts", [b"one"])
        by_name.publish("t-hosts", [b"two"])
    for host in (f"tidings.example:{standby.port}", f"localhost:{standby.port}"):
        assert _publish(standby, "t-hosts", host).status_code == 200, host
    # Refused at the standby, before anything is forwarded.
    _assert_refused(_publish(standby, "t-hosts", f"{EVIL}:{standby.port}"))
    _assert_refused(httpx.get(standby.url + "/metrics", headers={"Host": EVIL}))
    for path in ("/healthz", "/readyz"):
        assert httpx.get(standby.url + path, headers={"Host": EVIL}).status_code == 200
    with Client(leader.url) as client:
        assert [m.payload for m in client.poll("t-hosts")] == [
            b"one",
            b"two",
            b"rebind",
            b"rebind",
        ]


def test_the_namespaces_queues_are_listed_to_who_may_consume_their_topic(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    srv = start_server("--auth-file", str(auth_file(tmp_path / "auth.toml")))
    with Client(srv.url, token=TOKENS["admin"]) as admin:
        for topic in ("t-open", "hidden"):
            admin.create_topic(topic)
            admin.publish(topic, [b"m"])
            admin.queue(topic, f"{topic}-workers").pop(max_messages=1)
        everything = [("hidden", "hidden-workers"), ("t-open", "t-open-workers")]
        assert sorted(admin.queues()) == everything
    with Client(srv.url, token=TOKENS["reader"]) as reader:
        assert reader.queues() == [("t-open", "t-open-workers")]
    for who in ("writer", "nobody"):
        with Client(srv.url, token=TOKENS[who]) as client:
            assert client.queues() == []
    raw = httpx.get(srv.url + "/v1/namespaces/default/queues", headers=bearer("reader"))
    assert raw.status_code == 200 and "hidden" not in raw.text

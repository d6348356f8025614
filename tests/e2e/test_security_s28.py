"""Security edges of the HTTP server, through the real server and the real client:
what a topic's stats show to whom, a standby's ``/metrics``, and the ``Host``
allowlist against DNS rebinding (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import ServerProcess, readiness
from tests.e2e.test_security import TOKENS, auth_file, bearer
from tidings import Client

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

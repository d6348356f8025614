"""Security edges of the HTTP server, through the real server and the real client:
what a topic's stats show to whom, a standby's ``/metrics``, and the ``Host``
allowlist against DNS rebinding (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
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

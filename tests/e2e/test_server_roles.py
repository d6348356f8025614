"""``--role``: messaging and transactions run apart; messaging never needs transactions.

Seed 000 (and DESIGN.md invariant 6): non-transactional publish and fetch keep
working while the transaction service is down.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e

NS = "/v1/namespaces/roles"


def test_messaging_alone(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server("--role", "messaging")
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        assert api.get("/readyz").status_code == 200
        assert api.put(f"{NS}/topics/t").status_code == 200
        assert api.post(f"{NS}/topics/t/publish", json={"messages": ["YQ=="]}).status_code == 200
        assert len(api.post(f"{NS}/topics/t/poll", json={}).json()) == 1
        for method, path in [
            ("POST", "/v1/transactions"),
            ("GET", "/v1/transactions"),
            ("POST", "/v1/transactions/5/commit"),
            ("POST", "/v1/transactions/producers"),
        ]:
            r = api.request(method, path, json={})
            assert r.status_code == 503, path
            assert r.json()["type"] == "RoleUnavailable"
        metrics = api.get("/metrics").text
        assert "tidings_messages_published_total" in metrics
        assert "tidings_transactions_begun_total" not in metrics
    assert not (srv.data_dir / "tx").exists()


def test_transactions_alone(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server("--role", "transactions")
    with httpx.Client(base_url=srv.url, timeout=10) as api:
        assert api.get("/readyz").status_code == 200
        wp = api.post("/v1/transactions").json()["writePointer"]
        assert api.post(f"/v1/transactions/{wp}/commit").status_code == 200
        for method, path in [
            ("PUT", f"{NS}/topics/t"),
            ("GET", f"{NS}/topics"),
            ("POST", f"{NS}/topics/t/publish"),
            ("POST", f"{NS}/topics/t/poll"),
        ]:
            r = api.request(method, path)
            assert r.status_code == 503, path
            assert r.json()["type"] == "RoleUnavailable"
        assert "tidings_transactions_begun_total 1.0" in api.get("/metrics").text
    assert not (srv.data_dir / "store").exists()


def test_messaging_survives_the_transaction_service(
    start_server: Callable[..., ServerProcess],
) -> None:
    """Two processes on one data dir; the transaction one dies; messaging carries on."""
    tx_srv = start_server("--role", "transactions")
    msg_srv = start_server("--role", "messaging", data_dir=tx_srv.data_dir)
    with httpx.Client(base_url=msg_srv.url, timeout=10) as api:
        api.put(f"{NS}/topics/t")
        writer = httpx.post(tx_srv.url + "/v1/transactions").json()
        body = {"messages": ["dHg="], "transactionWritePointer": writer["writePointer"]}
        assert api.post(f"{NS}/topics/t/publish", json=body).status_code == 200
        r = httpx.post(f"{tx_srv.url}/v1/transactions/{writer['writePointer']}/commit")
        assert r.status_code == 200
        reader = httpx.post(tx_srv.url + "/v1/transactions").json()

        tx_srv.kill()

        assert api.post(f"{NS}/topics/t/publish", json={"messages": ["YQ=="]}).status_code == 200
        got = api.post(f"{NS}/topics/t/poll", json={}).json()
        assert [base64.b64decode(m["payload"]) for m in got] == [b"tx", b"a"]
        # A transactional poll needs only the snapshot, not the transaction service.
        got = api.post(f"{NS}/topics/t/poll", json={"transaction": reader["encoded"]}).json()
        assert [base64.b64decode(m["payload"]) for m in got] == [b"tx", b"a"]
        assert api.get("/readyz").status_code == 200


@pytest.mark.timeout(30)  # before the fix, the group consumer waited forever
@pytest.mark.parametrize("shape", ["group", "plain"])
def test_a_consumer_iterating_on_a_process_without_its_service_is_told_at_once(
    start_server: Callable[..., ServerProcess], shape: str
) -> None:
    """A role is fixed for the process's life: a following consumer raises at once
    instead of waiting out what looks like an outage, forever."""
    from tidings import Client, RoleUnavailable, ServiceUnavailable

    srv = start_server("--role", "transactions")
    with Client(srv.url, namespace="roles") as client:
        consumer = client.consume("t", group="g") if shape == "group" else client.consume("t")
        with pytest.raises(RoleUnavailable) as raised:
            next(iter(consumer))
        assert isinstance(raised.value, ServiceUnavailable)  # what older callers catch
        assert not raised.value.retriable

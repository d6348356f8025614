"""The transaction service's endpoints through a real server (docs/api.md)."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess
from tidings.codec.transaction import decode_transaction

pytestmark = pytest.mark.e2e

TX = "/v1/transactions"


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def begin(api: httpx.Client, **body: Any) -> dict[str, Any]:
    r = api.post(TX, json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_begin_returns_a_snapshot(api: httpx.Client) -> None:
    first = begin(api)
    second = begin(api, timeout=5)
    assert set(second) == {"writePointer", "readPointer", "invalid", "inProgress", "encoded"}
    assert second["writePointer"] > first["writePointer"]
    assert first["writePointer"] in second["inProgress"]
    snapshot = decode_transaction(base64.b64decode(second["encoded"]))
    assert snapshot.write_pointer == second["writePointer"]
    assert snapshot.read_pointer == second["readPointer"]
    assert list(snapshot.in_progress) == second["inProgress"]
    assert list(snapshot.invalid) == second["invalid"]


def test_commit_and_state(api: httpx.Client) -> None:
    tx = begin(api)
    wp = tx["writePointer"]
    state = api.get(TX).json()
    assert set(state) == {"readPointer", "lastWritePointer", "inProgress", "invalid"}
    assert wp in [e["writePointer"] for e in state["inProgress"]]
    assert all(e["expiresAt"] > time.time() * 1000 for e in state["inProgress"])
    r = api.post(f"{TX}/{wp}/commit", json={"changes": [base64.b64encode(b"k").decode()]})
    assert (r.status_code, r.json()) == (200, {})
    state = api.get(TX).json()
    assert wp not in [e["writePointer"] for e in state["inProgress"]]
    assert state["lastWritePointer"] >= wp
    # Committing again: it already ended.
    r = api.post(f"{TX}/{wp}/commit")
    assert r.status_code == 410 and r.json()["type"] == "TransactionCommitted"
    r = api.post(f"{TX}/{wp}/abort")
    assert r.status_code == 410 and r.json()["type"] == "TransactionCommitted"
    r = api.post(f"{TX}/{wp}/invalidate")
    assert r.status_code == 410 and r.json()["type"] == "TransactionCommitted"


def test_write_conflict_is_409(api: httpx.Client) -> None:
    key = base64.b64encode(uuid.uuid4().bytes).decode()
    first, second = begin(api), begin(api)
    assert api.post(f"{TX}/{second['writePointer']}/commit", json={"changes": [key]}).is_success
    r = api.post(f"{TX}/{first['writePointer']}/commit", json={"changes": [key]})
    assert r.status_code == 409 and r.json()["type"] == "TransactionConflict"
    # Still in progress after a conflict: the client aborts it.
    assert api.post(f"{TX}/{first['writePointer']}/abort").status_code == 200


def test_unknown_transaction_is_404(api: httpx.Client) -> None:
    for verb in ("commit", "abort", "invalidate"):
        r = api.post(f"{TX}/12345/{verb}")
        assert r.status_code == 404, verb
        assert r.json()["type"] == "TransactionNotFound"


def test_timed_out_is_410(api: httpx.Client) -> None:
    wp = begin(api, timeout=0.2)["writePointer"]
    time.sleep(0.5)
    r = api.post(f"{TX}/{wp}/commit")
    assert r.status_code == 410 and r.json()["type"] == "TransactionTimedOut"
    assert wp in api.get(TX).json()["invalid"]


def test_abort(api: httpx.Client) -> None:
    wp = begin(api)["writePointer"]
    assert (api.post(f"{TX}/{wp}/abort", json={}).json()) == {
        "outcome": "aborted",
        "already": False,
    }
    again = api.post(f"{TX}/{wp}/abort")  # idempotent
    assert (again.status_code, again.json()) == (200, {"outcome": "aborted", "already": True})
    r = api.post(f"{TX}/{wp}/commit")
    assert r.status_code == 410 and r.json()["type"] == "TransactionAborted"


def test_invalidate_and_prune(api: httpx.Client) -> None:
    wp = begin(api)["writePointer"]
    r = api.post(f"{TX}/{wp}/invalidate")
    assert (r.status_code, r.json()) == (200, {"outcome": "invalidated", "already": False})
    assert wp in api.get(TX).json()["invalid"]
    assert wp in begin(api)["invalid"]
    r = api.post(f"{TX}/{wp}/commit")
    assert r.status_code == 410 and r.json()["type"] == "TransactionInvalid"
    r = api.post(f"{TX}/prune", json={"ids": [wp]})
    assert (r.status_code, r.json()) == (200, {"pruned": [wp]})
    assert wp not in api.get(TX).json()["invalid"]
    assert api.post(f"{TX}/prune", json={"below": 1}).json() == {"pruned": []}


def test_producers_and_fencing(api: httpx.Client) -> None:
    tid = "producer-" + uuid.uuid4().hex
    r = api.post(f"{TX}/producers", json={"transactionalId": tid})
    assert r.status_code == 200
    first = r.json()
    assert set(first) == {"transactionalId", "producerId", "epoch"}
    assert first["transactionalId"] == tid
    wp = begin(api, transactionalId=tid, epoch=first["epoch"])["writePointer"]

    second = api.post(f"{TX}/producers", json={"transactionalId": tid}).json()
    assert second["epoch"] > first["epoch"]
    assert second["producerId"] == first["producerId"]
    # The old holder is fenced, whatever it tries.
    zombie = {"transactionalId": tid, "epoch": first["epoch"]}
    for r in (
        api.post(f"{TX}/{wp}/commit", json=zombie),
        api.post(f"{TX}/{wp}/abort", json=zombie),
        api.post(TX, json=zombie),
    ):
        assert r.status_code == 403 and r.json()["type"] == "ProducerFenced"
    # Registering again aborted what the previous holder left open.
    assert api.post(f"{TX}/{wp}/commit").status_code == 410
    current = {"transactionalId": tid, "epoch": second["epoch"]}
    wp2 = begin(api, **current)["writePointer"]
    assert api.post(f"{TX}/{wp2}/commit", json=current).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (TX, {"timeout": 10**9}),
        (TX, {"timeout": -1}),
        (TX, {"timeout": "soon"}),
        (TX, {"transactionalId": 5}),
        (TX, {"epoch": "x"}),
        (f"{TX}/1/commit", {"changes": "abc"}),
        (f"{TX}/1/commit", {"changes": ["not base64!"]}),
        (f"{TX}/1/abort", {"epoch": True}),
        (f"{TX}/producers", {}),
        (f"{TX}/producers", {"transactionalId": ""}),
        (f"{TX}/prune", {"ids": "x"}),
        (f"{TX}/prune", {"below": "x"}),
    ],
)
def test_bad_requests_are_400(api: httpx.Client, path: str, body: object) -> None:
    r = api.post(path, json=body)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error", "type"}


def test_timeout_above_maximum(api: httpx.Client) -> None:
    r = api.post(TX, json={"timeout": 3601})
    assert r.status_code == 400 and r.json()["type"] == "TimeoutTooLarge"


@pytest.mark.parametrize("wp", ["abc", "-1", "1.5", "99999999999999999999"])
def test_bad_write_pointer_in_path_is_400(api: httpx.Client, wp: str) -> None:
    assert api.post(f"{TX}/{wp}/commit").status_code == 400


def test_json_only(api: httpx.Client) -> None:
    r = api.post(TX, content=b"", headers={"content-type": "avro/binary"})
    assert r.status_code == 415
    r = api.post(TX, content=b"[1]", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_transaction_metrics(api: httpx.Client) -> None:
    def value(name: str) -> float:
        for line in api.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(name)

    before = {n: value(f"tidings_transactions_{n}_total") for n in ("begun", "committed")}
    wp = begin(api)["writePointer"]
    api.post(f"{TX}/{wp}/commit")
    assert value("tidings_transactions_begun_total") == before["begun"] + 1
    assert value("tidings_transactions_committed_total") == before["committed"] + 1
    assert value("tidings_transactions_in_progress") >= 0

"""The begin's idempotency key over raw HTTP (``beginId``, docs/api.md): a begin sent
again with it answers the transaction it began while that is open, and begins nothing;
a key of an ended transaction, a key sent with other begin parameters and a malformed
key are refused, with nothing begun."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e

TX = "/v1/transactions"


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def _open(api: httpx.Client) -> set[int]:
    return {e["writePointer"] for e in api.get(TX).json()["inProgress"]}


def _begin(api: httpx.Client, **body: Any) -> httpx.Response:
    return api.post(TX, json=body)


def _begun_total(api: httpx.Client) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("tidings_transactions_begun_total "):
            return float(line.split()[1])
    raise AssertionError("no tidings_transactions_begun_total")


def test_the_same_begin_id_answers_the_same_transaction(api: httpx.Client) -> None:
    key = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
    begun = _begun_total(api)
    first = _begin(api, beginId=key, timeout=10)
    again = _begin(api, beginId=key, timeout=10)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json() == first.json()  # the snapshot as first answered
    assert _begun_total(api) == begun + 1
    wp = first.json()["writePointer"]
    assert wp in _open(api)
    assert api.post(f"{TX}/{wp}/commit").status_code == 200
    ended = _begin(api, beginId=key, timeout=10)
    assert ended.status_code == 410
    assert ended.json()["type"] == "TransactionCommitted"
    assert key in ended.json()["error"]


def test_the_key_of_an_aborted_transaction_is_410(api: httpx.Client) -> None:
    wp = _begin(api, beginId="aborted-1").json()["writePointer"]
    assert api.post(f"{TX}/{wp}/abort").status_code == 200
    r = _begin(api, beginId="aborted-1")
    assert (r.status_code, r.json()["type"]) == (410, "TransactionAborted")


@pytest.mark.parametrize("changed", ["timeout", "producer"])
def test_the_same_begin_id_with_other_parameters_is_409(api: httpx.Client, changed: str) -> None:
    if changed == "timeout":
        other: dict[str, Any] = {"timeout": 7}
    else:
        r = api.post(f"{TX}/producers", json={"transactionalId": "begin-s30"})
        other = {"transactionalId": "begin-s30", "epoch": r.json()["epoch"]}
    key = "conflict-" + changed
    wp = _begin(api, beginId=key).json()["writePointer"]
    before = _open(api)
    r = _begin(api, beginId=key, **other)
    assert (r.status_code, r.json()["type"]) == (409, "BeginIdConflict"), r.text
    assert _open(api) == before  # nothing was begun
    assert api.post(f"{TX}/{wp}/abort").status_code == 200


@pytest.mark.parametrize(
    "key",
    ["", "x" * 65, "has space", "slash/", "ünï", 12, ["k"], True],
    ids=["empty", "long", "space", "slash", "non-ascii", "int", "list", "bool"],
)
def test_a_bad_begin_id_is_400_and_begins_nothing(api: httpx.Client, key: object) -> None:
    before = _open(api)
    r = _begin(api, beginId=key)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "BadRequest"
    assert "beginId" in r.json()["error"]
    assert _open(api) == before

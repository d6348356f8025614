"""The generations group positions are of, in the one-request transaction's bodies:
per position in JSON, and in the Avro body's ``groupCommitGenerations``, which a body
written before it was added does without (docs/api.md, "A transaction in one
request")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tidings.codec import admin, avro, tx_publish
from tidings.errors import BadRequest
from tidings.structs import MessageId

A, B = MessageId(5, 0, 0, 0), MessageId(6, 1, 0, 0)
COMMIT = admin.TransactionGroupCommit("t", "g", "m", {0: A, 3: B}, 2, {3: 4})


def _envelope(**fields: Any) -> dict[str, Any]:
    return {
        "timeout": None,
        "transactionalId": None,
        "epoch": None,
        "topics": [],
        "acks": [],
        "groupCommits": admin.transaction_group_commits_avro([COMMIT]),
        **fields,
    }


def test_each_position_names_its_generation_in_both_bodies() -> None:
    body = tx_publish.write_transaction_publish([], None, None, None, (), [COMMIT])
    read = admin.read_transaction_group_commits(
        tx_publish.read_transaction_publish(body), binary=True
    )
    assert read == [COMMIT]
    as_json = orjson.loads(
        orjson.dumps({"groupCommits": admin.transaction_group_commits_json([COMMIT])})
    )
    assert as_json["groupCommits"][0]["positions"][1]["generation"] == 4
    assert "generation" not in as_json["groupCommits"][0]["positions"][0]
    assert admin.read_transaction_group_commits(as_json) == [COMMIT]


def test_an_avro_body_written_before_the_generations_were_added_still_reads() -> None:
    # Its positions name no generation: the server goes by the newest it told the
    # member, as it did when the body was written.
    body = avro.write(_envelope(), avro.TRANSACTION_PUBLISH_REQUEST_V1)
    obj = tx_publish.read_transaction_publish(body)
    assert admin.read_transaction_group_commits(obj, binary=True) == [
        COMMIT._replace(generation=None, generations=None)
    ]


@pytest.mark.parametrize(
    "named",
    [
        [{"generation": 1, "positions": []}, {"generation": 1, "positions": []}],  # 2 for 1
        [{"generation": -1, "positions": []}],
        [{"generation": None, "positions": [1]}],  # 1 for 2 positions
        [{"generation": None, "positions": [1, -3]}],
    ],
)
def test_bad_avro_generations_are_refused(named: list[dict[str, Any]]) -> None:
    body = avro.write(_envelope(groupCommitGenerations=named), avro.TRANSACTION_PUBLISH_REQUEST)
    obj = tx_publish.read_transaction_publish(body)
    with pytest.raises(BadRequest):
        admin.read_transaction_group_commits(obj, binary=True)


@pytest.mark.parametrize("generation", [-1, "2", 1.5, True])
def test_bad_json_position_generations_are_refused(generation: object) -> None:
    item = admin.transaction_group_commits_json([COMMIT])[0]
    item["positions"][0]["generation"] = generation
    with pytest.raises(BadRequest):
        admin.read_transaction_group_commits({"groupCommits": [item]})
    with pytest.raises(BadRequest):
        admin.read_position_generations(item)

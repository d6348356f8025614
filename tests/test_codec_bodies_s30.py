"""The fields each JSON request body may have: refused by name otherwise, and the same
fields as ``/openapi.json``'s closed schemas list (so the contract tests send nothing
the server refuses, and the server takes nothing the contract does not name)."""

from __future__ import annotations

import pytest

from tidings.codec import admin, queue_bodies
from tidings.codec import json_bodies as jb
from tidings.errors import BadRequest
from tidings.server.openapi import openapi_document


def test_only_names_the_unknown_field() -> None:
    jb.only({"messages": []}, jb.PUBLISH_FIELDS, "publish request")
    with pytest.raises(BadRequest, match=r"'mesages'.*publish request"):
        jb.only({"mesages": [], "extras": None}, jb.PUBLISH_FIELDS, "publish request")


def test_a_nested_unknown_field_is_named_with_its_place() -> None:
    body = {"messages": ["AA=="], "extras": [{"key": "AA==", "headres": {}}]}
    with pytest.raises(BadRequest, match=r"'headres'.*extras\[0\]"):
        jb.publish_request(body)
    body = {"consumerId": "c", "ids": ["A" * 26 + "A="], "transactionWritePointr": 1}
    with pytest.raises(BadRequest, match="'transactionWritePointr'"):
        queue_bodies.read_ack_request(body)


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        ("PublishRequest", jb.PUBLISH_FIELDS),
        ("ConsumeRequest", jb.CONSUME_FIELDS),
        ("BeginRequest", admin.BEGIN_FIELDS),
        ("TransactionalPublishRequest", admin.TRANSACTION_PUBLISH_FIELDS),
        ("GroupCommitRequest", admin.GROUP_COMMIT_FIELDS),
        ("QueueAckRequest", queue_bodies.ACK_FIELDS),
    ],
)
def test_the_contract_lists_the_fields_the_server_takes(
    schema: str, fields: frozenset[str]
) -> None:
    found = openapi_document("test")["components"]["schemas"][schema]
    assert found["additionalProperties"] is False
    assert set(found["properties"]) == fields


def test_every_json_request_body_of_the_contract_is_closed_but_the_open_two() -> None:
    document = openapi_document("test")
    schemas = document["components"]["schemas"]
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            name = body["schema"]["$ref"].rsplit("/", 1)[-1]
            if name in ("TopicProperties", "PublishResponse"):
                continue
            assert schemas[name]["additionalProperties"] is False, (method, path)

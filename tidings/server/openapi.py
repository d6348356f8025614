"""The REST contract (docs/api.md) as an OpenAPI 3.1 document, served at ``/openapi.json``.

Built from plain dicts rather than inferred from the routes: the document is the
contract, and ``tests/e2e/test_server_fuzz.py`` fuzzes the server against it. Avro
bodies are described as binary strings carrying CDAP TMS's Avro schema in
``x-avro-schema`` (the schemas come from :mod:`tidings.codec.wire`, never copied).
"""

from __future__ import annotations

from typing import Any

from tidings.codec import payload_frames, wire
from tidings.codec.admin import BEGIN_ID_MAX
from tidings.consumers.queues import MAX_ACK_TIMEOUT_MS, MAX_DELIVERIES_LIMIT
from tidings.messaging.names import MAX_TTL
from tidings.names import INT64_MAX

__all__ = ["openapi_document"]

JSON = "application/json"
AVRO = wire.AVRO.value
AVRO_EXT = wire.AVRO_EXT.value
COLUMNS = wire.COLUMNS.value
_COLUMNS_BODY = {
    "schema": {
        "type": "string",
        "format": "binary",
        "description": (
            "the columnar poll response (docs/api.md, 'The columnar poll response'); addition"
        ),
    }
}

PAYLOADS = payload_frames.CONTENT_TYPE
_PAYLOADS_BODY = {
    "schema": {
        "type": "string",
        "format": "binary",
        "description": (
            "payloads (and keys) with their positions up front (docs/api.md, 'The "
            "payloads request body'); answered as the same request in JSON; addition"
        ),
    }
}

_INT64 = {"type": "integer", "format": "int64"}
_INT64_RANGE = {"type": "integer", "minimum": -(2**63), "maximum": INT64_MAX}
_POSITIVE_INT64 = {"type": "integer", "format": "int64", "minimum": 1, "maximum": INT64_MAX}
_BYTES = {"type": "string", "format": "byte", "description": "standard base64"}
#: A Payload Table position of a payload range: [writeTs, seq].
_POSITION = {
    "type": "array",
    "minItems": 2,
    "maxItems": 2,
    "items": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
}
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}
#: A message id in JSON: 20 bytes, standard base64 (28 characters, one "=").
_MESSAGE_ID = {
    "type": "string",
    "pattern": "^[A-Za-z0-9+/]{26}[AEIMQUYcgkosw048]=$",
    "description": "a 20-byte message id, standard base64",
}
#: A group member's id, as join answers it.
_MEMBER_ID = {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$"}
#: The positions of a group commit: the last message consumed, per partition.
_GROUP_POSITIONS = {
    "type": "array",
    "minItems": 1,
    "description": "the id of the last message consumed, per partition (each partition once)",
    "items": {
        "type": "object",
        "required": ["partition", "id"],
        "properties": {
            "partition": {"type": "integer", "minimum": 0, "maximum": 1023},
            "id": _MESSAGE_ID,
            "generation": {
                "oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
                "description": "the generation this position is of, where it differs "
                "from the commit's (which it stands for here)",
            },
        },
    },
}
#: What tidings.tx.producers accepts: 1-255 characters, none of them a control character.
_TRANSACTIONAL_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]*$",
}
#: transactionalId and epoch come together or not at all (a registered producer); a
#: null counts as absent, as for every optional field.
_PRODUCER_RULE = {
    "allOf": [
        {
            "if": {"required": [a], "properties": {a: {"not": {"type": "null"}}}},
            "then": {"required": [b], "properties": {b: {"not": {"type": "null"}}}},
        }
        for a, b in (("epoch", "transactionalId"), ("transactionalId", "epoch"))
    ]
}


def _decimal_range(high: int) -> str:
    """A regular expression for the decimal numbers 1..high (leading zeros allowed, as
    the server reads them)."""
    digits = str(high)
    shorter = f"[1-9][0-9]{{0,{len(digits) - 2}}}" if len(digits) > 1 else ""
    same_length = []
    for i, d in enumerate(digits):
        rest = len(digits) - i - 1
        low = "1" if i == 0 else "0"
        if int(d) > int(low):
            top = str(int(d) - 1)
            same_length.append(digits[:i] + f"[{low}-{top}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    same_length.append(digits)
    return "^0*(" + "|".join(filter(None, [shorter, *same_length])) + ")$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [schema, {"type": "null"}]}


def _avro_schema(name: str) -> Any:
    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if not k.startswith("__")}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(wire.SCHEMAS[name])


def _avro(name: str) -> dict[str, Any]:
    return {"type": "string", "format": "binary", "x-avro-schema": _avro_schema(name)}


def _content(json_schema: dict[str, Any], avro: str | None, avro_ext: str | None) -> dict[str, Any]:
    content: dict[str, Any] = {JSON: {"schema": json_schema}}
    if avro is not None:
        content[AVRO] = {"schema": _avro(avro)}
    if avro_ext is not None:
        content[AVRO_EXT] = {"schema": _avro(avro_ext)}
    return content


#: Where a group, a queue or a reset starts: the two ends, each by both its names.
_STARTS = ["earliest", "latest", "beginning", "end"]


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref("Error")}}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


_COMMON_ERRORS = {
    "400": _error("malformed body, wrong types, bad base64 or an invalid name"),
    "401": _error("with an auth file: no bearer token, or one nobody has (Unauthorized)"),
    "403": _error("with an auth file: the principal may not do this (Forbidden)"),
    "413": _error("body larger than max_body_bytes"),
    "415": _error("unsupported Content-Type"),
    "503": _error("the service does not run in this process (role)"),
}


def _op(
    summary: str,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    required: bool = False,
    tags: tuple[str, ...] = (),
    parameters: list[dict[str, Any]] | None = None,
    errors: bool = True,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": list(tags)}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": required, "content": body}
    op["responses"] = {**(_COMMON_ERRORS if errors else {}), **responses}
    return op


def _schemas(max_timeout: float) -> dict[str, Any]:
    timeout = {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": max_timeout,
        "description": "seconds (the server's tx_max_timeout at most)",
    }
    epoch = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
    extras = {
        "type": "object",
        "properties": {
            "key": _nullable(_BYTES),
            "headers": {"type": "object", "additionalProperties": _BYTES},
            "ttl": _nullable({"type": "integer", "minimum": 1, "maximum": INT64_MAX}),
        },
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error", "type"],
            "properties": {"error": {"type": "string"}, "type": {"type": "string"}},
        },
        "TopicProperties": {
            "type": "object",
            "description": "ttl: positive integer seconds (number or digit string); "
            "other keys kept as strings. An update replaces all properties.",
            "properties": {
                "ttl": {
                    "oneOf": [
                        {"type": "integer", "minimum": 1, "maximum": MAX_TTL},
                        {"type": "string", "pattern": _decimal_range(MAX_TTL)},
                    ]
                }
            },
            "additionalProperties": {"oneOf": [{"type": "string"}, _INT64_RANGE]},
            "propertyNames": {"minLength": 1},
        },
        "Topic": {
            "type": "object",
            "required": ["name", "properties", "generation"],
            "properties": {
                "name": _NAME,
                "properties": {"type": "object", "additionalProperties": {"type": "string"}},
                "generation": {"type": "integer"},
            },
        },
        "TopicList": {"type": "array", "items": _NAME},
        "TopicStats": {
            "type": "object",
            "properties": {
                "namespace": {"type": "string"},
                "topic": {"type": "string"},
                "messageCount": {"type": "integer"},
                "bytes": {"type": "integer"},
                "oldestId": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                "newestId": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                "oldestTime": _nullable({"type": "integer"}),
                "newestTime": _nullable({"type": "integer"}),
                "messagesPublished": {"type": "integer"},
                "bytesPublished": {"type": "integer"},
                "fetches": {"type": "integer"},
                "publishRate": {"type": "number"},
                "fetchRate": {"type": "number"},
                "lastStableId": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                "groupLag": {
                    "type": "object",
                    "description": "each consumer group of the topic with its lag (null: "
                    "no partition has one, a group starting at latest that committed nothing; "
                    "empty for a principal that may publish to the topic but not consume it)",
                    "additionalProperties": _nullable({"type": "integer", "minimum": 0}),
                },
            },
        },
        "TopicEnd": {
            "type": "object",
            "required": ["newestId", "lastStableId", "stableKnown"],
            "properties": {
                "newestId": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                "lastStableId": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                "stableKnown": {"type": "boolean"},
            },
        },
        "PublishRequest": {
            "type": "object",
            "description": "CDAP TMS PublishRequest; extras is a Tidings addition",
            "required": ["messages"],
            "properties": {
                "transactionWritePointer": _nullable(_INT64),
                "messages": {"type": "array", "items": _BYTES},
                "extras": _nullable({"type": "array", "items": _nullable(extras)}),
                "payloadRanges": _nullable(
                    {
                        "type": "array",
                        "description": "publish only, JSON only: with "
                        "transactionWritePointer and no messages, publish just the "
                        "stored rows inside these ranges (each a store's "
                        "Tidings-Payload-Range), one entry per range; at most 10000, "
                        "first <= last, no overlaps",
                        "maxItems": 10000,
                        "items": _ref("PayloadRange"),
                    }
                ),
            },
        },
        "StoreRequest": {
            "type": "object",
            "description": "a PublishRequest under a write pointer; no payloadRanges",
            "required": ["transactionWritePointer", "messages"],
            "properties": {
                "transactionWritePointer": _POSITIVE_INT64,
                "messages": {"type": "array", "items": _BYTES},
                "extras": _nullable({"type": "array", "items": _nullable(extras)}),
            },
        },
        "PayloadRange": {
            "type": "object",
            "description": "Payload Table positions [writeTs, seq], both ends inclusive",
            "required": ["first", "last"],
            "properties": {
                "first": _POSITION,
                "last": _POSITION,
            },
        },
        "PublishResponse": {
            "type": "object",
            "description": "CDAP TMS PublishResponse: the rollback information",
            "required": [
                "transactionWritePointer",
                "startTimestamp",
                "startSequenceId",
                "endTimestamp",
                "endSequenceId",
            ],
            "properties": {
                "transactionWritePointer": _POSITIVE_INT64,
                "startTimestamp": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                "startSequenceId": {"type": "integer", "minimum": 0, "maximum": 65535},
                "endTimestamp": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                "endSequenceId": {"type": "integer", "minimum": 0, "maximum": 65535},
            },
        },
        "RollbackResponse": {
            "type": "object",
            "required": ["rolledBack"],
            "properties": {"rolledBack": {"type": "integer", "minimum": 0}},
        },
        "ConsumeRequest": {
            "type": "object",
            "description": "CDAP TMS ConsumeRequest; startFrom is a base64 message id "
            "or a timestamp in ms",
            "properties": {
                "startFrom": {
                    "oneOf": [
                        _MESSAGE_ID,
                        {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                        {"type": "null"},
                    ]
                },
                "inclusive": {"type": "boolean", "default": True},
                "limit": _nullable({"type": "integer", "minimum": 1, "maximum": 2**31 - 1}),
                "transaction": _nullable(_BYTES),
            },
        },
        "Messages": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "payload"],
                "properties": {
                    "id": _BYTES,
                    "payload": _BYTES,
                    "key": _nullable(_BYTES),
                    "headers": {"type": "object", "additionalProperties": _BYTES},
                },
            },
        },
        "MessageIds": {
            "type": "array",
            "description": "the ids an ids-only poll (fields=id) returns, oldest first",
            "items": _BYTES,
        },
        "BeginRequest": {
            "type": "object",
            "properties": {
                "timeout": _nullable(timeout),
                "transactionalId": _nullable(_TRANSACTIONAL_ID),
                "epoch": _nullable(epoch),
                "beginId": _nullable(
                    {
                        "type": "string",
                        "pattern": f"^[A-Za-z0-9._~-]{{1,{BEGIN_ID_MAX}}}$",
                        "description": "idempotency key: a begin sent again with it, "
                        "while its transaction is open, answers that transaction",
                    }
                ),
            },
            **_PRODUCER_RULE,
        },
        "TransactionSnapshot": {
            "type": "object",
            "required": ["writePointer", "readPointer", "invalid", "inProgress", "encoded"],
            "properties": {
                "writePointer": _INT64,
                "readPointer": _INT64,
                "invalid": {"type": "array", "items": _INT64},
                "inProgress": {"type": "array", "items": _INT64},
                "encoded": _BYTES,
            },
        },
        "TransactionalPublishRequest": {
            "type": "object",
            "description": "a whole transaction: begin, ack queue messages, commit group "
            "positions, publish each topic, commit (addition); topics may be left out "
            "where there are acks or group commits",
            "anyOf": [
                {"required": ["topics"]},
                {"required": ["acks"], "properties": {"acks": {"minItems": 1}}},
                {
                    "required": ["groupCommits"],
                    "properties": {"groupCommits": {"type": "array", "minItems": 1}},
                },
            ],
            "properties": {
                "groupCommits": _nullable(
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "description": "a group commit (GroupCommitRequest, without a "
                            "write pointer) plus its topic and group, one "
                            "per member: the positions move if and only if the transaction commits",
                            "required": ["topic", "group", "memberId", "positions"],
                            "properties": {
                                "topic": _NAME,
                                "group": _NAME,
                                "memberId": _MEMBER_ID,
                                "positions": _GROUP_POSITIONS,
                                "generation": {
                                    **_nullable({"type": "integer", "minimum": 0}),
                                    "description": "the generation the positions are of "
                                    "(the oldest, where a position names its own): a "
                                    "partition held since a newer one is fenced",
                                },
                            },
                        },
                    }
                ),
                "acks": _nullable(
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "description": "a queue ack (QueueAckRequest) plus its topic and "
                            "queue: it counts if and only if the transaction commits",
                            "required": ["topic", "queue", "consumerId", "ids"],
                            "properties": {
                                "topic": _NAME,
                                "queue": _NAME,
                                "consumerId": {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$"},
                                "ids": {"type": "array", "minItems": 1, "items": _MESSAGE_ID},
                            },
                        },
                    }
                ),
                "topics": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "description": "a JSON PublishRequest without a write pointer, "
                        "plus its topic (distinct, at least one message each)",
                        "required": ["topic", "messages"],
                        "properties": {
                            "topic": _NAME,
                            "messages": {"type": "array", "minItems": 1, "items": _BYTES},
                            "extras": _nullable({"type": "array", "items": _nullable(extras)}),
                        },
                    },
                },
                "timeout": _nullable(timeout),
                "transactionalId": _nullable(_TRANSACTIONAL_ID),
                "epoch": _nullable(epoch),
                "beginId": {"description": "taken and ignored (docs/api.md)"},
            },
            **_PRODUCER_RULE,
        },
        "CommittedTransaction": {
            "type": "object",
            "required": ["writePointer", "readPointer", "invalid", "inProgress"],
            "properties": {
                "writePointer": _INT64,
                "readPointer": _INT64,
                "invalid": {"type": "array", "items": _INT64},
                "inProgress": {"type": "array", "items": _INT64},
            },
        },
        "CommitRequest": {
            "type": "object",
            "properties": {
                "changes": _nullable({"type": "array", "items": _BYTES}),
                "transactionalId": _nullable(_TRANSACTIONAL_ID),
                "epoch": _nullable(epoch),
            },
            **_PRODUCER_RULE,
        },
        "AbortRequest": {
            "type": "object",
            "properties": {
                "transactionalId": _nullable(_TRANSACTIONAL_ID),
                "epoch": _nullable(epoch),
            },
            **_PRODUCER_RULE,
        },
        "TransactionState": {
            "type": "object",
            "required": ["readPointer", "lastWritePointer", "inProgress", "invalid"],
            "properties": {
                "readPointer": _INT64,
                "lastWritePointer": _INT64,
                "inProgress": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"writePointer": _INT64, "expiresAt": _INT64},
                    },
                },
                "invalid": {"type": "array", "items": _INT64},
            },
        },
        "ProducerRequest": {
            "type": "object",
            "required": ["transactionalId"],
            "properties": {"transactionalId": _TRANSACTIONAL_ID},
        },
        "Producer": {
            "type": "object",
            "required": ["transactionalId", "producerId", "epoch"],
            "properties": {
                "transactionalId": {"type": "string"},
                "producerId": _INT64,
                "epoch": {"type": "integer"},
            },
        },
        "PruneRequest": {
            "type": "object",
            "properties": {
                "below": _nullable({"type": "integer", "minimum": 0, "maximum": INT64_MAX}),
                "ids": _nullable({"type": "array", "items": _POSITIVE_INT64}),
            },
        },
        "PruneResponse": {
            "type": "object",
            "required": ["pruned"],
            "properties": {"pruned": {"type": "array", "items": _INT64}},
        },
        "Empty": {"type": "object", "maxProperties": 0},
        "TransactionEnd": {
            "type": "object",
            "required": ["outcome", "already"],
            "properties": {
                "outcome": {
                    "type": "string",
                    "enum": ["aborted", "invalidated", "timedOut", "fenced", "unlogged"],
                    "description": "aborted, or how the transaction is invalid",
                },
                "already": {
                    "type": "boolean",
                    "description": "it had ended so before the request (nothing changed)",
                },
            },
        },
        **_group_schemas(),
    }


def _group_schemas() -> dict[str, Any]:
    member_id = _MEMBER_ID
    partitions = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    null = {"type": "null"}
    return {
        "GroupJoinRequest": {
            "type": "object",
            "properties": {
                "memberId": _nullable(member_id),
                "sessionTimeoutMs": _nullable(
                    {"type": "integer", "minimum": 100, "maximum": 300_000, "default": 10_000}
                ),
                "partitions": _nullable(
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 1024,
                        "description": "virtual partitions; only when the group is created",
                    }
                ),
                "start": _nullable(
                    {
                        "type": "string",
                        "enum": _STARTS,
                        "description": "where partitions without a position start; only "
                        "when the group is created",
                    }
                ),
            },
        },
        "GroupAssignment": {
            "type": "object",
            "required": ["memberId", "generation", "partitions", "partitionCount"],
            "properties": {
                "memberId": member_id,
                "generation": {"type": "integer", "minimum": 1},
                "partitions": partitions,
                "partitionCount": {"type": "integer", "minimum": 1},
                "ownedSince": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "description": "per entry of partitions, the generation since which "
                    "the member has held it without a break",
                },
            },
        },
        "GroupHeartbeatRequest": {
            "type": "object",
            "description": "a heartbeat or leave: the member alone",
            "required": ["memberId"],
            "properties": {"memberId": member_id},
        },
        "GroupMemberRequest": {
            "type": "object",
            "description": "a member's poll",
            "required": ["memberId"],
            "properties": {
                "memberId": member_id,
                "limit": _nullable({"type": "integer", "minimum": 1, "maximum": INT64_MAX}),
            },
        },
        "GroupCommitRequest": {
            "type": "object",
            "required": ["memberId", "positions"],
            "properties": {
                "memberId": member_id,
                "positions": _GROUP_POSITIONS,
                "transactionWritePointer": _nullable(_POSITIVE_INT64),
                "generation": {
                    **_nullable({"type": "integer", "minimum": 0}),
                    "description": "the newest generation the member heard of: a "
                    "partition it has held only since a newer one is fenced",
                },
            },
        },
        "GroupChanges": {
            "type": "object",
            "required": ["changes"],
            "properties": {"changes": {"type": "array", "items": _BYTES}},
        },
        "GroupRollbackRequest": {
            "type": "object",
            "description": "at least one of transactionWritePointer (remove its positions) "
            "and memberId (rewind the member to its committed positions)",
            "anyOf": [
                {"required": ["transactionWritePointer"]},
                {"required": ["memberId"], "properties": {"memberId": member_id}},
            ],
            "properties": {
                "transactionWritePointer": _POSITIVE_INT64,
                "memberId": _nullable(member_id),
            },
        },
        "GroupResetRequest": {
            "type": "object",
            "description": "exactly one of to, id (after that message) or time (ms)",
            # Each one's schema is its branch's; listed here as the body's only fields.
            "properties": {"to": {}, "id": {}, "time": {}},
            "oneOf": [
                {
                    "required": ["to"],
                    "properties": {
                        "to": {"type": "string", "enum": _STARTS},
                        "id": null,
                        "time": null,
                    },
                },
                {
                    "required": ["id"],
                    "properties": {"id": _MESSAGE_ID, "to": null, "time": null},
                },
                {
                    "required": ["time"],
                    "properties": {
                        "time": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                        "to": null,
                        "id": null,
                    },
                },
            ],
        },
        "Group": {
            "type": "object",
            "required": ["group", "partitionCount", "generation", "members", "partitions"],
            "properties": {
                "group": _NAME,
                "partitionCount": {"type": "integer"},
                "generation": {"type": "integer"},
                "start": {"type": "string"},
                "members": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"memberId": member_id, "partitions": partitions},
                    },
                },
                "partitions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "partition": {"type": "integer"},
                            "owner": _nullable(member_id),
                            "position": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                            "lag": _nullable({"type": "integer", "minimum": 0}),
                            "lagExact": {"type": "boolean"},
                        },
                    },
                },
                "end": _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"}),
                "lag": _nullable({"type": "integer", "minimum": 0}),
            },
        },
        **_queue_schemas(),
    }


def _param(name: str, schema: dict[str, Any], where: str = "path") -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


def _messaging_paths() -> dict[str, Any]:
    ns = [_param("ns", _NAME)]
    nst = [*ns, _param("topic", _NAME)]
    tags = ("topics",)
    not_found = {"404": _error("unknown topic")}
    topic_ok = {"200": _json("the topic", _ref("Topic"))}
    properties = {JSON: {"schema": _ref("TopicProperties")}}
    empty_ok = {
        "description": "durable; empty body",
        "content": {JSON: {}, AVRO: {}, AVRO_EXT: {}},
    }
    publish_body = _content(_ref("PublishRequest"), "PublishRequest", "PublishRequestExt")
    publish_body[PAYLOADS] = _PAYLOADS_BODY
    store_body = _content(_ref("StoreRequest"), "PublishRequest", "PublishRequestExt")
    store_body[PAYLOADS] = _PAYLOADS_BODY
    base = "/v1/namespaces/{ns}"
    topic = base + "/topics/{topic}"
    return {
        base + "/topics": {
            "get": _op(
                "List the namespace's topics (sorted)",
                {"200": _json("topic names", _ref("TopicList"))},
                tags=tags,
                parameters=ns,
            )
        },
        topic: {
            "put": _op(
                "Create a topic",
                {**topic_ok, "409": _error("the topic exists")},
                body=properties,
                tags=tags,
                parameters=nst,
            ),
            "get": _op("Get a topic", {**topic_ok, **not_found}, tags=tags, parameters=nst),
            "delete": _op(
                "Delete a topic",
                {"200": _json("deleted", _ref("Empty")), **not_found},
                tags=tags,
                parameters=nst,
            ),
        },
        topic + "/properties": {
            "put": _op(
                "Replace a topic's properties (no body: back to the defaults)",
                {**topic_ok, **not_found},
                body=properties,
                tags=tags,
                parameters=nst,
            )
        },
        topic + "/end": {
            "get": _op(
                "Where the topic ends: newest message, last stable position (addition)",
                {"200": _json("the end", _ref("TopicEnd")), **not_found},
                tags=tags,
                parameters=nst,
            )
        },
        topic + "/stats": {
            "get": _op(
                "A topic's contents and traffic (addition)",
                {"200": _json("stats", _ref("TopicStats")), **not_found},
                tags=tags,
                parameters=nst,
            )
        },
        topic + "/publish": {
            "post": _op(
                "Publish messages (non-transactional, transactional, or a stored write pointer)",
                {
                    "200": {
                        "description": "durable. Non-transactional: an empty body "
                        "(application/octet-stream, as CDAP TMS); transactional: the "
                        "rollback information (PublishResponse) in the request's medium",
                        "content": {
                            **_content(_ref("PublishResponse"), "PublishResponse", None),
                            "application/octet-stream": {
                                "schema": {"type": "string", "maxLength": 0}
                            },
                        },
                    },
                    **not_found,
                    "409": _error(
                        "sealed pointer, or an idempotent publish skipped sequence numbers "
                        "(OutOfOrderSequence)"
                    ),
                    "410": _error("the transaction already ended"),
                },
                body=publish_body,
                required=True,
                tags=("messages",),
                parameters=[
                    *nst,
                    _param(
                        "Tidings-Producer-Id",
                        {
                            "type": "string",
                            "pattern": "^[0-9a-fA-F]{32}$",
                            "description": "idempotent publish: the producer (with "
                            "Tidings-Sequence; non-transactional only)",
                        },
                        "header",
                    ),
                    _param(
                        "Tidings-Sequence",
                        {
                            "type": "string",
                            "pattern": "^[0-9]{1,18}$",
                            "description": "idempotent publish: this batch's number, one "
                            "after the producer's previous one on the topic",
                        },
                        "header",
                    ),
                ],
            )
        },
        topic + "/store": {
            "post": _op(
                "Store payloads under a transaction write pointer (Payload Table)",
                {
                    "200": {
                        **empty_ok,
                        "headers": {
                            "Tidings-Payload-Range": {
                                "description": "the rows' positions, "
                                "<firstWriteTs>.<firstSeq>-<lastWriteTs>.<lastSeq>; a "
                                "publish's payloadRanges can name them",
                                "schema": {
                                    "type": "string",
                                    "pattern": "^[0-9]+\\.[0-9]+-[0-9]+\\.[0-9]+$",
                                },
                            }
                        },
                    },
                    **not_found,
                },
                body=store_body,
                required=True,
                tags=("messages",),
                parameters=nst,
            )
        },
        topic + "/rollback": {
            "post": _op(
                "Roll back a transactional publish (body: its PublishResponse)",
                {
                    "200": {
                        "description": "rolled back; empty body in Avro",
                        "content": {
                            JSON: {"schema": _ref("RollbackResponse")},
                            AVRO: {},
                            AVRO_EXT: {},
                        },
                    },
                    **not_found,
                },
                body=_content(_ref("PublishResponse"), "PublishResponse", "PublishResponse"),
                required=True,
                tags=("messages",),
                parameters=nst,
            )
        },
        topic + "/poll": {
            "post": _op(
                "Fetch messages in order (additions: waitMs, isolation, fields, maxBytes)",
                {
                    "200": {
                        "description": (
                            "messages, oldest first (MessageIds with fields=id); headers "
                            "Tidings-Count and Tidings-Last-Id give the page's extent, "
                            "Tidings-More: true that it reached its byte bound, "
                            "Tidings-Topic-Generation the generation of the topic it "
                            "was read from"
                        ),
                        "content": {
                            # anyOf: an empty page is both an empty list of messages
                            # and an empty list of ids.
                            JSON: {"schema": {"anyOf": [_ref("Messages"), _ref("MessageIds")]}},
                            AVRO: {"schema": {"anyOf": [_avro("Messages"), _avro("MessageIds")]}},
                            AVRO_EXT: {
                                "schema": {"anyOf": [_avro("MessagesExt"), _avro("MessageIds")]}
                            },
                            # Only to a poll whose Accept names it (never with fields=id).
                            COLUMNS: _COLUMNS_BODY,
                        },
                    },
                    **not_found,
                },
                body=_content(_ref("ConsumeRequest"), "ConsumeRequest", "ConsumeRequest"),
                tags=("messages",),
                parameters=[
                    *nst,
                    _param(
                        "waitMs",
                        {"type": "integer", "minimum": 0, "maximum": 10**18 - 1},
                        "query",
                    ),
                    _max_bytes_param(),
                    _param(
                        "isolation",
                        {
                            "type": "string",
                            "enum": ["read_committed", "read_uncommitted"],
                            "default": "read_uncommitted",
                            "description": (
                                "read_committed without a body transaction: the server "
                                "takes a fresh snapshot at each fetch (addition; 503 "
                                "where the transaction service does not run)"
                            ),
                        },
                        "query",
                    ),
                    _param(
                        "fields",
                        {
                            "type": "string",
                            "enum": ["all", "id"],
                            "default": "all",
                            "description": (
                                "id: only the ids of the messages the poll would return "
                                "(addition; MessageIds)"
                            ),
                        },
                        "query",
                    ),
                ],
            )
        },
    }


def _max_bytes_param() -> dict[str, Any]:
    """The ``maxBytes`` query parameter of a poll, a group poll and a pop."""
    return _param(
        "maxBytes",
        {
            "type": "integer",
            "minimum": 1,
            "maximum": 10**18 - 1,
            "description": (
                "the answer stops after the message that brings its bytes to this "
                "(addition; capped at the server's fetch_max_bytes, its default)"
            ),
        },
        "query",
    )


def _group_paths() -> dict[str, Any]:
    tags = ("consumer groups",)
    params = [
        _param("ns", _NAME),
        _param("topic", _NAME),
        _param("group", _NAME),
    ]
    base = "/v1/namespaces/{ns}/topics/{topic}/groups"
    group = base + "/{group}"
    unknown = {"404": _error("unknown topic, group or member (join again)")}
    assignment = {"200": _json("the member's assignment", _ref("GroupAssignment"))}
    member = {JSON: {"schema": _ref("GroupMemberRequest")}}
    member_only = {JSON: {"schema": _ref("GroupHeartbeatRequest")}}
    ok = {"200": _json("done", _ref("Empty"))}
    return {
        base: {
            "get": _op(
                "The topic's consumer groups (addition)",
                {"200": _json("group names", _ref("TopicList")), **unknown},
                tags=tags,
                parameters=params[:2],
            )
        },
        group: {
            "get": _op(
                "A group's members, partitions, positions and lag",
                {"200": _json("the group", _ref("Group")), **unknown},
                tags=tags,
                parameters=params,
            ),
            "delete": _op(
                "Delete a group and its positions", {**ok, **unknown}, tags=tags, parameters=params
            ),
        },
        group + "/join": {
            "post": _op(
                "Join (or rejoin) a group: a rebalance",
                {**assignment, **unknown},
                body={JSON: {"schema": _ref("GroupJoinRequest")}},
                tags=tags,
                parameters=params,
            )
        },
        group + "/heartbeat": {
            "post": _op(
                "Stay in the group; answers the current assignment",
                {**assignment, **unknown},
                body=member_only,
                required=True,
                tags=tags,
                parameters=params,
            )
        },
        group + "/leave": {
            "post": _op(
                "Leave the group (a rebalance)",
                {**ok, **unknown},
                body=member_only,
                required=True,
                tags=tags,
                parameters=params,
            )
        },
        group + "/poll": {
            "post": _op(
                "The member's next messages (read-committed; Accept picks the medium)",
                {
                    "200": {
                        "description": "messages of the member's partitions, oldest first; "
                        "headers Tidings-Generation, Tidings-Partitions, "
                        "Tidings-Partition-Count and Tidings-Owned-Since give its "
                        "assignment, Tidings-Count, "
                        "Tidings-Last-Id and Tidings-More the page's extent",
                        "content": {
                            **_content(_ref("Messages"), "Messages", "MessagesExt"),
                            # Where Accept names it (the clients' default).
                            COLUMNS: _COLUMNS_BODY,
                        },
                    },
                    **unknown,
                },
                body=member,
                required=True,
                tags=tags,
                parameters=[
                    *params,
                    _param(
                        "waitMs",
                        {"type": "integer", "minimum": 0, "maximum": 10**18 - 1},
                        "query",
                    ),
                    _max_bytes_param(),
                ],
            )
        },
        group + "/commit": {
            "post": _op(
                "Commit positions, now or in a transaction (transactionWritePointer)",
                {
                    "200": _json(
                        "the change keys the transaction commits with (none without one)",
                        _ref("GroupChanges"),
                    ),
                    "403": _error("the member does not own a partition (PartitionFenced)"),
                    **unknown,
                    "409": _error("a concurrent commit of the same partition won"),
                    "410": _error("the transaction already ended"),
                },
                body={JSON: {"schema": _ref("GroupCommitRequest")}},
                required=True,
                tags=tags,
                parameters=params,
            )
        },
        group + "/rollback": {
            "post": _op(
                "Remove the positions of an aborting transaction (and rewind the member)",
                {**ok, **unknown},
                body={JSON: {"schema": _ref("GroupRollbackRequest")}},
                required=True,
                tags=tags,
                parameters=params,
            )
        },
        group + "/reset": {
            "post": _op(
                "Move every position of a group without members",
                {**ok, **unknown, "409": _error("the group has members")},
                body={JSON: {"schema": _ref("GroupResetRequest")}},
                required=True,
                tags=tags,
                parameters=params,
            )
        },
    }


def _queue_schemas() -> dict[str, Any]:
    consumer_id = {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$"}
    hex_id = _nullable({"type": "string", "pattern": "^[0-9a-f]{40}$"})
    count = {"type": "integer", "minimum": 0}
    ids = {"type": "array", "minItems": 1, "items": _MESSAGE_ID}
    return {
        "QueuePopRequest": {
            "type": "object",
            "required": ["consumerId"],
            "properties": {
                "consumerId": consumer_id,
                "maxMessages": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
                "ackTimeoutMs": _nullable(
                    {"type": "integer", "minimum": 1, "maximum": MAX_ACK_TIMEOUT_MS}
                ),
                "maxDeliveries": _nullable(
                    {"type": "integer", "minimum": 1, "maximum": MAX_DELIVERIES_LIMIT}
                ),
                "deadLetterTopic": _nullable(_NAME),
                "start": _nullable({"type": "string", "enum": _STARTS}),
                "ackIds": {
                    "type": "array",
                    "items": _MESSAGE_ID,
                    "description": "messages this consumer popped, acked (for good) before "
                    "the pop, in the same request: all of them, or none and nothing popped",
                },
            },
        },
        "QueueAckRequest": {
            "type": "object",
            "required": ["consumerId", "ids"],
            "properties": {
                "consumerId": consumer_id,
                "ids": ids,
                "transactionWritePointer": _nullable(_POSITIVE_INT64),
            },
        },
        "QueueNackRequest": {
            "type": "object",
            "required": ["consumerId", "ids"],
            "properties": {"consumerId": consumer_id, "ids": ids},
        },
        "QueueNackAnswer": {
            "type": "object",
            "required": ["skipped"],
            "properties": {
                "skipped": {
                    "type": "array",
                    "items": _MESSAGE_ID,
                    "description": "ids not given back: the worker no longer held them "
                    "(another worker took or acked them, they were dead-lettered, acked, "
                    "or never delivered to it); the others were given back",
                }
            },
        },
        "QueueExtendRequest": {
            "type": "object",
            "required": ["consumerId", "ids"],
            "properties": {
                "consumerId": consumer_id,
                "ids": ids,
                "ackTimeoutMs": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_ACK_TIMEOUT_MS,
                    "description": "the lease's new length from now (default 30000)",
                },
            },
        },
        "QueueConsumerRequest": {
            "type": "object",
            "required": ["consumerId"],
            "properties": {"consumerId": consumer_id},
        },
        "QueueRollbackRequest": {
            "type": "object",
            "required": ["transactionWritePointer"],
            "properties": {
                "transactionWritePointer": _POSITIVE_INT64,
                "keepLeases": {
                    "type": "boolean",
                    "description": "back to the leases of the workers that acked them "
                    "(until those leases' deadlines), not to the queue: the server "
                    "refused the transaction",
                },
            },
        },
        "QueueCount": {
            "type": "object",
            "description": "released, returned or purged: how many messages",
            "additionalProperties": count,
        },
        "QueueList": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["topic", "queue"],
                "properties": {"topic": _NAME, "queue": _NAME},
            },
        },
        "Queue": {
            "type": "object",
            "required": ["queue", "maxDeliveries", "deadLetterTopic", "pending", "waiting"],
            "properties": {
                "queue": _NAME,
                "maxDeliveries": {"type": "integer", "minimum": 1},
                "deadLetterTopic": _NAME,
                "start": {"type": "string"},
                "cursor": hex_id,
                "read": hex_id,
                "pending": count,
                "waiting": count,
                "waitingExact": {"type": "boolean"},
                "consumers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"consumerId": consumer_id, "pending": count},
                    },
                },
                **{
                    name: count
                    for name in (
                        "pushed",
                        "popped",
                        "acked",
                        "nacked",
                        "redelivered",
                        "deadLettered",
                        "expired",
                        "ackState",
                    )
                },
                "popRate": {"type": "number", "minimum": 0},
                "ackRate": {"type": "number", "minimum": 0},
            },
        },
    }


def _queue_paths() -> dict[str, Any]:
    tags = ("queues",)
    params = [_param("ns", _NAME), _param("topic", _NAME), _param("queue", _NAME)]
    base = "/v1/namespaces/{ns}/topics/{topic}/queues"
    queue = base + "/{queue}"
    unknown = {"404": _error("unknown topic or queue")}
    ok = {"200": _json("done", _ref("Empty"))}
    counted = {"200": _json("how many messages", _ref("QueueCount"))}

    def body(name: str) -> dict[str, Any]:
        return {JSON: {"schema": _ref(name)}}

    def post(summary: str, answers: dict[str, Any], request: str) -> dict[str, Any]:
        return {
            "post": _op(
                summary, answers, body=body(request), required=True, tags=tags, parameters=params
            )
        }

    not_delivered = {"400": _error("malformed ids (named)")}
    conflict = {
        "409": _error(
            "messages never delivered to this worker (NotDelivered), or a lease passed to "
            "another worker or another ack won (AckConflict)"
        )
    }
    return {
        "/v1/namespaces/{ns}/queues": {
            "get": _op(
                "Every queue of the namespace's topics",
                {"200": _json("topic and queue names", _ref("QueueList"))},
                tags=tags,
                parameters=params[:1],
            )
        },
        base: {
            "get": _op(
                "The topic's queues",
                {"200": _json("queue names", _ref("TopicList")), **unknown},
                tags=tags,
                parameters=params[:2],
            )
        },
        queue: {
            "get": _op(
                "A queue's settings, in-flight messages, depth and counters",
                {"200": _json("the queue", _ref("Queue")), **unknown},
                tags=tags,
                parameters=params,
            ),
            "delete": _op(
                "Delete a queue and its state", {**ok, **unknown}, tags=tags, parameters=params
            ),
        },
        queue + "/pop": {
            "post": _op(
                "Lease the oldest available messages to a worker (creates the queue)",
                {
                    "200": {
                        "description": "leased messages, oldest first (maybe none); header "
                        "Tidings-Delivery-Counts gives each one's delivery count",
                        "content": _content(_ref("Messages"), "Messages", "MessagesExt"),
                    },
                    "404": _error("unknown topic (or, with ackIds, unknown queue)"),
                    **conflict,
                },
                body=body("QueuePopRequest"),
                required=True,
                tags=tags,
                parameters=[
                    *params,
                    _param(
                        "waitMs",
                        {"type": "integer", "minimum": 0, "maximum": 10**18 - 1},
                        "query",
                    ),
                    _max_bytes_param(),
                ],
            )
        },
        queue + "/ack": post(
            "Ack messages: for good, or in a transaction (transactionWritePointer)",
            {**ok, **not_delivered, **unknown, **conflict, "410": _error("the transaction ended")},
            "QueueAckRequest",
        ),
        queue + "/nack": post(
            "Give back the messages the worker holds to the queue at once; skip the others",
            {"200": _json("the ids skipped", _ref("QueueNackAnswer")), **not_delivered, **unknown},
            "QueueNackRequest",
        ),
        queue + "/extend": post(
            "Lease the messages the worker holds for ackTimeoutMs from now; skip the others",
            {"200": _json("the ids skipped", _ref("QueueNackAnswer")), **not_delivered, **unknown},
            "QueueExtendRequest",
        ),
        queue + "/rollback": post(
            "Give back the messages an aborting transaction acked",
            {**counted, **unknown},
            "QueueRollbackRequest",
        ),
        queue + "/release": post(
            "Give back every lease a worker holds (its close)",
            {**counted, **unknown},
            "QueueConsumerRequest",
        ),
        queue + "/purge": {
            "post": _op(
                "Ack everything the queue holds and everything published so far",
                {**counted, **unknown},
                tags=tags,
                parameters=params,
            )
        },
    }


def _transaction_paths() -> dict[str, Any]:
    tags = ("transactions",)
    wp = [_param("wp", {"type": "integer", "minimum": 1, "maximum": INT64_MAX})]
    ok = {"200": _json("done", _ref("Empty"))}
    ending = {"200": _json("how the transaction stands now", _ref("TransactionEnd"))}
    unknown = {
        "404": _error("unknown transaction, or transactionalId never registered (ProducerNotFound)")
    }
    fenced = {
        "403": _error("fenced: a newer epoch of the transactional id exists"),
        "409": _error("an epoch of the transactional id never handed out (UnknownProducerEpoch)"),
    }
    ended = {"410": _error("the transaction already ended")}
    producer_unknown = {"404": _error("transactionalId never registered (ProducerNotFound)")}
    full = {
        "503": _error(
            "the service does not run in this process (role), or tx_max_open transactions "
            "are open (TooManyTransactions: nothing was begun; retry)"
        )
    }
    base = "/v1/transactions"
    return {
        base: {
            "post": _op(
                "Begin a transaction",
                {
                    "200": _json("the snapshot", _ref("TransactionSnapshot")),
                    **fenced,
                    "409": _error(
                        "an epoch of the transactional id never handed out "
                        "(UnknownProducerEpoch), or a beginId sent again with another "
                        "timeout, transactionalId or epoch (BeginIdConflict)"
                    ),
                    **producer_unknown,
                    "410": _error("the transaction the beginId began already ended"),
                    **full,
                },
                body={JSON: {"schema": _ref("BeginRequest")}},
                tags=tags,
            ),
            "get": _op(
                "The transaction service's state",
                {"200": _json("state", _ref("TransactionState"))},
                tags=tags,
            ),
        },
        base + "/{wp}/commit": {
            "post": _op(
                "Commit",
                {
                    **ok,
                    **unknown,
                    **fenced,
                    **ended,
                    "409": _error("write conflict, or an epoch never handed out"),
                },
                body={JSON: {"schema": _ref("CommitRequest")}},
                tags=tags,
                parameters=wp,
            )
        },
        base + "/{wp}/abort": {
            "post": _op(
                "Abort",
                {**ending, **unknown, **fenced, **ended},
                body={JSON: {"schema": _ref("AbortRequest")}},
                tags=tags,
                parameters=wp,
            )
        },
        base + "/{wp}/invalidate": {
            "post": _op("Invalidate", {**ending, **unknown, **ended}, tags=tags, parameters=wp)
        },
        base + "/producers": {
            "post": _op(
                "Register a transactional id (bumps its epoch, fences the previous holder)",
                {"200": _json("the producer", _ref("Producer"))},
                body={JSON: {"schema": _ref("ProducerRequest")}},
                required=True,
                tags=tags,
            )
        },
        "/v1/namespaces/{ns}/transactions/publish": {
            "post": _op(
                "A transaction in one request: begin, publish every topic, commit "
                "(addition; all or nothing)",
                {
                    "200": _json("committed: its snapshot", _ref("CommittedTransaction")),
                    "404": _error(
                        "unknown topic (nothing published, the transaction aborted), "
                        "transactionalId never registered (ProducerNotFound), unknown "
                        "queue or group"
                    ),
                    "403": _error(
                        "fenced: a newer epoch of the transactional id exists, or a group "
                        "member does not own a partition it commits (PartitionFenced)"
                    ),
                    "409": _error(
                        "an epoch never handed out (UnknownProducerEpoch), an ack conflict, "
                        "or another open transaction holds a group position it commits"
                    ),
                    **ended,
                    **full,
                },
                body={
                    JSON: {"schema": _ref("TransactionalPublishRequest")},
                    # Each topic's messages as a PublishRequestExt body (docs/api.md).
                    AVRO_EXT: {"schema": _avro("TransactionPublishRequest")},
                    # The same, each topic's messages as a payloads body.
                    PAYLOADS: {
                        "schema": {
                            "type": "string",
                            "format": "binary",
                            "description": (
                                "the Avro TransactionPublishRequest with each topic's body in "
                                "the payloads medium (docs/api.md, 'A transaction in one "
                                "request'); addition"
                            ),
                        }
                    },
                },
                required=True,
                tags=tags,
                parameters=[_param("ns", _NAME)],
            )
        },
        base + "/prune": {
            "post": _op(
                "Prune write pointers from the invalid list",
                {"200": _json("pruned pointers", _ref("PruneResponse"))},
                body={JSON: {"schema": _ref("PruneRequest")}},
                tags=tags,
            )
        },
    }


def _ops_paths() -> dict[str, Any]:
    tags = ("operations",)
    status = {"type": "object", "properties": {"status": {"type": "string"}}}
    return {
        "/healthz": {
            "get": _op("Liveness", {"200": _json("alive", status)}, tags=tags, errors=False)
        },
        "/readyz": {
            "get": _op(
                "Readiness",
                {"200": _json("serving", status), "503": _json("not serving", status)},
                tags=tags,
                errors=False,
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                {
                    "200": {
                        "description": "text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": _error("with metrics_auth: no bearer token, or an unknown one"),
                },
                tags=tags,
                errors=False,
            )
        },
        "/v1/cluster": {
            "get": _op(
                "The instances sharing this server's store: the leader (which owns every "
                "topic, the transaction log, groups and queues), its epoch and lease, and "
                "the instances standing by",
                {"200": _json("the cluster", {"type": "object"})},
                tags=tags,
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document",
                {"200": _json("OpenAPI 3.1", {"type": "object"})},
                tags=tags,
                errors=False,
            )
        },
    }


def _console_paths() -> dict[str, Any]:
    """The web console's files and the read-only endpoints it reads (docs/console.md)."""
    tags = ("console",)
    files = {
        "/console/": ("The web console's page", "text/html"),
        "/console/console.js": ("The web console's script", "text/javascript"),
        "/console/console.css": ("The web console's style sheet", "text/css"),
    }
    paths: dict[str, Any] = {
        path: {
            "get": _op(
                summary,
                {
                    "200": {
                        "description": "the file",
                        "content": {media: {"schema": {"type": "string"}}},
                    }
                },
                tags=tags,
                errors=False,
            )
        }
        for path, (summary, media) in files.items()
    }
    patterns = {"type": "array", "items": {"type": "string"}}
    whoami = {
        "type": "object",
        "required": ["auth", "name", "admin", "publish", "consume"],
        "properties": {
            "auth": {"type": "boolean", "description": "false: the server has no auth file"},
            "name": _nullable({"type": "string"}),
            "admin": {"type": "boolean"},
            "publish": patterns,
            "consume": patterns,
            "groups": _nullable(patterns),
            "queues": _nullable(patterns),
        },
    }
    nullable_int = _nullable(_INT64)
    details = {
        "type": "object",
        "required": [
            "now",
            "readPointer",
            "lastWritePointer",
            "defaultTimeoutMs",
            "inProgress",
            "invalid",
            "producers",
        ],
        "properties": {
            "now": _INT64,
            "readPointer": _INT64,
            "lastWritePointer": _INT64,
            "defaultTimeoutMs": _INT64,
            "inProgress": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["writePointer", "beganAt", "expiresAt", "timeoutMs"],
                    "properties": {
                        "writePointer": _INT64,
                        "beganAt": nullable_int,
                        "expiresAt": _INT64,
                        "timeoutMs": nullable_int,
                        "transactionalId": _nullable({"type": "string"}),
                        "producerId": nullable_int,
                        "epoch": nullable_int,
                    },
                },
            },
            "invalid": {"type": "array", "items": _INT64},
            "producers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["transactionalId", "producerId", "epoch"],
                    "properties": {
                        "transactionalId": {"type": "string"},
                        "producerId": _INT64,
                        "epoch": _INT64,
                    },
                },
            },
        },
    }
    paths["/v1/whoami"] = {
        "get": _op(
            "Who the request's token belongs to, if anyone, and what it may do (addition)",
            {"200": _json("the principal (name null: no token, or one nobody has)", whoami)},
            tags=tags,
            errors=False,
        )
    }
    paths["/v1/transactions/details"] = {
        "get": _op(
            "The transaction state with each open transaction's producer, epoch, begin "
            "time and timeout, and every registered transactional id (addition)",
            {"200": _json("details", details)},
            tags=(*tags, "transactions"),
        )
    }
    paths["/v1/namespaces/{ns}/topics/{topic}/messages"] = {
        "get": _op(
            "The page of messages before a position, oldest first (addition; the "
            "console's way back: a poll reads forward only)",
            {
                "200": _json("messages, oldest first; header Tidings-Count", _ref("Messages")),
                "404": _error("unknown topic"),
            },
            tags=(*tags, "messages"),
            parameters=[
                _param("ns", _NAME),
                _param("topic", _NAME),
                _param(
                    "before",
                    {
                        "type": "string",
                        "pattern": "^[0-9a-fA-F]{40}$",
                        "description": "a message id in hex (exclusive); absent: the end",
                    },
                    "query",
                ),
                _param(
                    "limit",
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 2**31 - 1,
                        "default": 20,
                        "description": "clamped to the server's fetch maximum",
                    },
                    "query",
                ),
                _param(
                    "isolation",
                    {
                        "type": "string",
                        "enum": ["read_committed", "read_uncommitted"],
                        "default": "read_uncommitted",
                    },
                    "query",
                ),
            ],
        )
    }
    return paths


#: Request bodies whose unknown fields the server lets through: topic properties are
#: free-form, and a rollback body is a publish answer sent back, which may gain fields.
_OPEN_BODIES = frozenset({"TopicProperties", "PublishResponse"})


def _refs(node: Any) -> set[str]:
    """The component schemas ``node`` names."""
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if "$ref" in node else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*map(_refs, node)) if node else set()
    return set()


def _closed(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` on each object schema that lists its
    properties and says nothing of others: the server refuses unknown fields."""
    if isinstance(node, list):
        return [_closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _close_request_bodies(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Close the JSON request bodies' schemas (and those they name, unless an answer
    names them too, as answers may gain fields)."""
    asked: set[str] = set()
    answered: set[str] = set()
    for ops in paths.values():
        for op in ops.values():
            if not isinstance(op, dict):
                continue
            body = op.get("requestBody", {}).get("content", {}).get(JSON)
            if body is not None:
                if "$ref" not in body["schema"]:
                    body["schema"] = _closed(body["schema"])
                asked |= _refs(body)
            answered |= _refs(op.get("responses", {}))
    todo = list(asked)
    while todo:  # what the bodies name, transitively
        for name in _refs(schemas[todo.pop()]) - asked:
            asked.add(name)
            todo.append(name)
    for name in asked - answered - _OPEN_BODIES:
        schemas[name] = _closed(schemas[name])


def openapi_document(version: str, *, max_timeout: float = 3600.0) -> dict[str, Any]:
    """The whole contract as an OpenAPI 3.1 document (``max_timeout``: the server's
    longest transaction timeout, seconds)."""
    paths = {
        **_messaging_paths(),
        **_group_paths(),
        **_queue_paths(),
        **_transaction_paths(),
        **_ops_paths(),
        **_console_paths(),
    }
    schemas = _schemas(max_timeout)
    _close_request_bodies(paths, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tidings",
            "version": version,
            "description": "Transactional messaging: the CDAP TMS REST API plus Tidings' "
            'additions (docs/api.md). Errors are {"error", "type"} with the status '
            "of the error class.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "only where the server has an auth file (docs/security.md)",
                }
            },
        },
        # A token where the server asks for one; none where it has no auth file.
        "security": [{"bearer": []}, {}],
    }

"""The JSON bodies of the admin endpoints: topics, stats, transactions, producers.

One codec for both ends: the server writes answers with the ``*_json`` functions and
the client reads them with the ``read_*`` ones; the client writes requests with the
``*_request`` functions and the server reads them with the ``read_*_request`` ones.
A request that does not fit raises :class:`~tidings.errors.BadRequest` (the client
sent it); an answer that does not fit raises :class:`~tidings.errors.ServerError`
(the server sent it). docs/api.md and ``GET /openapi.json`` describe the same shapes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from tidings.codec.json_bodies import b64decode, b64encode, integer, only, whole
from tidings.errors import BadRequest, ServerError
from tidings.names import INT64_MAX, INT64_MIN, NAME_PATTERN
from tidings.structs import (
    GroupAssignment,
    GroupInfo,
    GroupPartition,
    MessageId,
    ProducerInfo,
    TopicEnd,
    TopicMetadata,
    TopicStats,
    Transaction,
    TransactionEnd,
    TransactionState,
)

__all__ = [
    "BEGIN_FIELDS",
    "BEGIN_ID_MAX",
    "GROUP_COMMIT_FIELDS",
    "TRANSACTION_PUBLISH_FIELDS",
    "JoinRequest",
    "ProducerFields",
    "TransactionGroupCommit",
    "abort_request",
    "assignment_json",
    "begin_request",
    "changes_json",
    "check_begin_id",
    "end_json",
    "ended_json",
    "commit_request",
    "group_commit_request",
    "group_json",
    "join_request",
    "member_request",
    "producer_json",
    "producer_request",
    "prune_request",
    "pruned_json",
    "read_abort_request",
    "read_assignment",
    "read_begin_id",
    "read_begin_request",
    "read_changes",
    "read_commit_request",
    "read_end",
    "read_ended",
    "read_group",
    "read_group_commit_request",
    "read_position_generations",
    "read_group_rollback_request",
    "read_join_request",
    "read_member_request",
    "read_producer",
    "read_producer_request",
    "read_prune_request",
    "read_pruned",
    "read_reset_request",
    "read_rolled_back",
    "read_snapshot",
    "read_state",
    "read_stats",
    "read_topic",
    "read_topic_list",
    "read_transaction_group_commits",
    "reset_request",
    "rolled_back_json",
    "snapshot_json",
    "state_json",
    "stats_json",
    "topic_json",
    "topic_request",
    "transaction_group_commits_avro",
    "transaction_group_commits_json",
    "transaction_group_generations_avro",
]


# --- reading fields of a request (BadRequest) ---


def _opt_int(obj: Mapping[str, Any], field: str, lo: int = INT64_MIN) -> int | None:
    return integer(obj.get(field), field, lo, INT64_MAX, optional=True)


def _opt_str(obj: Mapping[str, Any], field: str) -> str | None:
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{field} must be a non-empty string")
    return value


def _opt_number(obj: Mapping[str, Any], field: str) -> float | None:
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadRequest(f"{field} must be a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise BadRequest(f"{field} must be a finite number")
    return float(value)


def _base64_list(obj: Mapping[str, Any], field: str) -> list[bytes]:
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{field} must be a list of base64 strings")
    return [b64decode(item, f"{field}[{i}]") for i, item in enumerate(value)]


def _int_list(obj: Mapping[str, Any], field: str) -> list[int]:
    value = obj.get(field)
    if value is None:
        return []
    if isinstance(value, list):
        value = [whole(v) for v in value]
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT64_MAX for v in value
    ):
        raise BadRequest(f"{field} must be a list of integers in [1, {INT64_MAX}]")
    return value


# --- reading fields of an answer (ServerError) ---


def _field(obj: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get(name), kind):
        raise ServerError(f"unexpected answer from the server: no {name!r} in {obj!r:.200}")
    return obj[name]


def _pointers(values: object) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise ServerError(f"expected a list of write pointers, got {values!r:.200}")
    return tuple(sorted(values))


def _optional_id(value: object) -> MessageId | None:
    return MessageId.from_hex(value) if isinstance(value, str) else None


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- topics ---


def topic_request(ttl: int | None, properties: Mapping[str, object] | None) -> dict[str, Any]:
    """A create or update body: the properties, ``ttl`` (seconds) among them if given.
    The server checks the values (:mod:`tidings.messaging.topics`)."""
    props: dict[str, Any] = dict(properties or {})
    if ttl is not None:
        props["ttl"] = ttl
    return props


def topic_json(meta: TopicMetadata) -> dict[str, Any]:
    """A topic as the API shows it: property values as strings (as CDAP TMS), ttl included."""
    properties = dict(meta.properties)
    properties["ttl"] = str(meta.ttl)
    return {"name": meta.name, "properties": properties, "generation": meta.generation}


def read_topic(obj: Any, namespace: str) -> TopicMetadata:
    """The :class:`TopicMetadata` in an answer written by :func:`topic_json`."""
    props = {str(k): str(v) for k, v in _field(obj, "properties", dict).items()}
    ttl = props.get("ttl", "0")
    return TopicMetadata(
        namespace=namespace,
        name=_field(obj, "name", str),
        ttl=int(ttl) if ttl.isdigit() else 0,
        generation=_field(obj, "generation", int),
        properties=props,
    )


def read_topic_list(obj: Any) -> list[str]:
    """The topic names of a ``GET /topics`` answer."""
    if not isinstance(obj, list) or not all(isinstance(n, str) for n in obj):
        raise ServerError(f"unexpected topic list: {obj!r:.200}")
    return obj


def stats_json(stats: TopicStats) -> dict[str, Any]:
    """A topic's stats, ids in hex."""
    return {
        "namespace": stats.namespace,
        "topic": stats.topic,
        "messageCount": stats.message_count,
        "bytes": stats.bytes,
        "oldestId": None if stats.oldest_id is None else stats.oldest_id.hex,
        "newestId": None if stats.newest_id is None else stats.newest_id.hex,
        "oldestTime": stats.oldest_time,
        "newestTime": stats.newest_time,
        "messagesPublished": stats.messages_published,
        "bytesPublished": stats.bytes_published,
        "fetches": stats.fetches,
        "publishRate": stats.publish_rate,
        "fetchRate": stats.fetch_rate,
        "lastStableId": None if stats.last_stable_id is None else stats.last_stable_id.hex,
        "groupLag": dict(stats.group_lags),
    }


def read_stats(obj: Any) -> TopicStats:
    """The :class:`TopicStats` in an answer written by :func:`stats_json`."""
    return TopicStats(
        namespace=_field(obj, "namespace", str),
        topic=_field(obj, "topic", str),
        message_count=_field(obj, "messageCount", int),
        bytes=_field(obj, "bytes", int),
        oldest_id=_optional_id(obj.get("oldestId")),
        newest_id=_optional_id(obj.get("newestId")),
        oldest_time=_optional_int(obj.get("oldestTime")),
        newest_time=_optional_int(obj.get("newestTime")),
        messages_published=_field(obj, "messagesPublished", int),
        bytes_published=_field(obj, "bytesPublished", int),
        fetches=_field(obj, "fetches", int),
        publish_rate=float(_field(obj, "publishRate", (int, float))),
        fetch_rate=float(_field(obj, "fetchRate", (int, float))),
        last_stable_id=_optional_id(obj.get("lastStableId")),
        group_lags={
            str(g): _optional_int(n)
            for g, n in (obj.get("groupLag") or {}).items()
            if n is None or (isinstance(n, int) and not isinstance(n, bool))
        },
    )


def end_json(end: TopicEnd) -> dict[str, Any]:
    """Where a topic ends (``GET .../topics/{t}/end``), ids in hex."""
    return {
        "newestId": None if end.newest_id is None else end.newest_id.hex,
        "lastStableId": None if end.last_stable_id is None else end.last_stable_id.hex,
        "stableKnown": end.stable_known,
    }


def read_end(obj: Any) -> TopicEnd:
    """The :class:`TopicEnd` in an answer written by :func:`end_json`."""
    return TopicEnd(
        _optional_id(obj.get("newestId") if isinstance(obj, dict) else None),
        _optional_id(obj.get("lastStableId") if isinstance(obj, dict) else None),
        bool(_field(obj, "stableKnown", bool)),
    )


def rolled_back_json(count: int) -> dict[str, Any]:
    """The JSON answer of a rollback: how many entries it marked."""
    return {"rolledBack": count}


def read_rolled_back(obj: Any) -> int:
    """The count in a rollback answer (0 for an empty or Avro answer)."""
    count = obj.get("rolledBack") if isinstance(obj, dict) else None
    return count if isinstance(count, int) else 0


# --- transactions ---


class ProducerFields(NamedTuple):
    """The transactional id and epoch a begin, commit, abort or publish may carry."""

    transactional_id: str | None
    epoch: int | None


def _producer_fields(transactional_id: str | None, epoch: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if transactional_id is not None:
        fields["transactionalId"] = transactional_id
    if epoch is not None:
        # The server's own check, made before sending: JSON cannot even carry an
        # integer past 64 bits, which failed in the encoder with a TypeError.
        fields["epoch"] = integer(epoch, "epoch", 0, INT64_MAX, optional=False)
    return fields


def _read_producer_fields(obj: Mapping[str, Any]) -> ProducerFields:
    return ProducerFields(_opt_str(obj, "transactionalId"), _opt_int(obj, "epoch", 0))


# The fields each request body may have: any other is refused (json_bodies.only).
_PRODUCER = frozenset({"transactionalId", "epoch"})
#: A begin body's fields.
BEGIN_FIELDS = _PRODUCER | {"timeout", "beginId"}
_COMMIT_FIELDS = _PRODUCER | {"changes"}
#: A one-request transaction's JSON body's fields (the Avro body's are its schema's).
#: ``beginId`` is documented as taken and ignored (the request leaves no transaction
#: open to find again): a begin body stays one this takes.
TRANSACTION_PUBLISH_FIELDS = _PRODUCER | {"timeout", "topics", "acks", "groupCommits", "beginId"}
_PRUNE_FIELDS = frozenset({"below", "ids"})
_JOIN_FIELDS = frozenset({"memberId", "sessionTimeoutMs", "partitions", "start"})
_MEMBER_FIELDS = frozenset({"memberId"})
_GROUP_POLL_FIELDS = frozenset({"memberId", "limit"})
#: A group commit body's fields.
GROUP_COMMIT_FIELDS = frozenset({"memberId", "positions", "transactionWritePointer", "generation"})
_POSITION_FIELDS = frozenset({"partition", "id", "generation"})
_TRANSACTION_GROUP_COMMIT_FIELDS = GROUP_COMMIT_FIELDS | {"topic", "group"}
_GROUP_ROLLBACK_FIELDS = frozenset({"transactionWritePointer", "memberId"})
_RESET_FIELDS = frozenset({"to", "id", "time"})


#: A begin's idempotency key: what a client draws at random (hex, base64url, a UUID)
#: fits, and nothing that needs escaping in a log line or a URL.
BEGIN_ID_MAX = 64
_BEGIN_ID = re.compile(rf"[A-Za-z0-9._~-]{{1,{BEGIN_ID_MAX}}}")


def check_begin_id(value: object, field: str = "beginId") -> str:
    """``value`` if it is a valid begin id; :class:`BadRequest` otherwise."""
    if not isinstance(value, str) or _BEGIN_ID.fullmatch(value) is None:
        raise BadRequest(
            f"{field} must be 1-{BEGIN_ID_MAX} characters of A-Z a-z 0-9 . _ ~ -, got {value!r:.80}"
        )
    return value


def begin_request(
    timeout: float | None,
    transactional_id: str | None,
    epoch: int | None,
    begin_id: str | None = None,
) -> dict[str, Any]:
    """A ``POST /v1/transactions`` body (also the head of a one-request transaction)."""
    body = _producer_fields(transactional_id, epoch)
    if timeout is not None:
        body["timeout"] = timeout
    if begin_id is not None:
        body["beginId"] = check_begin_id(begin_id, "begin_id")
    return body


def read_begin_request(obj: Mapping[str, Any]) -> tuple[float | None, ProducerFields]:
    """The timeout (seconds) and producer fields of a begin body."""
    return _opt_number(obj, "timeout"), _read_producer_fields(obj)


def read_begin_id(obj: Mapping[str, Any]) -> str | None:
    """The ``beginId`` of a begin body (its idempotency key), if it has one."""
    value = obj.get("beginId")
    return None if value is None else check_begin_id(value)


def commit_request(
    changes: Iterable[bytes], transactional_id: str | None, epoch: int | None
) -> dict[str, Any]:
    """A commit body: the change keys (base64) and the producer fields."""
    body = _producer_fields(transactional_id, epoch)
    # bytes(c) of an int is that many zero bytes, and iterating over one string or
    # bytes object gives characters or ints: refused as the manager refuses them,
    # rather than committed under change keys nobody wrote.
    if isinstance(changes, str | bytes | bytearray | memoryview):
        raise BadRequest("changes is a collection of byte strings, not one string")
    encoded = []
    for c in changes:
        if not isinstance(c, bytes | bytearray | memoryview):
            raise BadRequest(f"change keys are bytes, got {type(c).__name__}")
        encoded.append(b64encode(bytes(c)))
    if encoded:
        body["changes"] = encoded
    return body


def read_commit_request(obj: Mapping[str, Any]) -> tuple[list[bytes], ProducerFields]:
    """The change keys and producer fields of a commit body."""
    only(obj, _COMMIT_FIELDS, "commit request")
    return _base64_list(obj, "changes"), _read_producer_fields(obj)


def abort_request(transactional_id: str | None, epoch: int | None) -> dict[str, Any]:
    """An abort body."""
    return _producer_fields(transactional_id, epoch)


def read_abort_request(obj: Mapping[str, Any]) -> ProducerFields:
    """The producer fields of an abort body."""
    only(obj, _PRODUCER, "abort request")
    return _read_producer_fields(obj)


def snapshot_json(snapshot: Transaction, encoded: bytes | None = None) -> dict[str, Any]:
    """A transaction's snapshot; with ``encoded`` (a begin's answer) its wire form too."""
    obj: dict[str, Any] = {
        "writePointer": snapshot.write_pointer,
        "readPointer": snapshot.read_pointer,
        "invalid": list(snapshot.invalid),
        "inProgress": list(snapshot.in_progress),
    }
    if encoded is not None:
        obj["encoded"] = b64encode(encoded)
    return obj


def read_snapshot(obj: Any) -> Transaction:
    """The :class:`Transaction` in an answer written by :func:`snapshot_json`."""
    return Transaction(
        read_pointer=_field(obj, "readPointer", int),
        write_pointer=_field(obj, "writePointer", int),
        invalid=_pointers(obj.get("invalid", [])),
        in_progress=_pointers(obj.get("inProgress", [])),
    )


def state_json(state: TransactionState) -> dict[str, Any]:
    """The transaction service's state (``GET /v1/transactions``)."""
    return {
        "readPointer": state.read_pointer,
        "lastWritePointer": state.last_write_pointer,
        "inProgress": [
            {"writePointer": wp, "expiresAt": expires}
            for wp, expires in sorted(state.in_progress.items())
        ],
        "invalid": list(state.invalid),
    }


def read_state(obj: Any) -> TransactionState:
    """The :class:`TransactionState` in an answer written by :func:`state_json`."""
    in_progress: dict[int, int] = {}
    for item in _field(obj, "inProgress", list):
        expires = item.get("expiresAt") if isinstance(item, dict) else None
        in_progress[_field(item, "writePointer", int)] = _optional_int(expires) or 0
    return TransactionState(
        read_pointer=_field(obj, "readPointer", int),
        last_write_pointer=_field(obj, "lastWritePointer", int),
        in_progress=dict(sorted(in_progress.items())),
        invalid=_pointers(obj.get("invalid", [])),
    )


def producer_request(transactional_id: str) -> dict[str, Any]:
    """A ``POST /v1/transactions/producers`` body."""
    return {"transactionalId": transactional_id}


def read_producer_request(obj: Mapping[str, Any]) -> str:
    """The transactional id to register."""
    only(obj, _PRODUCER - {"epoch"}, "producer registration")
    transactional_id = _opt_str(obj, "transactionalId")
    if transactional_id is None:
        raise BadRequest("transactionalId is required")
    return transactional_id


def producer_json(info: ProducerInfo) -> dict[str, Any]:
    """A registered producer."""
    return {
        "transactionalId": info.transactional_id,
        "producerId": info.producer_id,
        "epoch": info.epoch,
    }


def read_producer(obj: Any) -> ProducerInfo:
    """The :class:`ProducerInfo` in an answer written by :func:`producer_json`."""
    return ProducerInfo(
        transactional_id=_field(obj, "transactionalId", str),
        producer_id=_field(obj, "producerId", int),
        epoch=_field(obj, "epoch", int),
    )


def ended_json(end: TransactionEnd) -> dict[str, Any]:
    """The answer of an abort or invalidate: how the transaction stands now."""
    return {"outcome": end.outcome, "already": end.already}


def read_ended(obj: Any, verb: str) -> TransactionEnd:
    """The :class:`TransactionEnd` in an answer written by :func:`ended_json`. An
    answer without it (``{}``, from a server before it) reads as the call having done
    what it asked (``verb``: "aborted" or "invalidated"), as such a server said."""
    if obj is None or (isinstance(obj, dict) and "outcome" not in obj):
        return TransactionEnd(verb)
    return TransactionEnd(_field(obj, "outcome", str), _field(obj, "already", bool))


def prune_request(below: int | None, ids: Iterable[int] | None) -> dict[str, Any]:
    """A ``POST /v1/transactions/prune`` body."""
    body: dict[str, Any] = {}
    if below is not None:
        body["below"] = below
    if ids is not None:
        body["ids"] = [int(i) for i in ids]
    return body


def read_prune_request(obj: Mapping[str, Any]) -> tuple[int | None, list[int]]:
    """``below`` and ``ids`` of a prune body."""
    only(obj, _PRUNE_FIELDS, "prune request")
    return _opt_int(obj, "below", 0), _int_list(obj, "ids")


def pruned_json(pruned: Iterable[int]) -> dict[str, Any]:
    """The answer of a prune: the pointers it dropped, sorted."""
    return {"pruned": sorted(pruned)}


def read_pruned(obj: Any) -> list[int]:
    """The pointers in an answer written by :func:`pruned_json`."""
    return list(_pointers(_field(obj, "pruned", list)))


# --- consumer groups ---


def _opt_member(obj: Mapping[str, Any]) -> str | None:
    return _opt_str(obj, "memberId")


def _member(obj: Mapping[str, Any]) -> str:
    member_id = _opt_member(obj)
    if member_id is None:
        raise BadRequest("memberId is required (join answers it)")
    return member_id


def _message_id(value: object, what: str) -> MessageId:
    raw = b64decode(value, what)
    if len(raw) != 20:
        raise BadRequest(f"{what} must be a 20-byte message id")
    return MessageId.from_bytes(raw)


def join_request(
    member_id: str | None, session_timeout_ms: int, partitions: int | None, start: str
) -> dict[str, Any]:
    """A group join body."""
    body: dict[str, Any] = {"sessionTimeoutMs": session_timeout_ms, "start": start}
    if member_id is not None:
        body["memberId"] = member_id
    if partitions is not None:
        body["partitions"] = partitions
    return body


class JoinRequest(NamedTuple):
    """A decoded join body (defaults filled in by the coordinator where None)."""

    member_id: str | None
    session_timeout_ms: int | None
    partitions: int | None
    start: str


#: Other names of the two ends a group, a queue or a reset may start from.
START_ALIASES = {"beginning": "earliest", "end": "latest"}


def start_name(value: str | None) -> str | None:
    """``earliest``/``latest`` for their other names ``beginning``/``end``; other values
    as they are (the caller checks them)."""
    return START_ALIASES.get(value, value) if value is not None else None


def read_join_request(obj: Mapping[str, Any]) -> JoinRequest:
    """The fields of a join body."""
    only(obj, _JOIN_FIELDS, "join request")
    timeout_ms = _opt_int(obj, "sessionTimeoutMs", 0)
    partitions = _opt_int(obj, "partitions", 0)
    start = start_name(_opt_str(obj, "start")) or "earliest"
    return JoinRequest(_opt_member(obj), timeout_ms, partitions, start)


def member_request(member_id: str, limit: int | None = None) -> dict[str, Any]:
    """A heartbeat, leave or group poll body."""
    body: dict[str, Any] = {"memberId": member_id}
    if limit is not None:
        body["limit"] = limit
    return body


def read_member_request(
    obj: Mapping[str, Any], what: str = "group poll", *, poll: bool = True
) -> tuple[str, int | None]:
    """The member id (and, for a poll, the limit) of a member's request; ``poll``
    False: a heartbeat or leave body, which has no limit."""
    only(obj, _GROUP_POLL_FIELDS if poll else _MEMBER_FIELDS, what)
    return _member(obj), _opt_int(obj, "limit", 1)


def assignment_json(a: GroupAssignment) -> dict[str, Any]:
    """A member's assignment."""
    return {
        "memberId": a.member_id,
        "generation": a.generation,
        "partitions": list(a.partitions),
        "partitionCount": a.partition_count,
        "ownedSince": list(a.owned_since),
    }


def read_assignment(obj: Any) -> GroupAssignment:
    """The :class:`GroupAssignment` in an answer written by :func:`assignment_json`."""
    partitions = _pointers(_field(obj, "partitions", list))
    since = obj.get("ownedSince") if isinstance(obj, dict) else None
    owned_since: tuple[int, ...] = ()
    if (
        isinstance(since, list)
        and len(since) == len(partitions)
        and all(isinstance(g, int) and not isinstance(g, bool) for g in since)
    ):
        # Absent from a server before it was added: the member knows no more than it heard.
        # In the order of ``partitions`` (both as the server sent them, sorted).
        owned_since = tuple(since)
    return GroupAssignment(
        member_id=_field(obj, "memberId", str),
        generation=_field(obj, "generation", int),
        partitions=partitions,
        partition_count=_field(obj, "partitionCount", int),
        owned_since=owned_since,
    )


def group_commit_request(
    member_id: str,
    positions: Mapping[int, MessageId],
    write_pointer: int | None,
    generation: int | None = None,
    generations: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """A group commit body: the last consumed message id per partition (and the newest
    generation the member heard of, where given; ``generations``: per partition, the
    one its position is of, where it differs from one position to another)."""
    items: list[dict[str, Any]] = []
    for p, position in sorted(positions.items()):
        item: dict[str, Any] = {"partition": p, "id": b64encode(position.to_bytes())}
        if generations is not None and p in generations:
            item["generation"] = generations[p]
        items.append(item)
    body: dict[str, Any] = {"memberId": member_id, "positions": items}
    if write_pointer is not None:
        body["transactionWritePointer"] = write_pointer
    if generation is not None:
        body["generation"] = generation
    return body


def read_commit_generation(obj: Mapping[str, Any]) -> int | None:
    """The optional ``generation`` of a group commit body: the newest the member heard
    of (clients before it was added leave it out)."""
    return _opt_int(obj, "generation", 0)


def read_position_generations(obj: Mapping[str, Any]) -> dict[int, int]:
    """Per partition, the ``generation`` a position of a group commit body names (the
    one that position is of; positions without one go by the body's ``generation``).
    Call after :func:`read_group_commit_request`, which checks the positions."""
    generations: dict[int, int] = {}
    for i, item in enumerate(obj["positions"]):
        generation = integer(
            item.get("generation"), f"positions[{i}].generation", 0, INT64_MAX, optional=True
        )
        if generation is not None:
            generations[item["partition"]] = generation
    return generations


def read_group_commit_request(
    obj: Mapping[str, Any], *, binary: bool = False
) -> tuple[str, dict[int, MessageId], int | None]:
    """Member id, positions and write pointer (None: commit now) of a commit body;
    ``binary``: the ids are bytes (an Avro body's), not base64."""
    raw = obj.get("positions")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("positions must be a non-empty list of {partition, id}")
    positions: dict[int, MessageId] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"positions[{i}] must be an object with partition and id")
        only(item, _POSITION_FIELDS, f"positions[{i}]")
        partition = _opt_int(item, "partition", 0)
        if partition is None:
            raise BadRequest(f"positions[{i}].partition is required")
        if partition in positions:
            raise BadRequest(f"partition {partition} appears twice")
        what = f"positions[{i}].id"
        value = item.get("id")
        if binary:
            if not isinstance(value, bytes) or len(value) != 20:
                raise BadRequest(f"{what} must be a 20-byte message id")
            positions[partition] = MessageId.from_bytes(value)
        else:
            positions[partition] = _message_id(value, what)
    return _member(obj), positions, _opt_int(obj, "transactionWritePointer", 1)


class TransactionGroupCommit(NamedTuple):
    """A group member's positions that ride in a one-request transaction."""

    topic: str
    group: str
    member_id: str
    positions: dict[int, MessageId]
    #: The generation the positions are of (the oldest of them where they differ);
    #: None: the server goes by the newest it told the member.
    generation: int | None = None
    #: Per partition, the generation its position is of, where named: positions
    #: handed to one transaction across a rebalance are of different generations, and
    #: each is fenced by its own.
    generations: Mapping[int, int] | None = None


def transaction_group_commits_json(commits: Iterable[TransactionGroupCommit]) -> list[Any]:
    """The ``groupCommits`` of a one-request transaction body."""
    return [
        {
            "topic": c.topic,
            "group": c.group,
            **group_commit_request(c.member_id, c.positions, None, c.generation, c.generations),
        }
        for c in commits
    ]


def transaction_group_commits_avro(
    commits: Iterable[TransactionGroupCommit],
) -> list[dict[str, Any]]:
    """The ``groupCommits`` of a one-request transaction's Avro body (ids as bytes);
    their generations go in :func:`transaction_group_generations_avro`."""
    return [
        {
            "topic": c.topic,
            "group": c.group,
            "memberId": c.member_id,
            "positions": [
                {"partition": p, "id": position.to_bytes()}
                for p, position in sorted(c.positions.items())
            ],
        }
        for c in commits
    ]


def transaction_group_generations_avro(
    commits: Iterable[TransactionGroupCommit],
) -> list[dict[str, Any]]:
    """The ``groupCommitGenerations`` of a one-request transaction's Avro body: per
    entry of ``groupCommits``, in its order, the generation it names and that of each
    of its positions (in the order they are written, by partition)."""
    out: list[dict[str, Any]] = []
    for c in commits:
        named = c.generations or {}
        out.append(
            {
                "generation": c.generation,
                "positions": [named.get(p) for p in sorted(c.positions)] if named else [],
            }
        )
    return out


def read_transaction_group_commits(
    obj: Mapping[str, Any], *, binary: bool = False
) -> list[TransactionGroupCommit]:
    """The ``groupCommits`` of a one-request transaction body (none if absent); each a
    group commit body plus its topic and group, without a write pointer; ``binary``: of
    the Avro body, ids as bytes."""
    raw = obj.get("groupCommits")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest(
            "groupCommits must be a list of {topic, group, memberId, positions} objects"
        )
    named = _avro_generations(obj, len(raw)) if binary else None
    out: list[TransactionGroupCommit] = []
    seen: set[tuple[str, str, str]] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"groupCommits[{i}] must be an object")
        # An Avro entry has its schema's fields only; its generations come apart.
        only(item, _TRANSACTION_GROUP_COMMIT_FIELDS, f"groupCommits[{i}]")
        if item.get("transactionWritePointer") is not None:
            raise BadRequest("the server assigns the write pointer; do not send one")
        names = []
        for name in ("topic", "group"):
            value = item.get(name)
            if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
                raise BadRequest(
                    f"groupCommits[{i}].{name} must be a name of [A-Za-z0-9_-]{{1,128}}"
                )
            names.append(value)
        member_id, positions, _ = read_group_commit_request(item, binary=binary)
        if named is None:
            generation = read_commit_generation(item)
            generations = read_position_generations(item)
        else:
            generation, generations = _avro_entry_generations(named, i, item["positions"])
        # One entry per member: two would commit one partition twice in one
        # transaction, and the positions could not tell which is the later.
        key = (names[0], names[1], member_id)
        if key in seen:
            raise BadRequest(
                f"member {member_id} of group {names[1]} of topic {names[0]} appears more than once"
            )
        seen.add(key)
        out.append(
            TransactionGroupCommit(
                names[0], names[1], member_id, positions, generation, generations or None
            )
        )
    return out


def _avro_generations(obj: Mapping[str, Any], count: int) -> list[Any]:
    """The Avro body's ``groupCommitGenerations``: empty (a body written before it was
    added: the server goes by what it told each member), or one per group commit."""
    named = obj.get("groupCommitGenerations") or []
    if not isinstance(named, list) or (named and len(named) != count):
        raise BadRequest(
            "groupCommitGenerations must be empty or have one item per item of groupCommits"
        )
    return named


def _avro_entry_generations(
    named: list[Any], i: int, positions: list[Any]
) -> tuple[int | None, dict[int, int]]:
    """Entry ``i``'s generation and its positions' (by partition), of an Avro body."""
    if not named:
        return None, {}
    entry = named[i]
    what = f"groupCommitGenerations[{i}]"
    generation = integer(entry["generation"], what + ".generation", 0, INT64_MAX, optional=True)
    each = entry["positions"]
    if each and len(each) != len(positions):
        raise BadRequest(f"{what}.positions must be empty or have one item per position")
    generations: dict[int, int] = {}
    for j, (value, position) in enumerate(zip(each, positions, strict=False)):
        g = integer(value, f"{what}.positions[{j}]", 0, INT64_MAX, optional=True)
        if g is not None:
            generations[position["partition"]] = g
    return generation, generations


def changes_json(changes: Iterable[bytes]) -> dict[str, Any]:
    """The change keys a transactional group commit adds to its transaction."""
    return {"changes": [b64encode(c) for c in changes]}


def read_changes(obj: Any) -> list[bytes]:
    """The change keys of an answer written by :func:`changes_json`."""
    items = _field(obj, "changes", list)
    try:
        return [b64decode(item, "changes") for item in items]
    except BadRequest as exc:
        raise ServerError(f"unexpected change keys from the server: {exc}") from None


def read_group_rollback_request(obj: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The write pointer whose positions a rollback removes, and the member (if given)
    to rewind to its committed positions. One of them is required: a member alone is
    rewound only (its transaction never wrote a position, e.g. a one-request
    transaction that was not sent)."""
    only(obj, _GROUP_ROLLBACK_FIELDS, "group rollback")
    wp = _opt_int(obj, "transactionWritePointer", 1)
    member_id = _opt_member(obj)
    if wp is None and member_id is None:
        raise BadRequest("a rollback names transactionWritePointer, memberId, or both")
    return wp, member_id


def reset_request(to: str | MessageId | int) -> dict[str, Any]:
    """A group reset body: ``earliest``, ``latest``, after a message id, or a time (ms)."""
    if isinstance(to, MessageId):
        return {"id": b64encode(to.to_bytes())}
    if isinstance(to, int) and not isinstance(to, bool):
        return {"time": to}
    return {"to": to}


def read_reset_request(obj: Mapping[str, Any]) -> str | MessageId | int:
    """Where a reset body points."""
    only(obj, _RESET_FIELDS, "reset request")
    given = [k for k in ("to", "id", "time") if obj.get(k) is not None]
    if len(given) != 1:
        raise BadRequest("a reset names exactly one of to (earliest|latest), id or time")
    if given[0] == "id":
        return _message_id(obj["id"], "id")
    if given[0] == "time":
        time = _opt_int(obj, "time", 0)
        assert time is not None
        return time
    to = start_name(_opt_str(obj, "to"))
    if to not in ("earliest", "latest"):
        raise BadRequest(f"to must be earliest (or beginning) or latest (or end), got {to!r}")
    return to


def group_json(info: GroupInfo) -> dict[str, Any]:
    """A group as ``describe`` answers it; ids in hex."""
    return {
        "group": info.group,
        "partitionCount": info.partition_count,
        "generation": info.generation,
        "start": info.start,
        "members": [
            {"memberId": m, "partitions": list(ps)} for m, ps in sorted(info.members.items())
        ],
        "partitions": [
            {
                "partition": p.partition,
                "owner": p.owner,
                "position": None if p.position is None else p.position.hex,
                "lag": p.lag,
                "lagExact": p.lag_exact,
            }
            for p in info.partitions
        ],
        "end": None if info.end is None else info.end.hex,
        "lag": info.lag,
    }


def read_group(obj: Any) -> GroupInfo:
    """The :class:`GroupInfo` in an answer written by :func:`group_json`."""
    members = {
        _field(m, "memberId", str): _pointers(_field(m, "partitions", list))
        for m in _field(obj, "members", list)
    }
    partitions = tuple(
        GroupPartition(
            partition=_field(p, "partition", int),
            owner=p.get("owner") if isinstance(p.get("owner"), str) else None,
            position=_optional_id(p.get("position")),
            lag=_optional_int(p.get("lag")),
            lag_exact=bool(p.get("lagExact", True)),
        )
        for p in _field(obj, "partitions", list)
    )
    return GroupInfo(
        group=_field(obj, "group", str),
        partition_count=_field(obj, "partitionCount", int),
        generation=_field(obj, "generation", int),
        start=_field(obj, "start", str),
        members=members,
        partitions=partitions,
        end=_optional_id(obj.get("end")),
    )

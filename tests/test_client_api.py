"""The REST API as calls: requests built, answers decoded, errors mapped back."""

from __future__ import annotations

import orjson
import pytest

from tidings.client.api import RestApi, error_from_response
from tidings.client.base import encoded_transaction
from tidings.client.transports import Response
from tidings.codec import payload_frames, wire
from tidings.codec.json_bodies import PUBLISH_FIELDS
from tidings.codec.transaction import decode_transaction
from tidings.codec.wire import AVRO, AVRO_EXT, JSON
from tidings.errors import (
    BadRequest,
    EmptyPublish,
    InvalidName,
    ProducerFenced,
    ServerError,
    TopicNotFound,
    TransactionConflict,
)
from tidings.structs import (
    Message,
    MessageId,
    PayloadRange,
    Record,
    RollbackInfo,
    Transaction,
    TransactionState,
)

URL = "http://h:1"


def api(media: wire.Media = JSON) -> RestApi:
    return RestApi(URL, "ns", timeout=5.0, media=media)


def ok(body: object = None, content_type: str | None = "application/json") -> Response:
    raw = b"" if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
    return Response(200, raw, content_type)


@pytest.mark.parametrize("name", ["", "a/b", "a b", "x" * 129, "é"])
def test_invalid_names_are_refused_before_sending(name: str) -> None:
    with pytest.raises(InvalidName):
        api().get_topic(name)
    with pytest.raises(InvalidName):
        RestApi(URL, name, timeout=1, media=JSON)


def test_topic_admin_requests_and_answers() -> None:
    call = api().create_topic("t", 60, {"owner": "me"})
    assert (call.request.method, call.request.url) == ("PUT", f"{URL}/v1/namespaces/ns/topics/t")
    assert orjson.loads(call.request.body) == {"owner": "me", "ttl": 60}
    assert not call.request.idempotent
    meta = call.result(
        ok({"name": "t", "properties": {"ttl": "60", "owner": "me"}, "generation": 2})
    )
    assert (meta.namespace, meta.name, meta.ttl, meta.generation) == ("ns", "t", 60, 2)
    assert meta.properties == {"ttl": "60", "owner": "me"}

    empty = api().create_topic("t", None, None)
    assert empty.request.body == b"" and empty.request.content_type is None

    update = api().update_topic("t", 5, None)
    assert update.request.url.endswith("/topics/t/properties") and update.request.idempotent
    assert api().list_topics().result(ok(["a", "b"])) == ["a", "b"]
    assert api().delete_topic("t").request.method == "DELETE"


def test_stats_are_decoded() -> None:
    mid = MessageId(5, 1)
    stats = (
        api()
        .stats("t")
        .result(
            ok(
                {
                    "namespace": "ns",
                    "topic": "t",
                    "messageCount": 3,
                    "bytes": 30,
                    "oldestId": mid.hex,
                    "newestId": None,
                    "oldestTime": 5,
                    "newestTime": None,
                    "messagesPublished": 4,
                    "bytesPublished": 40,
                    "fetches": 1,
                    "publishRate": 0.5,
                    "fetchRate": 0,
                }
            )
        )
    )
    assert stats.oldest_id == mid and stats.newest_id is None and stats.fetch_rate == 0.0


@pytest.mark.parametrize("media", [JSON, AVRO, AVRO_EXT])
def test_publish_bodies_use_the_wire_codec(media: wire.Media) -> None:
    # A key where the medium can carry one (CDAP TMS's own Avro cannot).
    records = [Record(b"a"), Record(b"b", None if media is AVRO else b"key")]
    rest = api(media)
    if media is AVRO:
        # Records, keyed or not, in CDAP TMS's Avro as before: no key goes unnoticed.
        assert rest.publish("t", records).request.content_type == AVRO.value
        with pytest.raises(ValueError, match="key"):
            rest.publish("t", [Record(b"k", b"key")])
        records = [Record(b"a"), Record(b"b")]
        call = rest.publish("t", [b"a", b"b"])  # plain payloads: the payloads body
        assert call.request.content_type == payload_frames.CONTENT_TYPE
    if media is not JSON:
        # The payloads body first; after a server refused it (415), the medium's codec.
        if media is AVRO_EXT:
            call = rest.publish("t", records)
        assert call.request.content_type == payload_frames.CONTENT_TYPE
        sent_first = payload_frames.read_frames(call.request.body).records()
        assert [r if isinstance(r, Record) else Record(r) for r in sent_first] == records
        assert call.fallback is not None
        call = call.fallback()
        assert not rest.payload_frames
    else:
        call = rest.publish("t", records)
    assert call.request.content_type == media.value
    sent = wire.decode_publish_request(call.request.body, media).records
    assert [r if isinstance(r, Record) else Record(r) for r in sent] == records
    assert call.result(ok(content_type=media.value)) is None
    with pytest.raises(EmptyPublish):
        api(media).publish("t", [])


def test_transactional_publish_returns_rollback_info_in_the_answers_media() -> None:
    info = RollbackInfo(7, 100, 0, 100, 1)
    call = api(AVRO_EXT).publish_transactional("t", [], 7)
    request = wire.decode_publish_request(call.request.body, AVRO_EXT)
    assert request.write_pointer == 7 and request.records == []
    body = wire.encode_rollback_info(info, AVRO_EXT)
    assert call.result(ok(body, AVRO_EXT.value)) == info
    rollback = api(AVRO_EXT).rollback("t", info)
    assert rollback.request.content_type == JSON.value  # only JSON answers with a count
    assert wire.decode_rollback_info(rollback.request.body, JSON) == info
    assert rollback.result(ok({"rolledBack": 2})) == 2


def test_poll_request_and_long_poll_timeout() -> None:
    mid = MessageId(10, 2)
    tx = Transaction(5, 9, (3,), (4,))
    call = api(AVRO_EXT).poll(
        "t", mid, inclusive=False, limit=10, transaction=encoded_transaction(tx), wait=2.5
    )
    assert call.request.url.endswith("/topics/t/poll?waitMs=2500")
    assert call.request.timeout == pytest.approx(7.5)
    assert call.request.idempotent
    sent = wire.decode_consume_request(call.request.body, AVRO_EXT)
    assert (sent.start, sent.inclusive, sent.limit) == (mid, False, 10)
    assert sent.transaction is not None and decode_transaction(sent.transaction) == tx
    messages = [Message(mid, b"p", b"k", {"h": b"v"})]
    answer = wire.encode_messages(messages, AVRO_EXT)
    assert call.result(ok(answer, AVRO_EXT.value)) == messages
    assert (
        api()
        .poll("t", 123, inclusive=True, limit=None, transaction=None, wait=None)
        .request.url.endswith("/poll")
    )


@pytest.mark.parametrize("wait", [float("nan"), float("inf"), -float("inf"), "1", True])
def test_a_wait_that_is_not_a_finite_number_is_refused_before_sending(wait: object) -> None:
    rest = api()
    with pytest.raises(ValueError, match="wait must be a finite number"):
        rest.poll("t", None, inclusive=True, limit=1, transaction=None, wait=wait)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait must be a finite number"):
        rest.group_poll("t", "g", "m", 1, wait, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait must be a finite number"):
        rest.queue_pop("t", "q", "c", 1, wait)  # type: ignore[arg-type]
    # Zero, None and a negative wait stay what they were: no wait.
    for none in (0, 0.0, None, -1.5):
        assert "waitMs" not in rest.queue_pop("t", "q", "c", 1, none).request.url


def test_transaction_calls() -> None:
    begin = api().begin(10, "producer", 3)
    assert begin.request.url == f"{URL}/v1/transactions"
    body = orjson.loads(begin.request.body)
    # A fresh begin id makes the begin safe to send again (docs/client.md).
    begin_id = body.pop("beginId")
    assert len(begin_id) == 32 and int(begin_id, 16) >= 0
    assert begin.request.idempotent
    assert body == {
        "timeout": 10,
        "transactionalId": "producer",
        "epoch": 3,
    }
    tx = begin.result(
        ok(
            {
                "writePointer": 9,
                "readPointer": 5,
                "invalid": [4, 2],
                "inProgress": [6],
                "encoded": "AA==",
            }
        )
    )
    assert tx == Transaction(5, 9, (2, 4), (6,))
    commit = api().commit(9, [b"k1", b"k2"], None, None)
    assert commit.request.url.endswith("/v1/transactions/9/commit")
    assert orjson.loads(commit.request.body) == {"changes": ["azE=", "azI="]}
    assert orjson.loads(api().abort(9, None, None).request.body) == {}
    assert api().invalidate(9).request.body == b""
    state = (
        api()
        .transactions()
        .result(
            ok(
                {
                    "readPointer": 5,
                    "lastWritePointer": 12,
                    "inProgress": [
                        {"writePointer": 11, "expiresAt": 99},
                        {"writePointer": 7, "expiresAt": 98},
                    ],
                    "invalid": [3],
                }
            )
        )
    )
    assert state == TransactionState(5, 12, {7: 98, 11: 99}, (3,))
    assert list(state.in_progress) == [7, 11]
    producer = (
        api()
        .register_producer("p")
        .result(ok({"transactionalId": "p", "producerId": 1, "epoch": 2}))
    )
    assert (producer.producer_id, producer.epoch) == (1, 2)
    prune = api().prune(10, [3])
    assert orjson.loads(prune.request.body) == {"below": 10, "ids": [3]}
    assert prune.result(ok({"pruned": [3]})) == [3]


def test_transactions_url_can_point_elsewhere() -> None:
    split = RestApi(URL, "ns", timeout=1, media=JSON, transactions_url="http://tx:2/")
    assert split.begin(None, None, None).request.url == "http://tx:2/v1/transactions"


def test_errors_map_back_to_their_classes() -> None:
    def err(status: int, body: object) -> Exception:
        return error_from_response(Response(status, orjson.dumps(body), "application/json"))

    assert type(err(404, {"error": "no t", "type": "TopicNotFound"})) is TopicNotFound
    assert type(err(409, {"error": "x", "type": "TransactionConflict"})) is TransactionConflict
    assert type(err(403, {"error": "x", "type": "ProducerFenced"})) is ProducerFenced
    # An unknown type falls back to the status; a non-JSON body still gives a message.
    assert type(err(400, {"error": "x", "type": "Whatever"})) is BadRequest
    plain = error_from_response(Response(502, b"bad gateway", "text/plain"))
    assert isinstance(plain, ServerError) and plain.retriable and "bad gateway" in str(plain)
    with pytest.raises(TopicNotFound, match="no t"):
        api().get_topic("t").result(Response(404, b'{"error":"no t","type":"TopicNotFound"}'))


def test_malformed_answers_are_server_errors() -> None:
    with pytest.raises(ServerError):
        api().list_topics().result(ok(b"{not json"))
    with pytest.raises(ServerError):
        api().get_topic("t").result(ok({"name": "t"}))


# --- payload ranges ---


@pytest.mark.parametrize("media", [JSON, AVRO, AVRO_EXT], ids=lambda m: m.name)
def test_store_returns_the_range_in_its_answers_header(media: wire.Media) -> None:
    call = api(media).store("t", [b"a"], 7)
    assert call.request.url.endswith("/topics/t/store")
    answer = Response(200, b"", media.value, {"tidings-payload-range": "1700.3-1701.0"})
    assert call.result(answer) == PayloadRange(1700, 3, 1701, 0)


@pytest.mark.parametrize("header", [None, "", "1.2", "1.2-3", "a.b-c.d", "1.2-3.4-5", "-1.2-3.4"])
def test_store_without_a_well_formed_range_is_a_server_error(header: str | None) -> None:
    headers = {} if header is None else {"tidings-payload-range": header}
    with pytest.raises(ServerError):
        api().store("t", [b"a"], 7).result(Response(200, b"", JSON.value, headers))


@pytest.mark.parametrize("media", [JSON, AVRO_EXT], ids=lambda m: m.name)
def test_publish_with_ranges_is_a_json_body(media: wire.Media) -> None:
    ranges = [PayloadRange(5, 0, 5, 9), PayloadRange(1, 2, 3, 4)]
    call = api(media).publish_transactional("t", [], 7, ranges)
    assert call.request.content_type == JSON.value
    assert orjson.loads(call.request.body) == {
        "transactionWritePointer": 7,
        "messages": [],
        "payloadRanges": [{"first": [5, 0], "last": [5, 9]}, {"first": [1, 2], "last": [3, 4]}],
    }
    # ...which the server decodes back to the same ranges.
    decoded = wire.decode_publish_request(call.request.body, JSON)
    assert (decoded.write_pointer, decoded.payload_ranges) == (7, ranges)
    info = RollbackInfo(7, 1, 0, 1, 1)
    assert call.result(ok(orjson.loads(wire.encode_rollback_info(info, JSON)))) == info


def test_publish_without_ranges_keeps_the_clients_media() -> None:
    call = api(AVRO_EXT).publish_transactional("t", [], 7)
    assert call.request.content_type == AVRO_EXT.value
    assert wire.decode_publish_request(call.request.body, AVRO_EXT).payload_ranges is None


@pytest.mark.parametrize(
    "records",
    [
        [Record(b"a", b"k1"), Record(b"b"), Record(b"", b"")],
        [Record(b"a", b"k1"), b"plain", Record(b"c", None, {"h": b"v"}, 5)],
        [Record(b"a", None, {}, 9)],
    ],
)
def test_one_request_batches_decode_to_what_was_sent(records: list[Record | bytes]) -> None:
    from tidings.client.api import _json_batch

    part = _json_batch("t", records)
    # One topic of a transaction in one request: its fields include the topic.
    decoded = wire.publish_request_from_json(part, PUBLISH_FIELDS | {"topic"}).records
    want = [r if isinstance(r, Record) else Record(r) for r in records]
    assert [(r.payload, r.key, dict(r.headers), r.ttl) for r in decoded] == [  # type: ignore[union-attr]
        (r.payload, r.key, dict(r.headers), r.ttl) for r in want
    ]


def test_a_bad_key_in_extras_is_named() -> None:
    part = {"topic": "t", "messages": ["eA==", "eA=="], "extras": [{"key": "eA=="}, {"key": "!"}]}
    with pytest.raises(BadRequest, match=r"extras\[1\]\.key"):
        wire.publish_request_from_json(part, PUBLISH_FIELDS | {"topic"})

"""The connector's options, parsed and checked once on the driver.

Spark hands a data source its options as strings in a case-insensitive dict whose keys
it has lower-cased, so every key here is looked up in lower case. A mistake (an unknown
isolation level, a malformed message id, a read-only option on a write) is a
:class:`ValueError` that names the option, raised while Spark plans the query, never a
failure in a task later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tidings.errors import InvalidMessageId
from tidings.names import DEFAULT_URL, NAME_PATTERN
from tidings.structs import MessageId

__all__ = [
    "DEFAULT_FETCH_SIZE",
    "DEFAULT_GENERATION_CHECK_INTERVAL",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TRANSACTION_TIMEOUT",
    "Bound",
    "Isolation",
    "ReadOptions",
    "Start",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]

DEFAULT_NAMESPACE = "default"
#: Messages asked for per poll: the server's maximum is 10,000; 5,000 1 KiB messages
#: keep a response around 5 MiB.
DEFAULT_FETCH_SIZE = 5_000
#: Seconds between requests for the generation of a topic a streaming query finds
#: nothing new in, where no poll of the query's told it (docs/spark.md).
DEFAULT_GENERATION_CHECK_INTERVAL = 1.0
#: Seconds a write's transaction may stay open: a whole batch job, or one micro-batch.
DEFAULT_TRANSACTION_TIMEOUT = 600.0
#: Records per ``store`` call and the bytes at which a call is sent early.
DEFAULT_STORE_BATCH = 2_000
DEFAULT_STORE_BYTES = 4 * 1024 * 1024

Isolation = Literal["read_committed", "read_uncommitted"]

#: Control topics are ``__tidings_sink_<sinkId>``; a topic name is at most 128 characters.
_SINK_ID = re.compile(r"[A-Za-z0-9_-]{1,113}")


@dataclass(frozen=True, slots=True)
class Start:
    """Where reading a topic starts. ``kind``:

    - ``earliest``: the oldest live message;
    - ``latest``: after the newest stable message when the query starts;
    - ``id``: at message ``value`` (a 40-hex id), inclusive;
    - ``time``: at the first message published at or after ``value`` ms;
    - ``after``: right after message ``value`` (a position of a checkpointed offset).
    """

    kind: Literal["earliest", "latest", "id", "time", "after"]
    value: str | int | None = None


@dataclass(frozen=True, slots=True)
class Bound:
    """Where a batch read ends: ``latest`` (the newest stable message at planning),
    ``id`` (message ``value``, inclusive) or ``time`` (before ``value`` ms, exclusive)."""

    kind: Literal["latest", "id", "time"]
    value: str | int | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What ``spark.read`` / ``spark.readStream`` asked for."""

    url: str
    namespace: str
    topics: tuple[str, ...]
    starts: Mapping[str, Start]
    ends: Mapping[str, Bound]
    isolation: Isolation = "read_committed"
    max_messages_per_trigger: int | None = None
    min_partitions: int | None = None
    fetch_size: int = DEFAULT_FETCH_SIZE
    request_timeout: float = 30.0
    #: The bearer token, where the server has an auth file (docs/security.md).
    token: str | None = None
    #: A CA file to check an https server's certificate with (None: the system's).
    cacert: str | None = None
    #: Fail when a topic was deleted (and perhaps created again) under a streaming
    #: query, or since the generations given were recorded, rather than go on reading
    #: the new topic from its start.
    fail_on_data_loss: bool = True
    #: The topics' generations the starting or ending offsets carry (``@generations``
    #: of an offset taken from a streaming checkpoint): the read is of those topics
    #: as they were then, and a topic created again since is lost data.
    generations: Mapping[str, int] = field(default_factory=dict)
    #: False for ``spark.read``: only what an error says differs.
    streaming: bool = True
    #: Streaming: at most one request per this many seconds for the generation of a
    #: topic with nothing new whose generation no poll answered (0: at every trigger).
    generation_check_interval: float = DEFAULT_GENERATION_CHECK_INTERVAL

    @property
    def committed(self) -> bool:
        """True for read-committed: reads take a transaction snapshot."""
        return self.isolation == "read_committed"


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """What ``df.write`` / ``df.writeStream`` asked for."""

    url: str
    namespace: str
    topic: str | None
    sink_id: str | None = None
    checkpoint_location: str | None = None
    transaction_timeout: float = DEFAULT_TRANSACTION_TIMEOUT
    store_batch: int = DEFAULT_STORE_BATCH
    store_bytes: int = DEFAULT_STORE_BYTES
    request_timeout: float = 30.0
    token: str | None = None
    cacert: str | None = None


_READ_KEYS = {
    "url",
    "namespace",
    "topic",
    "startingmessageid",
    "startingtimestamp",
    "endingmessageid",
    "endingtimestamp",
    "isolation",
    "maxmessagespertrigger",
    "failondataloss",
    "generationcheckinterval",
    "minpartitions",
    "fetchsize",
    "requesttimeout",
    "token",
    "cacert",
}
_WRITE_ONLY_KEYS = {"sinkid", "transactiontimeout", "storebatchsize", "storebatchbytes"}
#: Keys Spark itself adds to a write's options (``.queryName()``, a streaming query's
#: ``checkpointLocation``): accepted, and not ours to check.
_SPARK_WRITE_KEYS = {"queryname", "checkpointlocation"}
#: Every option as documented, by the lower-cased key Spark hands over.
_NAMES = {
    name.lower(): name
    for name in (
        "url",
        "namespace",
        "topic",
        "startingMessageId",
        "startingTimestamp",
        "endingMessageId",
        "endingTimestamp",
        "isolation",
        "maxMessagesPerTrigger",
        "failOnDataLoss",
        "generationCheckInterval",
        "minPartitions",
        "fetchSize",
        "requestTimeout",
        "token",
        "cacert",
        "sinkId",
        "transactionTimeout",
        "storeBatchSize",
        "storeBatchBytes",
    )
}
#: What users of Spark's Kafka source and sink write for the options above.
_KAFKA_NAMES = {
    "subscribe": "topic",
    "startingoffsets": "startingMessageId",
    "startingoffsetsbytimestamp": "startingTimestamp",
    "endingoffsets": "endingMessageId",
    "endingoffsetsbytimestamp": "endingTimestamp",
    "maxoffsetspertrigger": "maxMessagesPerTrigger",
    "kafka.isolation.level": "isolation",
}


def _check_known(opts: Mapping[str, str], known: set[str], what: str) -> None:
    """Refuse a key that no option of ``what`` has: a misspelt option would otherwise
    be dropped silently, and a read start from the earliest message instead."""
    for key in sorted(opts):
        if key in known:
            continue
        if key == "path":
            raise ValueError(
                f"the tidings source takes no path: name the topic with the topic option "
                f"(got path {opts[key]!r})"
            )
        hint = _KAFKA_NAMES.get(key)
        advice = f"; did you mean {hint}?" if hint and hint.lower() in known else ""
        names = ", ".join(_NAMES[k] for k in sorted(known & _NAMES.keys()))
        raise ValueError(f"unknown option {key!r} for {what}{advice} (options: {names})")


def _get(options: Mapping[str, str], key: str) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _name(value: str, what: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(f"option {what}: not 1-128 characters of [A-Za-z0-9_-]: {value!r}")
    return value


def _positive_int(options: Mapping[str, str], key: str, what: str) -> int | None:
    text = _get(options, key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {what} must be a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"option {what} must be a positive integer, got {value}")
    return value


def _positive_float(options: Mapping[str, str], key: str, what: str) -> float | None:
    text = _get(options, key)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"option {what} must be a positive number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"option {what} must be a positive number, got {text!r}")
    return value


def _non_negative_float(options: Mapping[str, str], key: str, what: str) -> float | None:
    text = _get(options, key)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"option {what} must be a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):  # NaN fails this too
        raise ValueError(f"option {what} must be a number of seconds (0 or more), got {text!r}")
    return value


def _boolean(options: Mapping[str, str], key: str, what: str, *, default: bool) -> bool:
    text = _get(options, key)
    if text is None:
        return default
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ValueError(f"option {what} must be true or false, got {text!r}")


def _url(options: Mapping[str, str]) -> str:
    url = _get(options, "url") or DEFAULT_URL
    if not re.match(r"https?://[^/]+", url):
        raise ValueError(f"option url must be an http(s) URL, got {url!r}")
    return url.rstrip("/")


def _topics(text: str | None, *, required: bool) -> tuple[str, ...]:
    if text is None:
        if required:
            raise ValueError("option topic is required: one topic or a comma-separated list")
        return ()
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("option topic names no topic")
    seen: list[str] = []
    for name in names:
        _name(name, "topic")
        if name not in seen:
            seen.append(name)
    return tuple(seen)


#: An offset's key for its topics' generations (:data:`tidings.spark.offsets.GENERATIONS`).
_GENERATIONS = "@generations"


def _per_topic(
    text: str, topics: tuple[str, ...], what: str, generations: dict[str, int] | None = None
) -> dict[str, str]:
    """``text`` for every topic, or a JSON object ``{"topic": value}`` naming some.

    With ``generations``, the object may be a streaming offset as checkpointed: its
    ``@generations`` go there (the caller then reads its values as positions)."""
    if not text.startswith("{"):
        return {t: text for t in topics}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"option {what}: malformed JSON object") from None
    if not isinstance(raw, dict):
        raise ValueError(f"option {what}: expected a JSON object of topic -> value")
    if generations is not None and _GENERATIONS in raw:
        raw = dict(raw)
        given = raw.pop(_GENERATIONS)
        if not isinstance(given, dict):
            raise ValueError(f"option {what}: {_GENERATIONS} must be an object of topic -> int")
        for topic, generation in given.items():
            if topic not in topics:
                raise ValueError(
                    f"option {what}: {_GENERATIONS} names topic {topic!r}, which is not read"
                )
            if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
                raise ValueError(
                    f"option {what}: {_GENERATIONS}[{topic!r}] must be a positive integer"
                )
            if generations.setdefault(topic, generation) != generation:
                raise ValueError(
                    f"options startingMessageId and endingMessageId give topic {topic!r} "
                    f"two generations ({generations[topic]} and {generation})"
                )
    out: dict[str, str] = {}
    for topic, value in raw.items():
        if topic not in topics:
            raise ValueError(f"option {what} names topic {topic!r}, which is not read")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"option {what}[{topic!r}] must be a string or an integer")
        out[topic] = str(value)
    return out


def _message_id(text: str, what: str) -> str:
    try:
        return MessageId.from_hex(text).hex
    except InvalidMessageId as exc:
        raise ValueError(f"option {what}: {exc.message}") from None


def _timestamp(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {what} must be milliseconds since the epoch: {text!r}") from None
    if value < 0:
        raise ValueError(f"option {what} must not be negative: {value}")
    return value


def _offset_parts(text: str, what: str) -> tuple[str, str]:
    """A checkpointed offset's position ``text`` as ``(form, value)``: ``earliest``,
    ``time``, ``at`` or ``after`` (a bare id: right after that message)."""
    if text == "earliest":
        return "earliest", ""
    for form in ("time", "at"):
        if text.startswith(form + ":"):
            value = text[len(form) + 1 :]
            if form == "time":
                return form, str(_timestamp(value, what))
            return form, _message_id(value, what)
    return "after", _message_id(text, what)


def _starts(
    options: Mapping[str, str], topics: tuple[str, ...], generations: dict[str, int]
) -> dict[str, Start]:
    by_id = _get(options, "startingmessageid")
    by_time = _get(options, "startingtimestamp")
    if by_id is not None and by_time is not None:
        raise ValueError("options startingMessageId and startingTimestamp exclude each other")
    starts = {t: Start("earliest") for t in topics}
    if by_id is not None:
        given = len(generations)
        values = _per_topic(by_id, topics, "startingMessageId", generations)
        checkpointed = len(generations) > given or _GENERATIONS in by_id
        for topic, text in values.items():
            if checkpointed:
                # A streaming offset: its positions mean what they mean to the stream,
                # so the read starts where the next micro-batch would.
                form, value = _offset_parts(text, "startingMessageId")
                if form == "earliest":
                    starts[topic] = Start("earliest")
                elif form == "time":
                    starts[topic] = Start("time", int(value))
                else:
                    starts[topic] = Start("id" if form == "at" else "after", value)
                continue
            lowered = text.lower()
            if lowered in ("earliest", "latest"):
                starts[topic] = Start(lowered)  # type: ignore[arg-type]
            else:
                starts[topic] = Start("id", _message_id(text, "startingMessageId"))
    if by_time is not None:
        for topic, text in _per_topic(by_time, topics, "startingTimestamp").items():
            starts[topic] = Start("time", _timestamp(text, "startingTimestamp"))
    return starts


def _ends(
    options: Mapping[str, str], topics: tuple[str, ...], generations: dict[str, int]
) -> dict[str, Bound]:
    by_id = _get(options, "endingmessageid")
    by_time = _get(options, "endingtimestamp")
    if by_id is not None and by_time is not None:
        raise ValueError("options endingMessageId and endingTimestamp exclude each other")
    ends = {t: Bound("latest") for t in topics}
    if by_id is not None:
        given = len(generations)
        values = _per_topic(by_id, topics, "endingMessageId", generations)
        checkpointed = len(generations) > given or _GENERATIONS in by_id
        for topic, text in values.items():
            if checkpointed:
                # A streaming offset: a micro-batch ending there read every message up
                # to and including an id; from "at:<id>", "time:<ms>" or "earliest" on
                # it read nothing yet.
                form, value = _offset_parts(text, "endingMessageId")
                if form == "after":
                    ends[topic] = Bound("id", value)
                elif form == "at":
                    ends[topic] = Bound("id", MessageId.from_hex(value).previous().hex)
                else:
                    ends[topic] = Bound("time", int(value) if form == "time" else 0)
                continue
            if text.lower() == "latest":
                ends[topic] = Bound("latest")
            else:
                ends[topic] = Bound("id", _message_id(text, "endingMessageId"))
    if by_time is not None:
        for topic, text in _per_topic(by_time, topics, "endingTimestamp").items():
            ends[topic] = Bound("time", _timestamp(text, "endingTimestamp"))
    return ends


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check and parse the options of ``spark.read`` (``streaming=False``) or
    ``spark.readStream``; ValueError names the first bad option."""
    opts = {str(k).lower(): v for k, v in options.items()}
    for key in _WRITE_ONLY_KEYS:
        if key in opts:
            raise ValueError(f"option {key} applies to writes only")
    _check_known(opts, _READ_KEYS, "reading")
    if streaming:
        for key in ("endingmessageid", "endingtimestamp"):
            if key in opts:
                raise ValueError(f"option {key} applies to batch reads only")
    else:
        for key, name in (
            ("maxmessagespertrigger", "maxMessagesPerTrigger"),
            ("generationcheckinterval", "generationCheckInterval"),
        ):
            if key in opts:
                raise ValueError(f"option {name} applies to streaming reads only")
    topics = _topics(_get(opts, "topic"), required=True)
    isolation = (_get(opts, "isolation") or "read_committed").lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise ValueError(
            f"option isolation must be read_committed or read_uncommitted, got {isolation!r}"
        )
    fetch_size = _positive_int(opts, "fetchsize", "fetchSize") or DEFAULT_FETCH_SIZE
    generations: dict[str, int] = {}
    starts = _starts(opts, topics, generations)
    ends = _ends(opts, topics, generations)
    return ReadOptions(
        url=_url(opts),
        namespace=_name(_get(opts, "namespace") or DEFAULT_NAMESPACE, "namespace"),
        topics=topics,
        starts=starts,
        ends=ends,
        isolation=isolation,  # type: ignore[arg-type]
        max_messages_per_trigger=_positive_int(
            opts, "maxmessagespertrigger", "maxMessagesPerTrigger"
        ),
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions"),
        fetch_size=min(fetch_size, 10_000),
        request_timeout=_positive_float(opts, "requesttimeout", "requestTimeout") or 30.0,
        token=_get(opts, "token"),
        cacert=_get(opts, "cacert"),
        fail_on_data_loss=_boolean(opts, "failondataloss", "failOnDataLoss", default=True),
        generations=generations,
        streaming=streaming,
        generation_check_interval=_checked_interval(opts),
    )


def _checked_interval(opts: Mapping[str, str]) -> float:
    found = _non_negative_float(opts, "generationcheckinterval", "generationCheckInterval")
    return DEFAULT_GENERATION_CHECK_INTERVAL if found is None else found


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check and parse the options of ``df.write`` / ``df.writeStream``."""
    opts = {str(k).lower(): v for k, v in options.items()}
    for key in _READ_KEYS - {"url", "namespace", "topic", "requesttimeout", "token", "cacert"}:
        if key in opts:
            raise ValueError(f"option {key} applies to reads only")
    _check_known(
        opts,
        _WRITE_ONLY_KEYS
        | _SPARK_WRITE_KEYS
        | {"url", "namespace", "topic", "requesttimeout", "token", "cacert"},
        "writing",
    )
    topics = _topics(_get(opts, "topic"), required=False)
    if len(topics) > 1:
        raise ValueError("option topic names one topic when writing (or use a topic column)")
    sink_id = _get(opts, "sinkid")
    if sink_id is not None and not _SINK_ID.fullmatch(sink_id):
        raise ValueError(
            f"option sinkId must be 1-113 characters of [A-Za-z0-9_-], got {sink_id!r}"
        )
    return WriteOptions(
        url=_url(opts),
        namespace=_name(_get(opts, "namespace") or DEFAULT_NAMESPACE, "namespace"),
        topic=topics[0] if topics else None,
        sink_id=sink_id,
        checkpoint_location=_get(opts, "checkpointlocation"),
        transaction_timeout=_positive_float(opts, "transactiontimeout", "transactionTimeout")
        or DEFAULT_TRANSACTION_TIMEOUT,
        store_batch=_positive_int(opts, "storebatchsize", "storeBatchSize") or DEFAULT_STORE_BATCH,
        store_bytes=_positive_int(opts, "storebatchbytes", "storeBatchBytes")
        or DEFAULT_STORE_BYTES,
        request_timeout=_positive_float(opts, "requesttimeout", "requestTimeout") or 30.0,
        token=_get(opts, "token"),
        cacert=_get(opts, "cacert"),
    )

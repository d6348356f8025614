"""Topics in the Metadata Table: create, update, get, list, delete, and the topic cache.

A topic has two records (keys in :mod:`tidings.codec.keys`): its *record* (topic id and
properties, written on create/update) and its *state* (generation, ttl and the last
assigned positions, rewritten by every publish). Ids are allocated from a counter and
never reused; a deleted topic keeps its id and a negative generation, and re-creating it
uses ``abs(generation) + 1`` (docs/design.md, "Topics"), so rows of older generations sit
in one range the cleaner can drop.

The cache maps a name to what was last seen of it. The id part can never be wrong (ids
are never reused); the generation is only used to answer "no such topic" early. Every
write function and every fetch reads the state record again in its own transaction, so
delete and re-create (by this or another service) always take effect at once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tidings.codec import keys, values
from tidings.codec.values import TopicState
from tidings.errors import ServerError, TopicAlreadyExists, TopicNotFound
from tidings.messaging.names import normalize_properties
from tidings.names import check_name
from tidings.store.backend import ReadView, Store, WriteView
from tidings.structs import TopicMetadata

__all__ = ["TopicRef", "Topics"]

_META = "metadata"


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A topic's id and the state seen in one transaction."""

    namespace: str
    name: str
    topic_id: int
    state: TopicState


class Topics:
    """Topic administration plus the name -> id cache the data paths use."""

    def __init__(self, store: Store, default_ttl: int) -> None:
        self._store = store
        self._default_ttl = default_ttl
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], TopicRef] = {}

    # --- admin -----------------------------------------------------------------

    def create(
        self, namespace: str, topic: str, properties: Mapping[str, object] | None
    ) -> TopicMetadata:
        """Create a topic; TopicAlreadyExists if it is live."""
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        ttl, props = normalize_properties(properties, self._default_ttl)

        def create(view: WriteView) -> TopicRef:
            record_key = keys.topic_record_key(namespace, topic)
            raw = view.get(_META, record_key)
            if raw is None:
                topic_id = _allocate_id(view)
                state = TopicState(generation=1, ttl=ttl)
            else:
                topic_id, _ = values.decode_topic_record(raw)
                old = _read_state(view, topic_id)
                if old.generation > 0:
                    raise TopicAlreadyExists(f"topic {namespace}:{topic} exists already")
                if -old.generation >= keys.MAX_GENERATION:
                    raise ServerError(f"topic {namespace}:{topic} has no generations left")
                # Keep the last positions: ids stay increasing across generations too.
                # The counts are the new generation's: empty.
                state = old._replace(
                    generation=-old.generation + 1, ttl=ttl, message_count=0, payload_bytes=0
                )
            view.put(_META, record_key, values.encode_topic_record(topic_id, props))
            view.put(_META, keys.state_key(topic_id), values.encode_state(state))
            return TopicRef(namespace, topic, topic_id, state)

        ref = self._store.apply(create)
        self._remember(ref)
        return _metadata(ref, props)

    def update(self, namespace: str, topic: str, properties: Mapping[str, object]) -> TopicMetadata:
        """Replace all properties of a live topic; TopicNotFound otherwise."""
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        ttl, props = normalize_properties(properties, self._default_ttl)

        def update(view: WriteView) -> TopicRef:
            ref = self.resolve(view, namespace, topic)
            state = ref.state._replace(ttl=ttl)
            view.put(
                _META,
                keys.topic_record_key(namespace, topic),
                values.encode_topic_record(ref.topic_id, props),
            )
            view.put(_META, keys.state_key(ref.topic_id), values.encode_state(state))
            return TopicRef(namespace, topic, ref.topic_id, state)

        ref = self._store.apply(update)
        self._remember(ref)
        return _metadata(ref, props)

    def get(self, namespace: str, topic: str) -> TopicMetadata:
        """A live topic's metadata; TopicNotFound otherwise."""
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        with self._store.read() as view:
            raw = view.get(_META, keys.topic_record_key(namespace, topic))
            ref = self.resolve(view, namespace, topic)
            assert raw is not None  # resolve() found it
            _, props = values.decode_topic_record(raw)
        return _metadata(ref, props)

    def names(self, namespace: str) -> list[str]:
        """Names of the live topics of a namespace, sorted."""
        check_name(namespace, "namespace")
        start, stop = keys.topic_records_range(namespace)
        names: list[str] = []
        with self._store.read() as view:
            for key, raw in view.scan(_META, start, stop):
                topic_id, _ = values.decode_topic_record(raw)
                if _read_state(view, topic_id).generation > 0:
                    names.append(key[len(start) :].decode("ascii"))
        return names  # key order is name order: names are ASCII

    def delete(self, namespace: str, topic: str) -> None:
        """Delete a live topic: its generation turns negative, its rows become invisible."""
        check_name(namespace, "namespace")
        check_name(topic, "topic")

        def delete(view: WriteView) -> TopicRef:
            ref = self.resolve(view, namespace, topic)
            state = ref.state._replace(generation=-ref.state.generation)
            view.put(_META, keys.state_key(ref.topic_id), values.encode_state(state))
            return TopicRef(namespace, topic, ref.topic_id, state)

        self._remember(self._store.apply(delete))

    # --- lookups for the data paths ------------------------------------------------

    def resolve(self, view: ReadView, namespace: str, topic: str) -> TopicRef:
        """The live topic as ``view`` sees it; TopicNotFound if it is not live there.

        Costs one point read when the id is cached (always, after the first use).
        """
        cached = self._cache.get((namespace, topic))
        if cached is not None:
            topic_id = cached.topic_id
        else:
            raw = view.get(_META, keys.topic_record_key(namespace, topic))
            if raw is None:
                raise TopicNotFound(f"topic {namespace}:{topic} does not exist")
            topic_id, _ = values.decode_topic_record(raw)
        ref = TopicRef(namespace, topic, topic_id, _read_state(view, topic_id))
        self._remember(ref)
        if ref.state.generation <= 0:
            raise TopicNotFound(f"topic {namespace}:{topic} does not exist")
        return ref

    def check_live(self, namespace: str, topic: str) -> TopicRef:
        """Validate names and answer "no such topic" before a write is queued.

        Trusts a cached live entry (the write function checks again); anything else is
        read from the store, so a topic re-created elsewhere is found.
        """
        check_name(namespace, "namespace")
        check_name(topic, "topic")
        cached = self._cache.get((namespace, topic))
        if cached is not None and cached.state.generation > 0:
            return cached
        with self._store.read() as view:
            return self.resolve(view, namespace, topic)

    def known_live(self, namespace: str, topic: str) -> bool:
        """True if the cache holds the topic as live: :meth:`check_live` then reads
        nothing from the store."""
        cached = self._cache.get((namespace, topic))
        return cached is not None and cached.state.generation > 0

    def all_names(self) -> dict[int, tuple[str, str]]:
        """Every topic id with its ``(namespace, topic)`` (deleted ones too)."""
        prefix = keys.TOPIC_PREFIX
        out: dict[int, tuple[str, str]] = {}
        with self._store.read() as view:
            for key, raw in view.scan(_META, prefix, prefix[:-1] + b"0"):
                namespace, _, topic = key[len(prefix) :].decode("ascii").partition("/")
                out[values.decode_topic_record(raw)[0]] = (namespace, topic)
        return out

    def live_states(self) -> list[tuple[int, TopicState]]:
        """Every topic id with its state (deleted ones too), for the cleaner."""
        prefix = keys.STATE_PREFIX
        with self._store.read() as view:
            return [
                (keys.parse_state_key(k), values.decode_state(v))
                for k, v in view.scan(_META, prefix, prefix[:-1] + b"0")
            ]

    def _remember(self, ref: TopicRef) -> None:
        with self._lock:
            self._cache[(ref.namespace, ref.name)] = ref


def _allocate_id(view: WriteView) -> int:
    raw = view.get(_META, keys.NEXT_TOPIC_ID_KEY)
    topic_id = 1 if raw is None else values.decode_next_topic_id(raw) + 1
    if topic_id > keys.MAX_TOPIC_ID:
        raise ServerError("no topic ids left")
    view.put(_META, keys.NEXT_TOPIC_ID_KEY, values.encode_next_topic_id(topic_id))
    return topic_id


def _read_state(view: ReadView, topic_id: int) -> TopicState:
    raw = view.get(_META, keys.state_key(topic_id))
    if raw is None:
        raise ServerError(f"topic id {topic_id} has a record but no state")
    return values.decode_state(raw)


def _metadata(ref: TopicRef, properties: Mapping[str, str]) -> TopicMetadata:
    return TopicMetadata(
        namespace=ref.namespace,
        name=ref.name,
        ttl=ref.state.ttl,
        generation=ref.state.generation,
        properties=dict(properties),
    )

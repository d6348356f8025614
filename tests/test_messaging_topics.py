"""Topic administration, name and property validation, generations, the topic cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tidings.errors import InvalidName, InvalidProperties, TopicAlreadyExists, TopicNotFound
from tidings.messaging import MessagingConfig, MessagingService
from tidings.messaging.names import MAX_TTL, normalize_properties, parse_ttl
from tidings.names import check_name
from tidings.store import Store


@pytest.fixture
def service(store: Store) -> Iterator[MessagingService]:
    s = MessagingService(store, MessagingConfig(default_ttl=3600))
    yield s
    s.close()


def test_create_get_list_delete(service: MessagingService) -> None:
    meta = service.create_topic("ns", "t1", {"ttl": 60, "owner": "me"})
    assert (meta.namespace, meta.name, meta.ttl, meta.generation) == ("ns", "t1", 60, 1)
    assert meta.properties == {"ttl": "60", "owner": "me"}
    service.create_topic("ns", "t0")
    service.create_topic("other", "t9")
    assert service.get_topic("ns", "t1") == meta
    assert service.get_topic("ns", "t0").properties == {"ttl": "3600"}
    assert service.list_topics("ns") == ["t0", "t1"]
    assert service.list_topics("empty") == []
    service.delete_topic("ns", "t1")
    assert service.list_topics("ns") == ["t0"]
    with pytest.raises(TopicNotFound):
        service.get_topic("ns", "t1")
    with pytest.raises(TopicNotFound):
        service.delete_topic("ns", "t1")


def test_create_twice_conflicts(service: MessagingService) -> None:
    service.create_topic("ns", "t")
    with pytest.raises(TopicAlreadyExists):
        service.create_topic("ns", "t", {"ttl": 5})
    assert service.get_topic("ns", "t").ttl == 3600


def test_update_replaces_all_properties(service: MessagingService) -> None:
    service.create_topic("ns", "t", {"ttl": "10", "a": "1"})
    meta = service.update_topic("ns", "t", {"b": 2})
    assert meta.properties == {"b": "2", "ttl": "3600"}
    assert meta.ttl == 3600
    assert service.get_topic("ns", "t") == meta
    with pytest.raises(TopicNotFound):
        service.update_topic("ns", "missing", {})


def test_recreate_bumps_generation_and_hides_old_messages(service: MessagingService) -> None:
    service.create_topic("ns", "t")
    service.publish("ns", "t", [b"old"])
    service.delete_topic("ns", "t")
    with pytest.raises(TopicNotFound):
        service.publish("ns", "t", [b"x"])
    with pytest.raises(TopicNotFound):
        service.fetch("ns", "t")
    meta = service.create_topic("ns", "t")
    assert meta.generation == 2
    assert service.fetch("ns", "t") == []
    service.publish("ns", "t", [b"new"])
    assert [m.payload for m in service.fetch("ns", "t")] == [b"new"]
    service.delete_topic("ns", "t")
    assert service.create_topic("ns", "t").generation == 3


def test_cache_follows_changes_made_by_another_service(store: Store) -> None:
    """Two services on one store (e.g. a restart, or an admin tool) never disagree."""
    a = MessagingService(store)
    b = MessagingService(store)
    a.create_topic("ns", "t")
    b.publish("ns", "t", [b"1"])  # b caches the topic as live
    a.delete_topic("ns", "t")
    with pytest.raises(TopicNotFound):
        b.publish("ns", "t", [b"2"])
    with pytest.raises(TopicNotFound):
        b.fetch("ns", "t")
    a.create_topic("ns", "t", {"ttl": 99})
    b.publish("ns", "t", [b"3"])  # b finds the new generation
    assert [m.payload for m in a.fetch("ns", "t")] == [b"3"]
    assert b.get_topic("ns", "t").ttl == 99


def test_topic_ids_are_not_shared(service: MessagingService) -> None:
    service.create_topic("ns", "a")
    service.create_topic("ns", "a_")
    service.create_topic("ns_", "a")
    service.publish("ns", "a", [b"1"])
    service.publish("ns", "a_", [b"2"])
    service.publish("ns_", "a", [b"3"])
    assert [m.payload for m in service.fetch("ns", "a")] == [b"1"]
    assert [m.payload for m in service.fetch("ns", "a_")] == [b"2"]
    assert [m.payload for m in service.fetch("ns_", "a")] == [b"3"]


@pytest.mark.parametrize("name", ["", "a b", "a/b", "a.b", "x" * 129, "é", None, 5])
def test_bad_names_are_rejected(service: MessagingService, name: object) -> None:
    with pytest.raises(InvalidName):
        service.create_topic("ns", name)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        service.list_topics(name)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        service.publish(name, "t", [b"x"])  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        service.fetch("ns", name)  # type: ignore[arg-type]


def test_good_names() -> None:
    for name in ["a", "A-z_0", "x" * 128]:
        assert check_name(name, "topic") == name


@pytest.mark.parametrize(
    "properties",
    [
        {"ttl": 0},
        {"ttl": -1},
        {"ttl": "abc"},
        {"ttl": "1.5"},
        {"ttl": 1.5},
        {"ttl": True},
        {"ttl": None},
        {"ttl": MAX_TTL + 1},
        {"other": 1.5},
        {"other": None},
        {"other": ["a"]},
        {"": "x"},
        {1: "x"},
    ],
)
def test_bad_properties_change_nothing(service: MessagingService, properties: object) -> None:
    with pytest.raises(InvalidProperties):
        service.create_topic("ns", "t", properties)  # type: ignore[arg-type]
    assert service.list_topics("ns") == []
    service.create_topic("ns", "t", {"ttl": 7})
    with pytest.raises(InvalidProperties):
        service.update_topic("ns", "t", properties)  # type: ignore[arg-type]
    assert service.get_topic("ns", "t").ttl == 7


def test_ttl_parsing() -> None:
    assert parse_ttl(5) == 5
    assert parse_ttl("0123") == 123
    assert normalize_properties({"ttl": "0123", "x": 4}, 9) == (123, {"ttl": "123", "x": "4"})
    assert normalize_properties(None, 9) == (9, {"ttl": "9"})
    with pytest.raises(InvalidProperties):
        parse_ttl("١٢")  # non-ASCII digits


def test_config_is_validated() -> None:
    with pytest.raises(InvalidProperties):
        MessagingConfig(default_ttl=0)
    with pytest.raises(ValueError):
        MessagingConfig(fetch_default_limit=20, fetch_max_limit=10)

"""Arguments of the transaction calls that the client cannot send are refused with the
errors the server gives for them, before anything is sent."""

from __future__ import annotations

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import AVRO_EXT, JSON, Client
from tidings.codec.media import Media
from tidings.errors import BadRequest, TimeoutTooLarge

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("bad", [1.9, True, "12", -1, 0, 2**63])
def test_the_client_refuses_write_pointers_that_are_not_64_bit_integers(
    server: ServerProcess, bad: object
) -> None:
    # A float was truncated (int(1.9) == 1): the call ended another transaction than
    # the one named, and a pointer read as a float (they are ~1.8e18) names a
    # neighbour of it.
    with Client(server.url) as client:
        open_tx = client.begin().write_pointer
        near = float(open_tx)
        before = client.transactions()
        for call in (client.abort, client.invalidate, client.commit):
            with pytest.raises(ValueError, match="write_pointer"):
                call(bad)  # type: ignore[operator]
            with pytest.raises(ValueError, match="write_pointer"):
                call(near)  # type: ignore[operator]
        after = client.transactions()
        assert open_tx in after.in_progress
        assert (after.read_pointer, after.last_write_pointer) == (
            before.read_pointer,
            before.last_write_pointer,
        )
        client.abort(open_tx)


@pytest.mark.parametrize("media", [JSON, AVRO_EXT])
def test_timeouts_and_epochs_json_cannot_carry_get_the_servers_errors(
    server: ServerProcess, topic: str, media: Media
) -> None:
    # Integers past 64 bits failed in the JSON encoder with a bare TypeError (or an
    # OverflowError), where the same call in Avro got the server's 400.
    with Client(server.url, media=media) as client:
        client.create_topic(topic)
        info = client.register_producer("s28-" + topic)
        before = client.transactions().last_write_pointer
        for timeout in (2**64, 10**30, -(10**30), 10**400):
            with pytest.raises(TimeoutTooLarge):
                client.begin(timeout)
            with pytest.raises(TimeoutTooLarge):
                client.publish_transaction({topic: [b"x"]}, timeout=timeout)
        for epoch in (2**64, -1):
            with pytest.raises(BadRequest, match="epoch"):
                client.begin(transactional_id=info.transactional_id, epoch=epoch)
        assert client.transactions().last_write_pointer == before
        tx = client.begin(transactional_id=info.transactional_id, epoch=info.epoch)
        with pytest.raises(BadRequest, match="epoch"):
            client.abort(tx, transactional_id=info.transactional_id, epoch=2**64)
        with pytest.raises(BadRequest, match="epoch"):
            client.commit(tx, transactional_id=info.transactional_id, epoch=2**64)
        assert tx.write_pointer in client.transactions().in_progress
        client.abort(tx, transactional_id=info.transactional_id, epoch=info.epoch)
        assert [m.payload for m in client.poll(topic)] == []


def test_change_keys_that_are_not_bytes_are_refused(server: ServerProcess) -> None:
    # bytes(1) is b"\x00" and iterating over b"ab" gives ints: such a commit went
    # through under change keys nobody wrote (a str failed with a bare TypeError).
    with Client(server.url) as client:
        tx = client.begin()
        for changes in ([1], b"ab", "ab", [b"k", "k"]):
            with pytest.raises(BadRequest, match="change"):
                client.commit(tx, changes)  # type: ignore[arg-type]
        assert tx.write_pointer in client.transactions().in_progress
        client.commit(tx, [b"k", bytearray(b"l"), memoryview(b"m")])


@pytest.mark.parametrize("media", [JSON, AVRO_EXT])
@pytest.mark.parametrize("bad", [2**64, 1.5, True, 0, -5])
def test_publish_and_store_refuse_write_pointers_that_are_not_64_bit_integers(
    server: ServerProcess, topic: str, media: Media, bad: object
) -> None:
    # Avro's writer failed with a bare struct.error on a float or a pointer past 64
    # bits (JSON's with a TypeError), and True stored payloads under pointer 1.
    with Client(server.url, media=media) as client:
        client.create_topic(topic)
        for call in (
            lambda: client.publish(topic, b"x", write_pointer=bad),  # type: ignore[arg-type]
            lambda: client.store(topic, [b"x"], write_pointer=bad),  # type: ignore[arg-type]
        ):
            with pytest.raises(ValueError, match="write_pointer"):
                call()
        assert client.stats(topic).message_count == 0
        assert [m.payload for m in client.poll(topic)] == []

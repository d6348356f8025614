"""The CPU a page of a poll costs in each answer medium, on each side, without HTTP.

Server side: ``MessagingService.fetch_encoded`` (Avro items straight from the store rows)
against ``fetch_columns`` (the columnar answer), on an LMDB store in this process.
Client side: decoding that answer into messages (``wire.decode_messages``, what
``poll()`` returns), and iterating it as a consumer does (``wire.iterate_messages``,
each message let go before the next; columns are made one at a time). Pages of
10,000 messages of 100 B and 1 KiB, as the consumers and the Spark readers fetch them.

    python -m benchmarks.poll_media [--repeat 5] [--msgspec]

Prints the best of ``--repeat`` runs of each case in µs per message, and the ratio.

With ``--msgspec`` (``pip install msgspec``; not a dependency of Tidings) it also
iterates the same page sent as MessagePack and decoded by msgspec, in C, into the
client's ``Message`` and ``MessageId`` NamedTuples (with the collector running, and
paused for the whole page), and into msgspec Structs with collection off: the issue's
question whether msgspec would decode a consumer's pages faster than the columns do.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tidings.codec import wire
from tidings.messaging import MessagingService
from tidings.store import LmdbStore

PAGE = 10_000


def _best(fn: Callable[[], Any], repeat: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - started) / rounds)
    return best / PAGE * 1e6


def _iterate(body: bytes, media: wire.Media) -> None:
    """What iterating a consumer does with a page: take each message and let it go
    (the collector running, as in an application)."""
    for _ in wire.iterate_messages(body, media).messages:
        pass


def _msgspec_cases(column_body: bytes, size: int) -> list[tuple[str, Callable[[], Any]]]:
    """Iterating one page decoded by msgspec from MessagePack, three ways."""
    import gc

    import msgspec

    from tidings.structs import Message

    # Made with defstruct: this module's annotations are strings, which msgspec could
    # not resolve for classes local to a function.
    struct_id = msgspec.defstruct(
        "StructId",
        [("publish_ts", int), ("seq", int), ("write_ts", int), ("p_seq", int)],
        array_like=True,
        gc=False,
        frozen=True,
    )
    struct_message = msgspec.defstruct(
        "StructMessage", [("id", struct_id), ("payload", bytes)], array_like=True, gc=False
    )

    messages = wire.decode_messages(column_body, wire.COLUMNS)
    body = msgspec.msgpack.encode([(tuple(m.id), m.payload) for m in messages])
    as_tuples = msgspec.msgpack.Decoder(list[Message])
    as_structs = msgspec.msgpack.Decoder(list[struct_message])  # type: ignore[valid-type]
    assert as_tuples.decode(body)[:3] == messages[:3]

    def tuples() -> None:
        for _ in as_tuples.decode(body):
            pass

    def tuples_paused() -> None:
        gc.disable()
        try:
            for _ in as_tuples.decode(body):
                pass
        finally:
            gc.enable()

    def structs() -> None:
        for _ in as_structs.decode(body):
            pass

    return [
        (f"msgspec: NamedTuples, {size} B", tuples),
        (f"msgspec: NamedTuples, gc off, {size} B", tuples_paused),
        (f"msgspec: Structs gc=False, {size} B", structs),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--msgspec", action="store_true", help="also iterate pages decoded by msgspec"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        service = MessagingService(LmdbStore(os.path.join(where, "data")))
        print(f"{'case':40s} {'Avro ext':>10s} {'columns':>10s} {'ratio':>7s}")
        for size in (100, 1024):
            topic = f"t{size}"
            service.create_topic("bench", topic)
            batch = [os.urandom(size) for _ in range(500)]
            for _ in range(PAGE // 500):
                service.publish("bench", topic, batch)
            avro_body, _, _ = service.fetch_encoded("bench", topic, wire.AVRO_EXT, limit=PAGE)
            column_body, count, _ = service.fetch_columns("bench", topic, limit=PAGE)
            assert count == PAGE
            assert wire.decode_messages(avro_body, wire.AVRO_EXT) == wire.decode_messages(
                column_body, wire.COLUMNS
            )
            cases = [
                (
                    f"server: fetch a page, {size} B (µs/msg)",
                    lambda t=topic: service.fetch_encoded("bench", t, wire.AVRO_EXT, limit=PAGE),
                    lambda t=topic: service.fetch_columns("bench", t, limit=PAGE),
                ),
                (
                    f"client: decode the page, {size} B (µs/msg)",
                    lambda b=avro_body: wire.decode_messages(b, wire.AVRO_EXT),
                    lambda b=column_body: wire.decode_messages(b, wire.COLUMNS),
                ),
                (
                    f"client: iterate the page, {size} B (µs/msg)",
                    lambda b=avro_body: _iterate(b, wire.AVRO_EXT),
                    lambda b=column_body: _iterate(b, wire.COLUMNS),
                ),
            ]
            for name, avro_case, column_case in cases:
                a = _best(avro_case, args.repeat)
                c = _best(column_case, args.repeat)
                print(f"{name:40s} {a:10.3f} {c:10.3f} {c / a:7.2f}")
            if args.msgspec:
                iterate = _best(lambda b=column_body: _iterate(b, wire.COLUMNS), args.repeat)
                print(f"{'case':40s} {'columns':>10s} {'msgspec':>10s} {'ratio':>7s}")
                for name, case in _msgspec_cases(column_body, size):
                    m = _best(case, args.repeat)
                    # Columns: iterating the columnar page; then msgspec's, and the ratio.
                    print(f"{name:40s} {iterate:10.3f} {m:10.3f} {m / iterate:7.2f}")
        service.close()


if __name__ == "__main__":
    main()

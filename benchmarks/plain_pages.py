"""What the server spends on a columnar page of plain messages, in one process.

W2's data (``--messages`` 100 B messages and a quarter as many of 1 KiB, published in
batches of 500 into an LMDB store) read through in pages of ``--page``, as a
read-committed poll reads them:

- plain pages: ``MessagingService.fetch_columns``, which takes each batch entry whole
  (``tidings/messaging/plain_pages.py``);
- the general reader: ``fetch_page_columns(...).encode()``, the path every other page
  takes (a slice and an id per message into ``PageColumns``, then the body).

Both bodies are checked equal first. Each figure is the best of ``--rounds`` reads of
the whole topic, in CPU µs per message.

    python -m benchmarks.plain_pages [--messages 200000] [--page 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

from tidings.messaging import MessagingService
from tidings.store import LmdbStore
from tidings.structs import MessageId, Transaction

Read = Callable[[MessageId | None, bool], tuple[bytes, MessageId | None]]


def _read_through(read: Read) -> None:
    """Page through the topic with ``read(start, inclusive)``, each page after the last."""
    start: MessageId | None = None
    inclusive = True
    while True:
        _, last = read(start, inclusive)
        if last is None:
            return
        start, inclusive = last, False


def _cpu_per_message(read: Read, messages: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        _read_through(read)
        best = min(best, time.process_time() - started)
    return best / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--page", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    snapshot = Transaction(read_pointer=1, write_pointer=2)  # read-committed, as W2
    with tempfile.TemporaryDirectory() as where:
        store = LmdbStore(os.path.join(where, "store"))
        service = MessagingService(store)
        try:
            for topic, size, count in (
                ("small", 100, args.messages),
                ("large", 1024, args.messages // 4),
            ):
                service.create_topic("ns", topic)
                batch = [os.urandom(size) for _ in range(500)]
                for _ in range(count // 500):
                    service.publish("ns", topic, batch)

                def plain(
                    start: MessageId | None, inclusive: bool, t: str = topic
                ) -> tuple[bytes, MessageId | None]:
                    body, _, last = service.fetch_columns(
                        "ns", t, start=start, inclusive=inclusive, limit=args.page,
                        transaction=snapshot,
                    )  # fmt: skip
                    return body, last

                def general(
                    start: MessageId | None, inclusive: bool, t: str = topic
                ) -> tuple[bytes, MessageId | None]:
                    columns = service.fetch_page_columns(
                        "ns", t, start=start, inclusive=inclusive, limit=args.page,
                        transaction=snapshot,
                    )  # fmt: skip
                    last = MessageId.from_bytes(columns.ids[-1]) if columns.ids else None
                    return columns.encode(), last

                assert plain(None, True) == general(None, True)
                total = count // 500 * 500
                fast = _cpu_per_message(plain, total, args.rounds)
                slow = _cpu_per_message(general, total, args.rounds)
                print(
                    f"{count:,} x {size} B, pages of {args.page:,}: plain pages {fast:.3f} "
                    f"µs/msg, the general reader {slow:.3f} µs/msg ({slow / fast:.1f}x)"
                )
        finally:
            service.close()
            store.close()


if __name__ == "__main__":
    main()

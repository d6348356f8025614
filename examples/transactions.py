"""Change your own state and announce it, exactly once or not at all.

A toy key-value table takes part in a Tidings transaction next to the messaging
publisher: its writes and the messages commit together, and a
write conflict or a failure rolls both back. A read-committed consumer only ever sees
the messages of committed transactions.

Run a server first (``tidings serve``), then::

    python examples/transactions.py --url http://127.0.0.1:8470
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterable

import tidings
from tidings import Transaction, TransactionConflict


class Table:
    """A TransactionAware key-value table: writes are staged, applied at commit."""

    name = "table"

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self._staged: dict[str, int] = {}

    def put(self, key: str, value: int) -> None:
        self._staged[key] = value

    # --- TransactionAware ---

    def start(self, transaction: Transaction) -> None:
        self._staged = {}

    def changes(self) -> Iterable[bytes]:
        # Two transactions that write the same key conflict at commit.
        return [key.encode() for key in self._staged]

    def commit(self) -> None:
        pass  # a real store would persist the staged rows, tagged with the write pointer

    def post_commit(self) -> None:
        self.rows.update(self._staged)
        self._staged = {}

    def rollback(self) -> None:
        self._staged = {}


def main(url: str) -> None:
    topic = "balances-" + uuid.uuid4().hex[:8]
    table = Table()
    with tidings.Client(url) as client:
        client.create_topic(topic)

        # 1. State change and notification commit together.
        with client.transaction(table) as tx:
            table.put("alice", 100)
            tx.publish(topic, b"alice: 100")
        print("committed:", table.rows)

        # 2. An exception rolls both back.
        try:
            with client.transaction(table) as tx:
                table.put("alice", -5)
                tx.publish(topic, b"alice: -5")
                raise ValueError("balances may not go negative")
        except ValueError as exc:
            print("rolled back:", exc, table.rows)

        # 3. Two concurrent writers of one key: the second to commit conflicts.
        replica = Table()
        first, second = client.transaction(table), client.transaction(replica)
        first.start()
        second.start()
        table.put("alice", 120)
        first.publish(topic, b"alice: 120")
        replica.put("alice", 1)
        second.publish(topic, b"alice: 1 (loses)")
        first.finish()
        try:
            second.finish()
        except TransactionConflict as exc:
            print("conflict, rolled back:", exc)

        # 4. Several topics at once, all or nothing.
        audit = topic + "-audit"
        client.create_topic(audit)
        with client.transaction() as tx:
            tx.publish(topic, b"carol: 5")
            tx.publish(audit, b"carol opened an account")

        committed = [m.payload.decode() for m in client.consume(topic, follow=False)]
        everything = [
            m.payload.decode() for m in client.consume(topic, transactional=False, follow=False)
        ]
        print("read-committed consumer sees:  ", committed)
        print("read-uncommitted consumer sees:", everything)
        client.delete_topic(topic)
        client.delete_topic(audit)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470", help="the server's URL")
    try:
        main(parser.parse_args().url)
    except tidings.TidingsError as exc:
        # No server at --url (not started yet, say) is one line, not a traceback.
        raise SystemExit(f"Error: {type(exc).__name__}: {exc}") from None

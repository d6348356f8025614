"""Consume-transform-produce exactly once through a consumer group.

Two workers share group "billing" of topic "orders": each gets the orders of its keys
(customers), in order, and for each batch publishes invoices and commits its position
in the same transaction, so an invoice exists if and only if its order counts as
consumed. Run a server first (``tidings serve``), then::

    python examples/consumer_group.py --url http://127.0.0.1:8470
"""

from __future__ import annotations

import argparse
import uuid

import tidings


def main(url: str) -> None:
    orders, invoices = "orders-" + uuid.uuid4().hex[:8], "invoices-" + uuid.uuid4().hex[:8]
    with tidings.Client(url) as client:
        client.create_topic(orders)
        client.create_topic(invoices)
        client.publish(
            orders,
            [
                tidings.Record(f"order {i}".encode(), f"customer-{i % 4}".encode())
                for i in range(20)
            ],
        )

        # Two members of one group: the topic's keys are split between them.
        workers = [client.consume(orders, group="billing", follow=False) for _ in range(2)]
        for worker in workers:
            worker.heartbeat()  # join (a rebalance each)
        for worker in workers:
            batch = worker.poll()
            with client.transaction() as tx:
                tx.publish(invoices, [b"invoice for " + m.payload for m in batch])
                worker.commit(transaction=tx)  # the position moves iff tx commits
            keys = sorted({m.key.decode() for m in batch if m.key})
            print(f"worker {worker.member_id[:6]}: {len(batch)} orders of {', '.join(keys)}")
        for worker in workers:
            worker.close()

        print(f"invoices: {len(client.poll(invoices, limit=100))}")
        info = client.describe_group(orders, "billing")
        print(f"group billing: generation {info.generation}, lag {info.lag}")
        client.delete_topic(orders)
        client.delete_topic(invoices)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470", help="the server's URL")
    try:
        main(parser.parse_args().url)
    except tidings.TidingsError as exc:
        # No server at --url (not started yet, say) is one line, not a traceback.
        raise SystemExit(f"Error: {type(exc).__name__}: {exc}") from None

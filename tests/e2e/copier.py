"""An exactly-once copier for the crash tests: consume a topic through a consumer
group, publish each batch to another topic and commit the group's position in the
same transaction. Run as ``python -m tests.e2e.copier URL INPUT OUTPUT GROUP``; it
copies until killed (or until nothing new came for ``--idle`` seconds)."""

from __future__ import annotations

import argparse
import sys
import time

from tidings import Client, Record
from tidings.errors import TidingsError


def copy(url: str, source: str, target: str, group: str, idle: float) -> int:
    last_data = time.monotonic()
    while time.monotonic() - last_data < idle:
        try:
            with Client(url, timeout=5.0) as client:
                consumer = client.consume(
                    source, group=group, batch_size=50, wait=0.5, session_timeout=1.0
                )
                while time.monotonic() - last_data < idle:
                    batch = consumer.poll()
                    if not batch:
                        continue
                    last_data = time.monotonic()
                    with client.transaction() as tx:
                        tx.publish(target, [Record(m.payload, m.key) for m in batch])
                        consumer.commit(transaction=tx)
        except (TidingsError, OSError) as exc:
            # The server restarted or the transaction was fenced: start over as a new
            # member; what was not committed is delivered again.
            print(f"copier: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.2)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("group")
    parser.add_argument("--idle", type=float, default=3600.0)
    args = parser.parse_args()
    return copy(args.url, args.source, args.target, args.group, args.idle)


if __name__ == "__main__":
    sys.exit(main())

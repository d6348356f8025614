"""A queue worker for the crash tests. Run as
``python -m tests.e2e.queue_worker URL INPUT QUEUE MODE [OUTPUT]``:

- ``ack``: pop, append each payload to stdout (one line each, flushed), ack;
- ``copy``: pop, publish each payload upper-cased to OUTPUT and ack, in one transaction;
- ``hold``: pop once, print the count, then sleep holding the leases (to be killed).

It works until killed, or until nothing came for ``--idle`` seconds. With ``--go FILE``
it starts popping only once FILE exists (so that workers started one after another
compete from the same moment), and with ``--pace SECONDS`` it spends that long on each
batch, as a worker doing real work would.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tidings import Client
from tidings.errors import TidingsError


def work(
    url: str,
    source: str,
    queue: str,
    mode: str,
    target: str | None,
    idle: float,
    pace: float = 0.0,
) -> None:
    last_data = time.monotonic()
    while time.monotonic() - last_data < idle:
        try:
            with Client(url, timeout=5.0) as client:
                q = client.queue(source, queue, ack_timeout=2.0)
                while time.monotonic() - last_data < idle:
                    batch = q.pop(20, wait=0.5)
                    if not batch:
                        continue
                    last_data = time.monotonic()
                    if mode == "hold":
                        print(len(batch), flush=True)
                        time.sleep(3600)
                    elif mode == "ack":
                        sys.stdout.write("".join(m.payload.decode() + "\n" for m in batch))
                        sys.stdout.flush()
                        time.sleep(pace)
                        q.ack(batch)
                    else:
                        assert target is not None
                        with client.transaction() as tx:
                            tx.publish(target, [m.payload.upper() for m in batch])
                            q.ack(batch, transaction=tx)
        except (TidingsError, OSError) as exc:
            # The server restarted, or a lease passed to another worker: start over;
            # what was not acked is delivered again.
            print(f"worker: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("source")
    parser.add_argument("queue")
    parser.add_argument("mode", choices=["ack", "copy", "hold"])
    parser.add_argument("target", nargs="?")
    parser.add_argument("--idle", type=float, default=3600.0)
    parser.add_argument("--go", type=Path)
    parser.add_argument("--pace", type=float, default=0.0)
    args = parser.parse_args()
    if args.go is not None:
        waited = time.monotonic() + 60
        while not args.go.exists() and time.monotonic() < waited:
            time.sleep(0.01)
    work(args.url, args.source, args.queue, args.mode, args.target, args.idle, args.pace)
    return 0


if __name__ == "__main__":
    sys.exit(main())

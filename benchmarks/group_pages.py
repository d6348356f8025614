"""What the server spends on group members' polls, in one process, without HTTP.

The groups benchmark's data (``--messages`` keyed 100 B messages, keys over 1,000
values, published in batches of 500 into an LMDB store), read by ``--members`` members
of a new group of 32 partitions polling in turn, ``--limit`` messages per poll, as the
server's poll endpoint serves them: ``GroupCoordinator.poll_columns`` (the scan: pages
fetched once for all members, each member's rows of them) and the columnar answer's
encoding. Each round is a new group (and new kept pages); the figures are CPU µs per
message delivered, per round: scan + encode.

    python -m benchmarks.group_pages [--messages 200000] [--members 4] [--limit 10000]
        [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tidings.consumers.groups import GroupCoordinator
from tidings.messaging import MessagingService
from tidings.store import LmdbStore
from tidings.structs import Record
from tidings.tx import TransactionManager, TxConfig


def _round(
    groups: GroupCoordinator, tx: TransactionManager, group: str, members: int, limit: int
) -> tuple[float, float, int]:
    ids = [groups.join("ns", "t", group, partitions=32).member_id for _ in range(members)]
    scan = encode = 0.0
    delivered = 0
    live = list(ids)
    while live:
        for member in list(live):
            snapshot = tx.snapshot()
            assert snapshot is not None
            began = time.process_time()
            rows, _, _ = groups.poll_columns(
                "ns", "t", group, member, limit=limit, snapshot=snapshot
            )
            scanned = time.process_time()
            if not rows:
                live.remove(member)
                continue
            rows.encode()
            encode += time.process_time() - scanned
            scan += scanned - began
            delivered += len(rows)
    return scan, encode, delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--limit", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = LmdbStore(str(Path(tmp) / "store"))
        messaging = MessagingService(store)
        messaging.create_topic("ns", "t")
        payload = os.urandom(100)
        for start in range(0, args.messages, 500):
            n = min(500, args.messages - start)
            records = [Record(payload, f"k{(start + i) % 1000}".encode()) for i in range(n)]
            messaging.publish("ns", "t", records)
        figures = []
        with TransactionManager(Path(tmp) / "tx", TxConfig(sweep_interval=3600)) as tx:
            for r in range(args.rounds):
                groups = GroupCoordinator(store, messaging, tx)  # pages kept afresh
                scan, encode, delivered = _round(groups, tx, f"g{r}", args.members, args.limit)
                assert delivered == args.messages, delivered
                figures.append(f"{scan / delivered * 1e6:.3f} + {encode / delivered * 1e6:.3f}")
        store.close()
    print(f"{args.members} members, {args.limit} per poll: scan + encode, CPU µs per message")
    print("  " + "   ".join(figures))


if __name__ == "__main__":
    main()

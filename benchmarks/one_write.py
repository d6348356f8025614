"""One-request transactions in process, without HTTP: two durable writes (the publish,
then the commit in the transaction log) against one (the commit decided in the
publish's store write, ``TransactionManager.commit_in_write``), alternating blocks in
one process so the machine's drift hits both alike.

    python -m benchmarks.one_write                       # LMDB, 1 and 8 in flight
    python -m benchmarks.one_write --postgres            # also a throwaway PostgreSQL

Each transaction: begin, 5 x 100 B to each of 2 topics in one store write, commit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tidings.messaging import MessagingService
from tidings.store.backend import Store
from tidings.store.backends.lmdb import LmdbStore
from tidings.tx import TransactionManager, TxConfig

_FIVE = [b"x" * 100] * 5
_BATCHES: list[tuple[str, list[bytes]]] = [("a", _FIVE), ("b", _FIVE)]


def _two(messaging: MessagingService, tx: TransactionManager, n: int) -> None:
    for _ in range(n):
        wp = tx.begin_future().result().write_pointer
        messaging.publish_all_future("ns", _BATCHES, wp).result()
        tx.commit_future(wp).result()


def _one(messaging: MessagingService, tx: TransactionManager, n: int) -> None:
    for _ in range(n):
        wp = tx.begin_future().result().write_pointer
        step = tx.commit_in_write(wp)
        assert step is not None
        write = messaging.publish_all_future("ns", _BATCHES, wp, then=step)
        try:
            step.watch(write).result()
        except Exception:
            if not step.deferred:
                raise
            # The log was rotating: the two-write way, as the server does.
            messaging.publish_all_future("ns", _BATCHES, wp).result()
            tx.commit_future(wp).result()


def _bound(
    fn: Callable[[MessagingService, TransactionManager, int], None],
    messaging: MessagingService,
    tx: TransactionManager,
) -> Callable[[int], None]:
    return lambda n: fn(messaging, tx, n)


def _rate(fn: Callable[[int], None], per: int, threads: int) -> float:
    workers = [threading.Thread(target=fn, args=(per,)) for _ in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return per * threads / (time.perf_counter() - started)


def run(name: str, store: Store, tx: TransactionManager, rounds: int, per: int) -> None:
    messaging = MessagingService(store)
    tx.start()
    messaging.guard_publishes(tx.check_writable)
    messaging.create_topic("ns", "a")
    messaging.create_topic("ns", "b")
    try:
        for threads in (1, 8):
            each = max(1, per // threads)
            rates: dict[str, list[float]] = {"two writes": [], "one write": []}
            for r in range(rounds):
                order = ["two writes", "one write"]
                for kind in order if r % 2 == 0 else order[::-1]:
                    paths = {"two writes": _two, "one write": _one}
                    rates[kind].append(_rate(_bound(paths[kind], messaging, tx), each, threads))
            for kind, values in rates.items():
                print(
                    f"{name}, {threads} in flight, {kind}: median "
                    f"{statistics.median(values):,.0f} tx/s  "
                    f"({', '.join(f'{v:,.0f}' for v in values)})",
                    flush=True,
                )
    finally:
        tx.close()
        messaging.close()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=400, help="transactions per block")
    parser.add_argument("--postgres", action="store_true", help="also over PostgreSQL")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidings-one-write-"))
    store = LmdbStore(str(root / "store"))
    run("LMDB", store, TransactionManager(root / "tx", TxConfig(), message_store=store),
        args.rounds, args.per_round)  # fmt: skip
    if args.postgres:
        from benchmarks.vs_postgres import PgCluster
        from tidings.store.backends.postgres import PostgresStore

        cluster = PgCluster()
        try:
            pg = PostgresStore(cluster.dsn)
            run("PostgreSQL store", pg, TransactionManager(None, TxConfig(), store=pg),
                args.rounds, args.per_round // 2)  # fmt: skip
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()

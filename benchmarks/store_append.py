"""Append throughput of LmdbStore: 100-byte rows in batches of 500, one apply() per batch.

Each writer thread appends to its own key range (like one topic each) and waits for
every batch to be durable before writing the next, as a publisher does. With several
threads, group commit merges their batches into shared commits. Prints rows/s per case.

    PYTHONPATH=. python benchmarks/store_append.py --seconds 3   # from the repository root
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from tidings.store import LmdbStore


def run_case(
    sync: bool,
    threads: int,
    seconds: float,
    batch: int,
    row_size: int,
    where: str | None,
    append: bool = False,
) -> str:
    value = bytes(row_size)
    rows = [0] * threads
    with tempfile.TemporaryDirectory(prefix="tidings-bench-", dir=where) as tmp:
        store = LmdbStore(tmp, sync=sync)
        deadline = time.perf_counter() + seconds

        def writer(n: int) -> None:
            prefix = n.to_bytes(4, "big")
            while time.perf_counter() < deadline:
                base = rows[n]
                items = [(prefix + (base + i).to_bytes(8, "big"), value) for i in range(batch)]
                store.apply(
                    lambda view, items=items: view.put_many("messages", items, append=append)
                )
                rows[n] += batch

        started = time.perf_counter()
        workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
        commits = store.commits
        store.close()
    total = sum(rows)
    return (
        f"sync={'on ' if sync else 'off'} threads={threads} append={'on ' if append else 'off'} "
        f"{total / elapsed:>10,.0f} rows/s  {total / batch / elapsed:>8,.0f} batches/s  "
        f"{commits / elapsed:>7,.0f} commits/s  "
        f"{total / batch / max(commits, 1):5.2f} batches/commit"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each case")
    parser.add_argument("--batch", type=int, default=500, help="rows per apply()")
    parser.add_argument("--row-size", type=int, default=100, help="value bytes per row")
    parser.add_argument("--threads", default="1,4", help="writer thread counts, comma-separated")
    parser.add_argument("--dir", help="where to create the stores (default: the temp dir)")
    parser.add_argument(
        "--append",
        action="store_true",
        help="also run with put_many(append=True) (one writer's keys follow the table's)",
    )
    args = parser.parse_args()
    for sync in (True, False):
        for threads in (int(t) for t in args.threads.split(",")):
            for append in (False, True) if args.append else (False,):
                line = run_case(
                    sync, threads, args.seconds, args.batch, args.row_size, args.dir, append
                )
                print(line, flush=True)


if __name__ == "__main__":
    main()

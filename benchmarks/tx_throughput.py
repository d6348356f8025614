"""Throughput of begin+commit pairs through the durable transaction manager, in process.

    python benchmarks/tx_throughput.py                    # 1 and 8 threads, fsync on
    python benchmarks/tx_throughput.py --threads 1 4 8 16 --seconds 5
    python benchmarks/tx_throughput.py --no-sync          # the documented relaxation
    python benchmarks/tx_throughput.py --volatile         # no log at all (CPU ceiling)

Each thread loops ``begin(); commit(wp)`` (a pair is two durable log records, so two
waits for a group commit) for the given time against a fresh data directory, by default
in a temporary directory on the same disk as the system's temp dir (``--dir`` to choose).
Reports pairs per second and the latency of a pair.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidings.tx import TransactionManager, TxConfig


def run(data_dir: str | None, threads: int, seconds: float, sync: bool) -> dict[str, float]:
    config = TxConfig(sync=sync, sweep_interval=1.0)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = threading.Event()
    with TransactionManager(data_dir, config) as manager:

        def work(mine: list[float]) -> None:
            while not stop.is_set():
                start = time.perf_counter()
                tx = manager.begin()
                manager.commit(tx.write_pointer)
                mine.append(time.perf_counter() - start)

        pool = [threading.Thread(target=work, args=(lat,)) for lat in latencies]
        began = time.perf_counter()
        for t in pool:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - began
    every = sorted(x for lat in latencies for x in lat)
    return {
        "pairs_per_s": len(every) / elapsed,
        "p50_ms": statistics.median(every) * 1e3,
        "p99_ms": every[int(len(every) * 0.99)] * 1e3,
        "pairs": len(every),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--dir", help="parent directory for the data (default: temp dir)")
    parser.add_argument("--no-sync", action="store_true", help="TxConfig(sync=False)")
    parser.add_argument("--volatile", action="store_true", help="data_dir=None (no log)")
    args = parser.parse_args()

    mode = "volatile" if args.volatile else ("durable, no fsync" if args.no_sync else "durable")
    print(f"begin+commit pairs, in process, {mode}, {os.cpu_count()} CPUs")
    print(f"{'threads':>7} {'pairs/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'pairs':>8}")
    for threads in args.threads:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="tx-bench-") as tmp:
            data_dir = None if args.volatile else tmp
            r = run(data_dir, threads, args.seconds, sync=not args.no_sync)
        print(
            f"{threads:>7} {r['pairs_per_s']:>10.0f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {r['pairs']:>8.0f}"
        )


if __name__ == "__main__":
    main()

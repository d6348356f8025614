"""One instance against two on one PostgreSQL: throughput and CPU per message.

Starts a throwaway PostgreSQL cluster, then for each shape a fresh database and its
instances: ``1`` (clients all on the leader) and ``2`` (half the clients on the
instance standing by, which forwards to the leader). Beside them: one instance on LMDB
(no ``--store``), and PostgreSQL used directly in two ways, each with as many
connections as publishes in flight and one COMMIT per batch: the issue's INSERT
batches (one ``INSERT ... VALUES`` of the batch's 500 rows, binary parameters) and a
binary ``COPY`` of each batch. The workload is W1: 100-byte messages in batches of
500, ``--concurrency`` publishes in flight, durable. Reported: messages per second,
CPU-seconds per 100,000 messages of each Tidings process and of PostgreSQL (every
``postgres`` process), read from /proc before and after, and one instance's rate as a
fraction of each direct rate of the same round. On a 2-core machine the machine is
the limit; the CPU figures say what each part costs.

With two instances it also measures how soon a long-poll through the standby wakes
after a publish through the leader commits (``--wakes`` trials, one at a time).

    python -m benchmarks.instances [--messages 100000] [--concurrency 8] [--rounds 2]
                                   [--wakes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg

from benchmarks.vs_postgres import PgCluster, _free_port
from tidings import AsyncClient, MessageId
from tidings.errors import TopicAlreadyExists

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of ``pid`` so far (and of its reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / _TICK


def _postgres_cpu() -> float:
    # Every live postgres process, plus what the postmaster's reaped children (the
    # backends of closed connections) used.
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    total += _cpu(int(entry.name), children=True)
            except OSError:
                continue
    return total


class Node:
    """A ``tidings serve`` on the shared database (``dsn`` None: on LMDB in a data
    directory of its own)."""

    def __init__(self, dsn: str | None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data = tempfile.mkdtemp(prefix="tidings-inst-")
        cmd = [sys.executable, "-m", "tidings", "serve", "--port", str(self.port),
               "--data-dir", data, *(["--store", dsn] if dsn else [])]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("an instance did not start")
            time.sleep(0.05)

    def status(self) -> str:
        return str(httpx.get(self.url + "/readyz", timeout=2).json()["status"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def _publish(urls: list[str], messages: int, concurrency: int) -> float:
    batches = messages // 500
    clients = [AsyncClient(url) for url in urls]
    try:
        await clients[0].create_topic("w1")
        payload = [b"x" * 100] * 500
        queue: asyncio.Queue[int] = asyncio.Queue()
        for n in range(batches):
            queue.put_nowait(n)

        async def worker(client: AsyncClient) -> None:
            while not queue.empty():
                queue.get_nowait()
                await client.publish("w1", payload)

        began = time.perf_counter()
        await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(concurrency)))
        return batches * 500 / (time.perf_counter() - began)
    finally:
        for client in clients:
            await client.close()


def _wakes(leader: str, standby: str, trials: int) -> str:
    """p50/p99/max milliseconds from sending a publish through ``leader`` to the answer
    of a long-poll parked on ``standby`` (which forwards it to the leader), beside the
    publish's own round trip (its durable write is part of both); ``standby`` may be the
    leader itself, for comparison."""
    from tidings import Client

    waits: list[float] = []
    publishes: list[float] = []
    with Client(leader) as lead, Client(standby) as stand:
        with contextlib.suppress(TopicAlreadyExists):
            lead.create_topic("wake")
        lead.publish("wake", [b"first"])
        for _ in range(trials):
            last = lead.poll("wake", limit=10_000)[-1].id  # a few hundred at most
            woke: list[float] = []

            def wait(after: MessageId = last, woke: list[float] = woke) -> None:
                page = stand.poll("wake", start=after, inclusive=False, wait=10.0)
                woke.append(time.perf_counter() if page else float("nan"))

            waiter = threading.Thread(target=wait)
            waiter.start()
            time.sleep(0.2)  # the long-poll is parked on the leader by now
            sent = time.perf_counter()
            lead.publish("wake", [b"wake"])
            publishes.append((time.perf_counter() - sent) * 1000)
            waiter.join(15)
            waits.append((woke[0] - sent) * 1000 if woke else float("nan"))
    waits.sort()
    p50, p99 = waits[len(waits) // 2], waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    where = "the leader" if standby == leader else "the standby"
    return (
        f"publish through the leader -> long-poll through {where} answered: "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {waits[-1]:.1f} ms ({trials} trials; "
        f"the publish's own round trip p50 {sorted(publishes)[len(publishes) // 2]:.1f} ms)"
    )


def run_direct(cluster: PgCluster, args: argparse.Namespace, n: int, how: str) -> float:
    """The same workload on PostgreSQL used directly: ``--concurrency`` connections,
    each writing a batch of 500 rows and committing it (default durability), the batch
    written by ``how``: ``insert`` (one ``INSERT`` of all 500 rows) or ``copy`` (one
    binary ``COPY``). Prints a line; returns msg/s."""
    db = f"direct_{how}_{n}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = cluster.dsn.rsplit("/", 1)[0] + "/" + db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE w1 (id bigserial PRIMARY KEY, payload bytea NOT NULL)")
    batches = args.messages // 500
    left = list(range(batches))
    lock = threading.Lock()
    payload = b"x" * 100
    rows = [(payload,)] * 500
    insert = "INSERT INTO w1 (payload) VALUES " + ", ".join(["(%b)"] * len(rows))

    def work() -> None:
        with psycopg.connect(dsn) as conn:
            while True:
                with lock:
                    if not left:
                        return
                    left.pop()
                with conn.cursor() as cur:
                    if how == "insert":
                        cur.execute(insert, [payload] * len(rows))
                    else:
                        with cur.copy("COPY w1 (payload) FROM STDIN") as copy:
                            for row in rows:
                                copy.write_row(row)
                conn.commit()

    before = _postgres_cpu()
    began = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = batches * 500 / (time.perf_counter() - began)
    pg = (_postgres_cpu() - before) * 100_000 / args.messages
    name = {"insert": "INSERT batches", "copy": "COPY"}[how]
    print(
        f"PostgreSQL directly ({name}): {rate:,.0f} msg/s; "
        f"CPU-s per 100k msgs: PostgreSQL {pg:.2f}",
        flush=True,
    )
    return rate


def run_shape(cluster: PgCluster, shape: int, args: argparse.Namespace, n: int) -> float:
    db = f"inst{shape}_{n}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = cluster.dsn.rsplit("/", 1)[0] + "/" + db
    nodes = [Node(dsn)]
    if shape == 2:
        nodes.append(Node(dsn))
        assert nodes[1].status() == "forwarding"
    try:
        before = [_cpu(node.proc.pid) for node in nodes], _postgres_cpu()
        rate = asyncio.run(_publish([node.url for node in nodes], args.messages, args.concurrency))
        after = [_cpu(node.proc.pid) for node in nodes], _postgres_cpu()
        wakes = ""
        if shape == 2 and args.wakes:
            wakes = "\n".join(_wakes(nodes[0].url, node.url, args.wakes) for node in nodes)
    finally:
        for node in nodes:
            node.stop()
    per = 100_000 / args.messages
    parts = [f"{(a - b) * per:.2f}" for a, b in zip(after[0], before[0], strict=True)]
    pg = (after[1] - before[1]) * per
    names = ["leader", "forwarder"][: len(parts)]
    cpu = ", ".join(f"{name} {value}" for name, value in zip(names, parts, strict=True))
    print(
        f"{shape} instance(s): {rate:,.0f} msg/s; CPU-s per 100k msgs: {cpu}, PostgreSQL {pg:.2f}",
        flush=True,
    )
    if wakes:
        print(wakes, flush=True)
    return rate


def run_lmdb(args: argparse.Namespace) -> float:
    """The same workload on one instance on its embedded store (LMDB), for the same
    run's comparison. Prints a line; returns msg/s."""
    node = Node(None)
    try:
        before = _cpu(node.proc.pid)
        rate = asyncio.run(_publish([node.url], args.messages, args.concurrency))
        used = (_cpu(node.proc.pid) - before) * 100_000 / args.messages
    finally:
        node.stop()
    print(f"1 instance on LMDB: {rate:,.0f} msg/s; CPU-s per 100k msgs: {used:.2f}", flush=True)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--wakes", type=int, default=50, help="long-poll wake trials (0: none)")
    args = parser.parse_args()
    cluster = PgCluster()
    try:
        for n in range(args.rounds):
            direct = {how: run_direct(cluster, args, n, how) for how in ("insert", "copy")}
            one = run_shape(cluster, 1, args, n)
            run_shape(cluster, 2, args, n)
            lmdb = run_lmdb(args)
            print(
                f"one instance / PostgreSQL directly: {one / direct['insert']:.2f} of INSERT "
                f"batches, {one / direct['copy']:.2f} of COPY; one instance on LMDB / "
                f"INSERT batches: {lmdb / direct['insert']:.2f}",
                flush=True,
            )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

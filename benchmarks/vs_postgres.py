"""W1-W4 in the shape most users write, beside PostgreSQL used directly, in one run.

    python -m benchmarks.vs_postgres                      # 3 interleaved rounds
    python -m benchmarks.vs_postgres --rounds 1 --w1-small 50000 --w3-seconds 3
    python -m benchmarks.vs_postgres --tidings-on-postgres   # and Tidings on that store

The shape: the sync client, one request at a time, producer and consumer in separate
processes, both systems durable by default (Tidings fsyncs each group commit;
PostgreSQL 15 with ``fsync = on`` and ``synchronous_commit = on``), on the same machine:

W1  publish 200,000 x 100 B and 50,000 x 1 KiB in batches of 500, each acknowledged
    before the next (PostgreSQL: one binary COPY + COMMIT per batch)
W2  read both topics back in one separate consumer process (PostgreSQL: ``id > last``
    pages of 10,000)
W3  1 message per ms for 10 s from the background publisher to a consumer in another
    process, p50/p99 (PostgreSQL: one INSERT + COMMIT per message; the consumer is
    LISTEN/NOTIFY and, separately, a 0.2 ms polling loop, and the better is reported)
W4  2,000 transactions one at a time, each 5 x 100 B to each of 2 topics (PostgreSQL:
    BEGIN, 10 INSERTs, COMMIT)

Beside W3 the run also times the durable write alone, at W3's pace and with no
consumer: a sync ``publish`` of one message (PostgreSQL: the INSERT + COMMIT W3 sends),
for up to 2 s. Not a target: it shows, in the same run, how much of W3's median the
acknowledged write takes before any consumer is involved.

Rounds alternate which system goes first, since these machines drift from minute to
minute; the ratios are taken within the run. The PostgreSQL cluster is a throwaway one
(initdb as the ``postgres`` user on a free loopback port), stopped at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pwd
import shutil
import statistics
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from glob import glob
from pathlib import Path
from typing import Any

from benchmarks.workloads import BATCH, Server, _free_port, _pct

_STAMP = struct.Struct(">qq")  # (sequence, send time in monotonic ns)
_PAGE = 10_000


# --- a throwaway PostgreSQL cluster ---


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return candidate
    raise SystemExit(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")


class PgCluster:
    """initdb + pg_ctl start on 127.0.0.1 with default durability; ``stop`` removes it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-pg-"))
        self.port = _free_port()
        data = self.dir / "data"
        as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        self._as_user = as_user
        self._data = data
        subprocess.run(
            [*as_user, _pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        subprocess.run(
            [
                *as_user,
                _pg_bin("pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-w",
                "-l",
                str(self.dir / "log"),
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        subprocess.run(
            [*self._as_user, _pg_bin("pg_ctl"), "-D", str(self._data), "-m", "fast", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


# --- the two systems behind one small interface ---


class System:
    """What each workload needs from a system; one process's connection."""

    name = ""

    def create(self, topic: str) -> None:
        raise NotImplementedError

    def publish_batch(self, topic: str, payloads: list[bytes]) -> None:
        raise NotImplementedError

    def transaction(self, parts: list[tuple[str, list[bytes]]]) -> None:
        raise NotImplementedError

    def write_one(self, topic: str, payload: bytes) -> None:
        """One message, durable when this returns (W3's write, waited for)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TidingsSystem(System):
    name = "Tidings"

    def __init__(self, url: str) -> None:
        from tidings import Client

        self.client = Client(url)

    def create(self, topic: str) -> None:
        self.client.create_topic(topic)

    def publish_batch(self, topic: str, payloads: list[bytes]) -> None:
        self.client.publish(topic, payloads)

    def transaction(self, parts: list[tuple[str, list[bytes]]]) -> None:
        with self.client.transaction() as tx:
            for topic, payloads in parts:
                tx.publish(topic, payloads)

    def write_one(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, [payload])

    def close(self) -> None:
        self.client.close()


class PostgresSystem(System):
    name = "PostgreSQL"

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn)

    def create(self, topic: str) -> None:
        self.conn.execute(
            f'CREATE TABLE "{topic}" (id bigserial PRIMARY KEY, payload bytea NOT NULL)'
        )
        self.conn.commit()

    def publish_batch(self, topic: str, payloads: list[bytes]) -> None:
        sql = f'COPY "{topic}" (payload) FROM STDIN (FORMAT BINARY)'
        with self.conn.cursor() as cur, cur.copy(sql) as copy:
            copy.set_types(["bytea"])
            for payload in payloads:
                copy.write_row((payload,))
        self.conn.commit()

    def transaction(self, parts: list[tuple[str, list[bytes]]]) -> None:
        with self.conn.cursor() as cur:
            for topic, payloads in parts:
                for payload in payloads:
                    cur.execute(f'INSERT INTO "{topic}" (payload) VALUES (%s)', (payload,))
        self.conn.commit()

    def write_one(self, topic: str, payload: bytes) -> None:
        self.conn.execute(f'INSERT INTO "{topic}" (payload) VALUES (%s)', (payload,))
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def _connect(kind: str, address: str) -> System:
    return TidingsSystem(address) if kind == "tidings" else PostgresSystem(address)


def _topic(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


# --- consumers, each in a process of its own ---


def _read_all(kind: str, address: str, topics: list[tuple[str, int]], out: Any) -> None:
    """W2: read every topic to its expected count; put the elapsed seconds in ``out``.
    Each side's library is imported before the clock starts (this module's imports
    bring in tidings already; psycopg's 0.1-0.2 s import used to count against
    PostgreSQL's read); connecting counts for both."""
    import psycopg

    from tidings import Client

    started = time.perf_counter()
    if kind == "tidings":
        with Client(address) as client:
            for topic, expected in topics:
                seen = 0
                consumer = client.consume(
                    topic, "earliest", transactional=True, follow=False, batch_size=_PAGE
                )
                for _ in consumer:
                    seen += 1
                consumer.close()
                if seen != expected:
                    raise RuntimeError(f"read {seen} of {expected}")
    else:
        with psycopg.connect(address, autocommit=True) as conn:
            for topic, expected in topics:
                seen, last = 0, 0
                while seen < expected:
                    rows = conn.execute(
                        f'SELECT id, payload FROM "{topic}" WHERE id > %s ORDER BY id LIMIT %s',
                        (last, _PAGE),
                    ).fetchall()
                    if not rows:
                        raise RuntimeError(f"read {seen} of {expected}")
                    seen += len(rows)
                    last = rows[-1][0]
    out.put(time.perf_counter() - started)


def _latency_consumer(kind: str, address: str, topic: str, total: int, mode: str, out: Any) -> None:
    """W3: receive ``total`` messages, put the list of latencies (ms) in ``out``."""
    latencies: list[float] = []
    deadline = time.monotonic() + 60
    ready = out  # the first put says "ready", the second carries the figures
    if kind == "tidings":
        from tidings import Client

        with Client(address) as client:
            consumer = client.consume(topic, "earliest", transactional=True, wait=1.0)
            ready.put("ready")
            for message in consumer:
                now = time.monotonic_ns()
                _, sent = _STAMP.unpack_from(message.payload)
                latencies.append((now - sent) / 1e6)
                if len(latencies) >= total or time.monotonic() > deadline:
                    break
            consumer.close()
    else:
        import select

        import psycopg

        with psycopg.connect(address, autocommit=True) as conn:
            query = f'SELECT id, payload FROM "{topic}" WHERE id > %s ORDER BY id'
            last = 0
            if mode == "notify":
                conn.execute(f'LISTEN "{topic}"')
            ready.put("ready")
            while len(latencies) < total and time.monotonic() < deadline:
                if mode == "notify":
                    # Wait on the socket, then drain notifications without blocking.
                    select.select([conn.fileno()], [], [], 1.0)
                    for _ in conn.notifies(timeout=0):
                        pass
                rows = conn.execute(query, (last,)).fetchall()
                now = time.monotonic_ns()
                for row_id, payload in rows:
                    _, sent = _STAMP.unpack_from(payload)
                    latencies.append((now - sent) / 1e6)
                    last = row_id
                if not rows and mode == "poll":
                    time.sleep(0.0002)
    out.put(latencies)


# --- the workloads ---


def w1(system: System, count: int, size: int) -> tuple[str, float]:
    topic = _topic(f"w1_{size}")
    system.create(topic)
    batch = [os.urandom(size)] * BATCH
    started = time.perf_counter()
    for _ in range(count // BATCH):
        system.publish_batch(topic, batch)
    return topic, count / (time.perf_counter() - started)


def w2(kind: str, address: str, topics: list[tuple[str, int]]) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_read_all, args=(kind, address, topics, out))
    proc.start()
    elapsed = float(out.get(timeout=300))
    proc.join(30)
    return sum(n for _, n in topics) / elapsed


def w3(
    system: System,
    kind: str,
    address: str,
    rate: int,
    seconds: float,
    mode: str,
    publishers_n: int = 1,
) -> list[float]:
    topic = _topic("w3")
    system.create(topic)
    if kind == "postgres" and mode == "notify":
        assert isinstance(system, PostgresSystem)
        # The NOTIFY is part of the INSERT's transaction: delivered only once committed.
        system.conn.execute(
            f"""CREATE FUNCTION "{topic}_n"() RETURNS trigger AS $$
                BEGIN PERFORM pg_notify('{topic}', ''); RETURN NULL; END $$ LANGUAGE plpgsql;
                CREATE TRIGGER "{topic}_t" AFTER INSERT ON "{topic}"
                FOR EACH STATEMENT EXECUTE FUNCTION "{topic}_n"()"""
        )
        system.conn.commit()
    total = int(rate * seconds)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_latency_consumer, args=(kind, address, topic, total, mode, out))
    proc.start()
    if out.get(timeout=60) != "ready":
        raise RuntimeError("consumer did not start")
    time.sleep(0.3)  # let it reach its first wait
    send: Callable[[bytes], None]
    publishers: list[Any] = []
    if isinstance(system, TidingsSystem):
        # More than one: the what-if of several batches in flight (messages dealt to
        # the publishers in turn, each with one batch in flight; order not kept).
        publishers = [system.client.publisher() for _ in range(publishers_n)]
        turn = [0]

        def send(payload: bytes) -> None:
            publishers[turn[0] % len(publishers)].send(topic, payload)
            turn[0] += 1
    else:
        send = partial(system.write_one, topic)

    interval = 1.0 / rate
    next_at = time.perf_counter()
    pad = b"x" * (100 - _STAMP.size)
    for i in range(total):
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(_STAMP.pack(i, time.monotonic_ns()) + pad)
        next_at += interval
    for publisher in publishers:
        publisher.close()
    latencies: list[float] = out.get(timeout=seconds + 60)
    proc.join(30)
    if len(latencies) < total:
        raise RuntimeError(f"W3 received {len(latencies)} of {total}")
    return latencies


def write_alone(system: System, rate: int, seconds: float) -> list[float]:
    """W3's durable write on its own, waited for, at W3's pace: latencies (ms)."""
    topic = _topic("w3w")
    system.create(topic)
    interval = 1.0 / rate
    payload = b"x" * 100
    latencies: list[float] = []
    next_at = time.perf_counter()
    for _ in range(int(rate * seconds)):
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        started = time.perf_counter()
        system.write_one(topic, payload)
        latencies.append((time.perf_counter() - started) * 1000)
        next_at += interval
    return latencies


def w4(system: System, count: int) -> float:
    a, b = _topic("w4a"), _topic("w4b")
    system.create(a)
    system.create(b)
    five = [b"x" * 100] * 5
    started = time.perf_counter()
    for _ in range(count):
        system.transaction([(a, five), (b, five)])
    return count / (time.perf_counter() - started)


def run_system(kind: str, address: str, args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    system = _connect(kind, address)
    try:
        t_small, out["W1 100B msg/s"] = w1(system, args.w1_small, 100)
        t_large, out["W1 1KiB msg/s"] = w1(system, args.w1_large, 1024)
        out["W2 read-back msg/s"] = w2(
            kind, address, [(t_small, args.w1_small), (t_large, args.w1_large)]
        )
        modes = ["notify", "poll"] if kind == "postgres" else ["consume"]
        best: list[float] | None = None
        for mode in modes:
            lat = w3(system, kind, address, args.w3_rate, args.w3_seconds, mode, args.w3_publishers)
            if best is None or _pct(lat, 0.99) < _pct(best, 0.99):
                best = lat
        assert best is not None
        out["W3 p50 ms"] = statistics.median(best)
        out["W3 p99 ms"] = _pct(best, 0.99)
        alone = write_alone(system, args.w3_rate, min(args.w3_seconds, 2.0))
        out["W3 write alone p50 ms"] = statistics.median(alone)
        out["W3 write alone p99 ms"] = _pct(alone, 0.99)
        out["W4 tx/s"] = w4(system, args.w4_count)
    finally:
        system.close()
    return out


def _run_tidings_on_postgres(args: argparse.Namespace) -> dict[str, float]:
    """Tidings with its store in a throwaway PostgreSQL cluster of its own."""
    cluster = PgCluster()
    try:
        server = Server([*args.server_arg, "--store", cluster.dsn])
        try:
            return run_system("tidings", server.url, args)
        finally:
            server.stop()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--w1-small", type=int, default=200_000)
    parser.add_argument("--w1-large", type=int, default=50_000)
    parser.add_argument("--w3-rate", type=int, default=1000)
    parser.add_argument("--w3-seconds", type=float, default=10.0)
    parser.add_argument("--w4-count", type=int, default=2000)
    parser.add_argument(
        "--w3-publishers",
        type=int,
        default=1,
        help="W3 through this many background publishers in turn (batches in flight)",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra serve flag")
    parser.add_argument(
        "--tidings-on-postgres",
        action="store_true",
        help="also run Tidings with its store in PostgreSQL (a third column)",
    )
    args = parser.parse_args()

    kinds = ["tidings", "postgres"] + (["tidings-pg"] if args.tidings_on_postgres else [])
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for i in range(args.rounds):
        order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
        for kind in order:
            if kind == "tidings":
                server = Server(args.server_arg)
                try:
                    figures = run_system(kind, server.url, args)
                finally:
                    server.stop()
            elif kind == "tidings-pg":
                figures = _run_tidings_on_postgres(args)
            else:
                cluster = PgCluster()
                try:
                    figures = run_system(kind, cluster.dsn, args)
                finally:
                    cluster.stop()
            results[kind].append(figures)
            print(
                f"round {i + 1} {kind}: " + ", ".join(f"{k} {v:,.2f}" for k, v in figures.items())
            )

    names = {"postgres": "PostgreSQL", "tidings": "Tidings", "tidings-pg": "Tidings on PG"}
    others = [k for k in kinds if k != "postgres"]
    header = "".join(f"{names[k]:>14} {'ratio':>7}" for k in others)
    print(f"median of {args.rounds} rounds   {'PostgreSQL':>12}{header}")
    for key in results["tidings"][0]:
        pg = statistics.median(r[key] for r in results["postgres"])
        row = f"  {key:24s} {pg:>12,.2f}"
        for kind in others:
            td = statistics.median(r[key] for r in results[kind])
            # Higher is better for rates, lower for latencies: the ratio says how many
            # times better Tidings is either way.
            ratio = pg / td if key.endswith("ms") else td / pg
            row += f"{td:>14,.2f} {ratio:>6.2f}x"
        print(row)


if __name__ == "__main__":
    main()

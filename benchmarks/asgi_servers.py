"""The same Tidings application behind two HTTP servers: uvicorn as ``tidings serve``
runs it (with the server's own protocol tweaks) and granian (HTTP in Rust, the ASGI
app on a uvloop event loop in its worker process).

The question (issue: speed where users feel it): would another ASGI server spend less
per request than uvicorn + Starlette? Cases, in the issue's shape (the sync client, one
request at a time, a kept-alive connection), each printing the client-side figure and
the server's CPU time per request (user + system of the server's processes, /proc):

- ``list topics``: a small request through Starlette, round trip p50 / p99;
- ``publish 1``: one 100 B message, durable (fsync before the answer), p50 / p99;
- ``W1 batches``: 500 x 100 B per publish, msg/s;
- ``W4 tx``: one-request transactions of 5 + 5 messages over two topics, tx/s;
- ``W2 read``: a consumer reading 100,000 messages back (pages of 10,000), msg/s.

Rounds alternate which server goes first; medians of the rounds are printed.

    pip install granian        # only for this benchmark; not a dependency
    python -m benchmarks.asgi_servers --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import Server, _free_port, _pct, cpu_seconds, wait_healthy
from tidings import Client


def make() -> Any:
    """granian's application factory (``--factory``): the services open in the worker
    process; the app is built on the worker's event loop at its first call."""
    from tidings.server.config import ServerConfig
    from tidings.server.main import _application
    from tidings.server.services import Services

    config = ServerConfig(data_dir=Path(os.environ["TIDINGS_BENCH_DATA"]))
    services = Services.open(config, None)
    built: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    services.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if not built:
            built.append(_application(config, services, None, asyncio.get_running_loop())[0])
        await built[0](scope, receive, send)

    return app


class Granian:
    """granian serving :func:`make` on 127.0.0.1, one worker, uvloop."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-granian-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "TIDINGS_BENCH_DATA": str(self.dir / "data")}
        root = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory",
               "--loop", "uvloop", "--workers", "1", "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", "warning",
               "benchmarks.asgi_servers:make"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        if not wait_healthy(self.url, 30):
            self.stop()
            raise RuntimeError("granian did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its descendants."""
    total = 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            total += cpu_seconds(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _cases(url: str, pid: int, scale: int) -> dict[str, float]:
    out: dict[str, float] = {}
    payload = b"x" * 100
    with Client(url) as client:
        a, b, w2 = (f"{n}-{os.urandom(3).hex()}" for n in ("a", "b", "w2"))
        for topic in (a, b, w2):
            client.create_topic(topic)

        def timed(name: str, count: int, fn: Any, per_request: int = 1) -> list[float]:
            fn()  # warm
            lat: list[float] = []
            cpu = _tree_cpu(pid)
            started = time.perf_counter()
            for _ in range(count):
                t = time.perf_counter()
                fn()
                lat.append((time.perf_counter() - t) * 1000)
            elapsed = time.perf_counter() - started
            out[f"{name} cpu us/req"] = (_tree_cpu(pid) - cpu) / count * 1e6
            out[f"{name} per s"] = count * per_request / elapsed
            return lat

        lat = timed("list topics", 2 * scale, client.list_topics)
        out["list topics p50 ms"] = statistics.median(lat)
        out["list topics p99 ms"] = _pct(lat, 0.99)
        lat = timed("publish 1", scale, lambda: client.publish(a, payload))
        out["publish 1 p50 ms"] = statistics.median(lat)
        out["publish 1 p99 ms"] = _pct(lat, 0.99)
        batch = [payload] * 500
        timed("W1 batches", scale // 5, lambda: client.publish(w2, batch), 500)
        five = [payload] * 5

        def tx() -> None:
            with client.transaction() as t:
                t.publish(a, five)
                t.publish(b, five)

        timed("W4 tx", scale // 2, tx)
        for _ in range(200 - scale // 5):
            client.publish(w2, batch)
        started = time.perf_counter()
        consumer = client.consume(w2, "earliest", follow=False, batch_size=10_000)
        count = sum(1 for _ in consumer)
        consumer.close()
        out["W2 read per s"] = count / (time.perf_counter() - started)
    return out


_SHOWN = [
    ("list topics p50 ms", "list topics p99 ms", "list topics cpu us/req"),
    ("publish 1 p50 ms", "publish 1 p99 ms", "publish 1 cpu us/req"),
    ("W1 batches per s", None, "W1 batches cpu us/req"),
    ("W4 tx per s", None, "W4 tx cpu us/req"),
    ("W2 read per s", None, None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000, help="per latency case")
    args = parser.parse_args()
    try:
        import granian  # noqa: F401
    except ImportError:
        raise SystemExit("granian is not installed: pip install granian") from None
    results: dict[str, list[dict[str, float]]] = {"uvicorn": [], "granian": []}
    for r in range(args.rounds):
        order = ["uvicorn", "granian"] if r % 2 == 0 else ["granian", "uvicorn"]
        for kind in order:
            server: Server | Granian = Server([]) if kind == "uvicorn" else Granian()
            try:
                figures = _cases(server.url, server.proc.pid, args.requests)
            finally:
                server.stop()
            results[kind].append(figures)
            shown = ", ".join(f"{k} {v:,.2f}" for k, v in figures.items())
            print(f"round {r + 1} {kind}: {shown}", flush=True)
    print(f"medians of {args.rounds} rounds        uvicorn (tidings serve)      granian")
    for main_key, p99_key, cpu_key in _SHOWN:
        row = []
        for kind in ("uvicorn", "granian"):
            med = statistics.median(f[main_key] for f in results[kind])
            cell = f"{med:,.2f}"
            if p99_key:
                cell += f" / {statistics.median(f[p99_key] for f in results[kind]):,.2f}"
            if cpu_key:
                cell += f" ({statistics.median(f[cpu_key] for f in results[kind]):,.0f} us cpu)"
            row.append(f"{cell:>28}")
        label = main_key if p99_key is None else main_key.replace("p50", "p50/p99")
        print(f"  {label:<24}" + "".join(row))


if __name__ == "__main__":
    main()

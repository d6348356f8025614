"""An instance standing by (the real :class:`~tidings.server.forward.Forwarder`) in front
of a leader whose answers to one kind of request come late, for tests/e2e/test_tx_review.py.

The "leader" carries out every request on a real server (``REAL``) and answers those
whose path ends with ``LATE_PATH`` only ``DELAY`` seconds later, after the standby
(waiting ``TIMEOUT`` seconds) gave up. Run as ``python -m tests.e2e.tx_standby REAL
LATE_PATH LEADER_PORT STANDBY_PORT TIMEOUT DELAY``; it serves until killed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx
import uvicorn
from starlette.requests import Request
from starlette.responses import Response

from tidings.server.forward import Forwarder


def late_leader(real: str, late_path: str, delay: float) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        query = scope["query_string"].decode()
        url = real + scope["path"] + (f"?{query}" if query else "")
        skip = ("host", "content-length")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        async with httpx.AsyncClient(timeout=30) as hop:
            answer = await hop.request(
                request.method, url, content=await request.body(), headers=headers
            )
        if scope["path"].endswith(late_path):
            await asyncio.sleep(delay)
        media = answer.headers.get("content-type", "application/json")
        await Response(answer.content, answer.status_code, media_type=media)(scope, receive, send)

    return app


async def main(argv: list[str]) -> None:
    real, late_path, leader_port, standby_port, timeout, delay = argv
    leader_url = f"http://127.0.0.1:{leader_port}"
    forwarder = Forwarder(
        lambda: leader_url,
        me=f"http://127.0.0.1:{standby_port}",
        max_body=1 << 24,
        timeout=float(timeout),
    )
    servers = [
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=int(port), log_level="warning"))
        for app, port in (
            (late_leader(real, late_path, float(delay)), leader_port),
            (forwarder, standby_port),
        )
    ]
    await asyncio.gather(*(server.serve() for server in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))

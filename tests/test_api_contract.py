"""The routes the server mounts are exactly the operations of /openapi.json and of
docs/api.md's tables: none undocumented, none documented but missing."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Route

import tidings
from tidings.server.app import create_app
from tidings.server.config import ServerConfig
from tidings.server.handlers import Api
from tidings.server.inbox import LoopInbox
from tidings.server.longpoll import LongPolls
from tidings.server.metrics import Metrics, Sources
from tidings.server.openapi import openapi_document
from tidings.server.services import Services

API_MD = Path(__file__).resolve().parent.parent / "docs" / "api.md"
Operation = tuple[str, str]


def _mounted() -> set[Operation]:
    async def build() -> set[Operation]:
        config = ServerConfig()
        services = Services(config)
        try:
            api = Api(
                config,
                services,
                Metrics(sources=Sources()),
                LongPolls(),
                LoopInbox(asyncio.get_running_loop()),
            )
            app = create_app(api)
        finally:
            services.executor.shutdown()
        starlette = getattr(app, "app", app)
        assert isinstance(starlette, Starlette)
        out: set[Operation] = set()
        for route in starlette.routes:
            assert isinstance(route, Route)
            for method in route.methods or ():
                if method != "HEAD":  # Starlette adds it to every GET
                    out.add((method, route.path))
        return out

    return asyncio.run(build())


def _in_openapi() -> set[Operation]:
    paths = openapi_document(tidings.__version__)["paths"]
    return {(method.upper(), path) for path, item in paths.items() for method in item}


def _in_docs() -> set[Operation]:
    out: set[Operation] = set()
    for match in re.finditer(r"^\| `(GET|PUT|POST|DELETE) ([^`]+)`", API_MD.read_text(), re.M):
        method, path = match.groups()
        path = path.split("[")[0].split("?")[0]
        if path.startswith("/topics"):
            path = "/v1/namespaces/{ns}" + path  # the topic tables are per namespace
        path = path.replace("{t}", "{topic}").replace("{g}", "{group}").replace("{q}", "{queue}")
        out.add((method, path))
    return out


def test_every_mounted_route_is_in_the_openapi_document_and_back() -> None:
    mounted, documented = _mounted(), _in_openapi()
    assert mounted - documented == set(), "mounted but not in /openapi.json"
    assert documented - mounted == set(), "in /openapi.json but not mounted"


def test_docs_api_tables_name_exactly_the_mounted_routes() -> None:
    mounted, documented = _mounted(), _in_docs()
    assert mounted - documented == set(), "mounted but in no table of docs/api.md"
    assert documented - mounted == set(), "in docs/api.md but not mounted"


def test_the_docs_parser_sees_every_table() -> None:
    # A renamed table heading or a changed row format must not make the check vacuous.
    documented = _in_docs()
    assert ("POST", "/v1/namespaces/{ns}/topics/{topic}/publish") in documented
    assert ("GET", "/metrics") in documented
    assert len(documented) >= 20


def test_docs_security_table_is_the_permission_table() -> None:
    from tidings.server.permissions import PERMISSIONS

    text = (API_MD.parent / "security.md").read_text()
    rows = re.findall(r"^\| `(GET|PUT|POST|DELETE) ([^`]+)` \| (.+) \|$", text, re.M)
    assert {(m, p): need for m, p, need in rows} == {
        key: need.value for key, need in PERMISSIONS.items()
    }
    assert {(m, p) for m, p, _ in rows} == _mounted()  # every route, and no other

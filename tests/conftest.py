"""Fixtures shared by the whole suite."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.budget import PROFILE
from tidings.store import MemoryStore, Store

# The suite shares two cores with whatever else CI runs: a property's examples may take
# longer than hypothesis's 200 ms deadline without anything being wrong, and timing is
# not among the properties tested. Tests that set their own settings keep this default.
# TIDINGS_HYPOTHESIS_PROFILE=long is the deep local run: ten times the examples, also
# for the properties whose budget tests/budget.py scales.
settings.register_profile("tidings", deadline=None)
settings.register_profile("long", deadline=None, max_examples=1000)
settings.load_profile(PROFILE)


def _share_httpx_default_tls_context() -> None:
    """Every ``httpx.get()`` (and ``httpx.Client()``) loads the whole CA bundle into a new
    TLS context, even for an http:// URL: ~25 ms of CPU unloaded, several times that on
    the shared cores, and the black-box tests make thousands of such calls. The default
    context (verify=True: certifi's bundle, or SSL_CERT_FILE/SSL_CERT_DIR's) is the same
    for the same environment, so the tests build it once per environment; any other
    ``verify`` (False, a CA file, a context) is built as httpx builds it. (httpcore sets
    the context's ALPN list on each connection: the same one while no test asks httpx
    for HTTP/2.)"""
    import httpx._transports.default as transports

    build = getattr(transports, "create_ssl_context", None)
    if build is None:  # another httpx: leave it as it is
        return
    shared: dict[tuple[object, ...], Any] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        where = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if where not in shared:
            shared[where] = build(verify=True, trust_env=trust_env)
        return shared[where]

    setattr(transports, "create_ssl_context", create_ssl_context)  # noqa: B010 - not exported


_share_httpx_default_tls_context()

STORE_KINDS = ["memory", "lmdb", "postgres"]


def make_store(kind: str, path: Path, postgres_url: str | None = None) -> Store:
    """A fresh store of ``kind`` ("memory", "lmdb" or "postgres", the latter in a new
    database of ``postgres_url``'s server) with its data under ``path``."""
    if kind == "memory":
        return MemoryStore()
    if kind == "lmdb":
        from tidings.store.backends.lmdb import LmdbStore

        return LmdbStore(path / "store")
    if kind == "postgres":
        from tidings.store.backends.postgres import PostgresStore

        assert postgres_url is not None
        return PostgresStore(fresh_schema(postgres_url))
    raise ValueError(kind)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every store backend in turn: one suite runs against all of them."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    s = make_store(request.param, tmp_path, url)
    try:
        yield s
    finally:
        s.close()


# --- a throwaway PostgreSQL cluster for the tests that need one ---------------------


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def fresh_database(url: str) -> str:
    """A new, empty database on the cluster of ``url``; its URL."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


def fresh_schema(url: str) -> str:
    """A new, empty schema in the database of ``url``; a URL whose connections use it.
    What the store suite's PostgreSQL runs use: a database per test cost ~250 ms to
    create (a copy of the template, written to the WAL and fsynced) and left ~300
    files each for the cluster's removal at the end of the session."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{url}?options=-csearch_path%3D{name}"


class PgTestCluster:
    """The session's throwaway PostgreSQL cluster: its URL, and a way to restart it."""

    def __init__(self, bin_dir: Path, root: Path, port: int, as_user: list[str]) -> None:
        self.bin_dir, self.root, self.port, self._as_user = bin_dir, root, port, as_user
        self.data = root / "data"
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=on"
        subprocess.run(
            [*self._as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data),
             "-o", options, "-l", str(self.root / "log"), *args],
            check=check,
            capture_output=True,
        )  # fmt: skip

    def start(self) -> None:
        self._pg_ctl("-w", "start")

    def restart(self) -> None:
        """Stop at once (connections are cut, as in a crash) and start again."""
        self._pg_ctl("-m", "immediate", "stop")
        self.start()

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "stop", check=False)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PgTestCluster]:
    """A PostgreSQL cluster of the session's own on a free loopback port (initdb runs
    as the ``postgres`` user when the tests run as root: initdb refuses root)."""
    pytest.importorskip(
        "psycopg", reason="psycopg is not installed (pip install tidings[postgres])"
    )
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries (initdb) on PATH or in /usr/lib/postgresql/*/bin")
    # Not under pytest's own temporary directory: that is private to the user running
    # the tests, and the cluster runs as "postgres".
    root = Path(tempfile.mkdtemp(prefix="tidings-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = PgTestCluster(bin_dir, root, port, as_user)
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(cluster.data), "-A", "trust",
         "-U", "postgres"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_cluster: PgTestCluster) -> str:
    """The URL of the session's PostgreSQL cluster (its ``postgres`` database)."""
    return postgres_cluster.url

"""One real server for the black-box tests; tests use their own topics."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import fresh_database
from tests.e2e.serverproc import LeadingServerProcess, ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``tidings serve`` (role all, embedded store) shared by the session."""
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "data").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def pg_server(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> Iterator[ServerProcess]:
    """A ``tidings serve --store postgresql://...`` shared by the session, beside
    ``server``: the tests that ask for ``store_server`` run on both."""
    data = tmp_path_factory.mktemp("pg-server") / "data"
    proc = LeadingServerProcess(data, ["--store", fresh_database(postgres_url)]).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(params=["lmdb", "postgres"])
def store_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The shared server on each store in turn: the groups' and queues' behaviour must
    not depend on it (a handful of representative tests; the rest run on LMDB)."""
    if request.param == "lmdb":
        return request.getfixturevalue("server")
    proc: ServerProcess = request.getfixturevalue("pg_server")
    if proc.proc is not None and proc.proc.poll() is not None:
        # Stopped by another test's restart of the session's PostgreSQL (it lost its
        # lease meanwhile, say): that is that test's subject, not these tests'.
        proc.start()
    return proc


@pytest.fixture(params=["lmdb", "postgres"])
def start_store_server(
    request: pytest.FixtureRequest, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> Iterator[Callable[..., ServerProcess]]:
    """``start_server`` on each store in turn. On PostgreSQL the server is started, and
    restarted after a kill -9, until it leads (a restarted one stands by until the
    killed one's lease passes: a short one here)."""
    if request.param == "lmdb":
        yield start_server
        return
    started: list[ServerProcess] = []

    def start(*args: str, **env: str) -> ServerProcess:
        url = fresh_database(request.getfixturevalue("postgres_url"))
        args = (*args, "--store", url, "--lease-seconds", "2")
        proc = LeadingServerProcess(tmp_path / f"pg{len(started)}", list(args), env)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start extra servers with their own data dirs/arguments; all stopped afterwards."""
    started: list[ServerProcess] = []

    def start(*args: str, data_dir: Path | None = None, **env: str) -> ServerProcess:
        proc = ServerProcess(data_dir or tmp_path / f"data{len(started)}", list(args), env)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return "t-" + uuid.uuid4().hex[:12]

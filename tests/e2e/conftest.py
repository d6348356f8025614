"""One real server for the black-box tests; tests use their own topics."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``tidings serve`` (role all, embedded store) shared by the session."""
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "data").start()
    try:
        yield proc
    finally:
        proc.stop()


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

"""The server keeps the contract it publishes: schemathesis over /openapi.json.

Runs the schemathesis command (as CI and a user would) against a real server with
every phase, stateful included, and every check: no server error, documented status
codes, content types, headers and response bodies, schema-valid requests accepted and
schema-violating ones refused. tests/e2e/schemathesis.toml lists the few rules JSON
Schema cannot state (and so the 400s a schema-valid request may get). Bounded by a
fixed number of examples per operation and a fixed seed, ~40 s on two cores.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("contract") / "data", env={"TIDINGS_MAX_WAIT_MS": "1000"}
    ).start()
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def _schemathesis() -> list[str]:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "schemathesis.cli"]


TOKEN = "contract-token-0123456789"


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("secured-contract")
    auth = where / "auth.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    auth.write_text(f'[[principal]]\nname = "ops"\ntoken_sha256 = "{digest}"\nadmin = true\n')
    srv = ServerProcess(
        where / "data", ["--auth-file", str(auth)], env={"TIDINGS_MAX_WAIT_MS": "1000"}
    ).start()
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def test_schemathesis_finds_nothing(contract_server: ServerProcess, tmp_path: Path) -> None:
    _run(contract_server, tmp_path, 15)


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
def test_schemathesis_finds_nothing_with_an_auth_file(
    secured_server: ServerProcess, tmp_path: Path, token: str | None
) -> None:
    """With a token every operation runs as with no auth file; without one every
    protected operation answers a documented 401, and none a 5xx."""
    if token is None:
        # Every call answers 401, so the stateful phase has no links to follow. The
        # coverage phase's ~2,200 malformed variants (half this file's cost) would only
        # meet the same refusal before anything reads them: the run without an auth
        # file sends them to the parsing, and the run with a token to the access checks.
        _run(secured_server, tmp_path, 3, phases="examples,fuzzing")
    else:
        _run(secured_server, tmp_path, 5, ["--header", f"Authorization: Bearer {token}"])


def _run(
    server: ServerProcess,
    tmp_path: Path,
    examples: int,
    extra: list[str] = [],  # noqa: B006
    phases: str = "examples,coverage,fuzzing,stateful",
) -> None:
    done = subprocess.run(
        [
            *_schemathesis(),
            "--config-file",
            str(CONFIG),
            "run",
            server.url + "/openapi.json",
            *extra,
            "--checks",
            "all",
            "--phases",
            phases,
            "--max-examples",
            str(examples),
            "--seed",
            "20261124",
            "--request-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    tail = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    if "stateful" in phases:
        assert "Stateful" in done.stdout, tail  # the stateful phase ran

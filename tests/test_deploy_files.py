"""The deployment files name the right command, port, user and health check (nothing is
built here: there is no Docker on these machines). Every command they run is parsed by
the real ``tidings`` command line, so a renamed or mistyped flag fails here."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tidings.cli import main
from tidings.server.config import SETTINGS, ServerConfig, example_toml, load_config

ROOT = Path(__file__).resolve().parent.parent
PORT = 8470


def _dockerfile() -> list[str]:
    """The instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _serve_settings(argv: list[str]) -> dict[str, Any]:
    """The flags ``argv`` (``tidings serve ...``) gives, as ``tidings serve`` reads them."""
    assert argv[:2] == ["tidings", "serve"], argv
    serve = main.commands["serve"]
    ctx = serve.make_context("serve", argv[2:], resilient_parsing=False)
    return {name: value for name, value in ctx.params.items() if value is not None}


def _image_env() -> dict[str, str]:
    """The variables the image's ``ENV`` instructions set."""
    env: dict[str, str] = {}
    for line in _dockerfile():
        if line.startswith("ENV "):
            for word in shlex.split(line.removeprefix("ENV ")):
                name, _, value = word.partition("=")
                env[name] = value
    return env


def _image_cmd() -> list[str]:
    lines = _dockerfile()
    assert lines[-1].startswith("CMD ")
    argv: list[str] = json.loads(lines[-1].removeprefix("CMD "))
    return argv


def _config(argv: list[str], env: Mapping[str, str]) -> ServerConfig:
    """What ``argv`` (``tidings serve ...``) runs with in a container whose environment
    is ``env``, resolved as ``tidings serve`` resolves it (flags over variables)."""
    flags = _serve_settings(argv)
    config_file = flags.pop("config_file", None)
    return load_config(flags, config_file=config_file, env=env)


def _compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    document: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return document


def test_dockerfile() -> None:
    lines = _dockerfile()
    assert lines[0].startswith("FROM python:3.11-slim")
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert f"EXPOSE {PORT}" in lines
    assert any(line.startswith("VOLUME") and "/data" in line for line in lines)
    install = next(line for line in lines if "pip install" in line)
    assert "[postgres]" in install  # the image can run on PostgreSQL too
    health = next(line for line in lines if line.startswith("HEALTHCHECK"))
    assert "127.0.0.1:" in health and "/readyz" in health
    config = _config(_image_cmd(), _image_env())
    assert config.host == "0.0.0.0" and config.port == PORT
    assert str(config.data_dir) == "/data"


def test_docker_run_environment_variables_are_not_overridden_by_the_cmd() -> None:
    """``docker run -e TIDINGS_...`` sets what it names: the CMD passes no flag, since
    a flag wins over the variable (and ``--config`` over ``TIDINGS_CONFIG``)."""
    cmd = _image_cmd()
    assert _serve_settings(cmd) == {}
    given = {
        "TIDINGS_HOST": "127.0.0.1",
        "TIDINGS_PORT": "9000",
        "TIDINGS_DATA_DIR": "/elsewhere",
        "TIDINGS_ROLE": "messaging",
        "TIDINGS_STORE": "postgresql://me@db:5432/tidings",
        "TIDINGS_LOG_LEVEL": "debug",
    }
    config = _config(cmd, {**_image_env(), **given})
    assert (config.host, config.port, str(config.data_dir)) == ("127.0.0.1", 9000, "/elsewhere")
    assert (config.role, config.store, config.log_level) == (
        "messaging",
        "postgresql://me@db:5432/tidings",
        "debug",
    )
    assert {s.env for s in SETTINGS} >= set(_image_env())  # only real settings


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_port() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_health_check_asks_the_port_the_environment_gives(ready_port: int) -> None:
    health = next(line for line in _dockerfile() if line.startswith("HEALTHCHECK"))
    argv = shlex.split(health[health.index(" CMD ") + len(" CMD ") :])
    assert argv[:2] == ["python", "-c"]

    def check(env: Mapping[str, str]) -> int:
        # The image's environment, and no TIDINGS_* of this machine's.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
        run = [sys.executable, *argv[1:]]
        done = subprocess.run(run, env={**clean, **env}, capture_output=True, timeout=30)
        return done.returncode

    image = _image_env()
    assert image["TIDINGS_PORT"] == str(PORT)
    assert check({**image, "TIDINGS_PORT": str(ready_port)}) == 0
    with socket.socket() as bound:  # bound, not listening: nothing answers there
        bound.bind(("127.0.0.1", 0))
        assert check({**image, "TIDINGS_PORT": str(bound.getsockname()[1])}) != 0


def test_compose_runs_one_instance_on_lmdb() -> None:
    compose = _compose()
    service = compose["services"]["tidings"]
    assert "profiles" not in service  # what a plain `docker compose up` starts
    assert service["build"] == "."
    assert f"{PORT}:{PORT}" in service["ports"]
    assert any(v.endswith(":/data") for v in service["volumes"])
    assert "tidings-data" in compose["volumes"]
    assert "command" not in service  # the image's CMD: LMDB in /data


def test_compose_profile_runs_two_instances_on_postgresql() -> None:
    services = _compose()["services"]
    postgres = services["postgres"]
    assert postgres["profiles"] == ["postgres"]
    assert postgres["image"].startswith("postgres:")
    assert "healthcheck" in postgres
    instances = {
        name: s
        for name, s in services.items()
        if "postgres" in s.get("profiles", []) and name != "postgres"
    }
    assert len(instances) == 2
    host_ports = set()
    for name, service in instances.items():
        # The image's command, its settings from the image's and the service's variables.
        assert "command" not in service, name
        env = {**_image_env(), **{k: str(v) for k, v in service["environment"].items()}}
        config = _config(_image_cmd(), env)
        assert config.port == PORT and config.host == "0.0.0.0", name
        assert config.store is not None, name
        url = urlsplit(config.store)
        assert url.scheme == "postgresql" and url.hostname == "postgres", name
        assert url.path == "/" + postgres["environment"]["POSTGRES_DB"], name
        assert url.username == postgres["environment"]["POSTGRES_USER"], name
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        (mapping,) = service["ports"]
        host, container = mapping.split(":")
        assert int(container) == PORT
        host_ports.add(int(host))
    assert len(host_ports) == 2 and PORT not in host_ports  # beside the LMDB one


def test_the_systemd_unit_in_the_docs_runs_serve(tmp_path: Path) -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    unit = ops[ops.index("[Unit]") : ops.index("WantedBy=multi-user.target")]
    assert "User=tidings" in unit and "KillSignal=SIGTERM" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[0] == "/usr/local/bin/tidings"
    # The file the docs make with `tidings config example`, here rather than in /etc.
    config = argv.index("--config") + 1
    assert argv[config] == "/etc/tidings.toml"
    assert "tidings config example > /etc/tidings.toml" in ops
    argv[config] = str(tmp_path / "tidings.toml")
    (tmp_path / "tidings.toml").write_text(example_toml())
    assert _serve_settings(["tidings", *argv[1:]])["config_file"] == tmp_path / "tidings.toml"

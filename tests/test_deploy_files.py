"""The deployment files name the right command, port, user and health check (nothing is
built here: there is no Docker on these machines). Every command they run is parsed by
the real ``tidings`` command line, so a renamed or mistyped flag fails here."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tidings.cli import main
from tidings.server.config import example_toml

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
    assert f"http://127.0.0.1:{PORT}/readyz" in health
    assert lines[-1].startswith("CMD ")
    settings = _serve_settings(json.loads(lines[-1].removeprefix("CMD ")))
    assert settings["host"] == "0.0.0.0" and settings["port"] == PORT
    assert str(settings["data_dir"]) == "/data"


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
        settings = _serve_settings(service["command"])
        assert settings["port"] == PORT and settings["host"] == "0.0.0.0", name
        url = urlsplit(settings["store"])
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

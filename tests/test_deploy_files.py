"""The deployment files name the right command, port, user and health check (nothing is
built here: there is no Docker on these machines)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_dockerfile() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0].startswith("FROM python:3.11-slim")
    assert any(line.startswith("USER ") and "root" not in line for line in lines)
    assert "EXPOSE 8470" in lines
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert any("/readyz" in line for line in lines)
    assert lines[-1].startswith('CMD ["tidings", "serve"') and '"0.0.0.0"' in lines[-1]


def test_compose_file() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    service = compose["services"]["tidings"]
    assert service["build"] == "."
    assert "8470:8470" in service["ports"]
    assert any(v.endswith(":/data") for v in service["volumes"])
    assert "tidings-data" in compose["volumes"]


def test_the_systemd_unit_in_the_docs_runs_serve() -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    unit = ops[ops.index("[Unit]") : ops.index("WantedBy=multi-user.target")]
    assert "ExecStart=/usr/local/bin/tidings serve" in unit
    assert "User=tidings" in unit and "KillSignal=SIGTERM" in unit

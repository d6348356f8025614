"""User-facing text says what Tidings does, not where an internal note asked for it:
no "seed 000" or DESIGN.md in the README, the docs, /openapi.json, any --help or the
package's docstrings and comments. docs/design.md credits the systems ideas come from
by name instead."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import orjson
from click.testing import CliRunner

import tidings
from tidings.cli import main
from tidings.server.openapi import openapi_document

ROOT = Path(__file__).resolve().parent.parent
# DESIGN.md in capitals: the internal note (docs/design.md is a user document).
INTERNAL = re.compile(r"(?i:\bseeds?\b|\bseed's|\bseed-only)|DESIGN\.md|DESIGN invariant|STYLE\.md")
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_user_docs_speak_of_behaviour() -> None:
    for path in USER_DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not INTERNAL.search(line), f"{path.name}:{number}: {line}"


def test_design_notes_credit_the_sources_by_name() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    for source in ("CDAP", "Tephra", "Kafka", "Pulsar"):
        assert source in design
    # The invariants other documents refer to by number are written out there.
    for number in range(1, 7):
        assert f"\n{number}. **" in design


def test_the_openapi_document_does_too() -> None:
    text = orjson.dumps(openapi_document(tidings.__version__)).decode()
    assert not INTERNAL.search(text)


def _commands(group: click.Group, path: list[str]) -> Iterator[list[str]]:
    yield path
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, [*path, name])
        else:
            yield [*path, name]


def test_and_so_does_every_help_text() -> None:
    runner = CliRunner()
    paths = list(_commands(main, []))
    assert ["serve"] in paths and ["groups", "reset"] in paths
    for args in paths:
        out = runner.invoke(main, [*args, "--help"]).output
        assert "Usage:" in out, args
        assert not INTERNAL.search(out), args


def test_and_the_package_source() -> None:
    for path in sorted((ROOT / "tidings").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not INTERNAL.search(line), f"{name}:{number}: {line}"

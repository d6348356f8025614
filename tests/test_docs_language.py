"""User-facing text says what Tidings does, not where an internal note asked for it:
no "seed 000" or DESIGN.md in the README, the user docs, /openapi.json or --help."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from click.testing import CliRunner

import tidings
from tidings.cli import main
from tidings.server.openapi import openapi_document

ROOT = Path(__file__).resolve().parent.parent
# DESIGN.md in capitals: the internal note (docs/design.md is a user document).
INTERNAL = re.compile(r"(?i:seeds? 00\d)|DESIGN\.md|DESIGN invariant")
#: docs/design.md is where the ideas are credited and the departures explained.
USER_DOCS = [
    ROOT / "README.md",
    *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "design.md"),
]


def test_user_docs_speak_of_behaviour() -> None:
    for path in USER_DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not INTERNAL.search(line), f"{path.name}:{number}: {line}"


def test_the_openapi_document_does_too() -> None:
    text = orjson.dumps(openapi_document(tidings.__version__)).decode()
    assert not INTERNAL.search(text)


def test_and_so_does_help() -> None:
    runner = CliRunner()
    commands = [[], ["serve"], ["topics"], ["publish"], ["consume"], ["groups"], ["tx"]]
    for args in commands:
        out = runner.invoke(main, [*args, "--help"]).output
        assert not INTERNAL.search(out), args

"""docs/cli.md names what ``tidings --help`` offers: every global option, every flag of
``serve``, every command."""

from __future__ import annotations

import re
from pathlib import Path

import click
from click.testing import CliRunner

from tidings.cli import main
from tidings.server.config import SETTINGS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert match is not None, title
    return match.group(1)


def test_every_global_option_is_in_the_table() -> None:
    table = DOC[: DOC.index("## serve")]
    for param in main.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert f"`{max(param.opts, key=len)}`" in table, param.opts


def test_every_serve_flag_is_in_its_synopsis() -> None:
    synopsis = section("serve")
    for setting in SETTINGS:
        if setting.flag is not None:
            assert f"[{setting.flag}" in synopsis, setting.flag


def test_every_command_has_a_section() -> None:
    titles = set(re.findall(r"^## (.+)$", DOC, re.M))
    words = {word for title in titles for word in re.split(r"\W+", title)}
    assert isinstance(main, click.Group)
    for name in main.commands:
        assert name in words, name


def test_serve_help_shows_paths_and_unset_defaults() -> None:
    help_text = CliRunner().invoke(main, ["serve", "--help"]).stdout
    assert "--data-dir PATH" in help_text and "--tls-key PATH" in help_text
    assert "[default: ]" not in help_text

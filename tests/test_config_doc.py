"""docs/configuration.md shows the settings table the code makes, and shows it truly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.server.config import SETTINGS, Setting, load_config, settings_table

DOC = Path(__file__).parent.parent / "docs" / "configuration.md"


def doc_table() -> str:
    """The table under the page's "## Settings" heading, as the page writes it."""
    lines = DOC.read_text().splitlines()
    start = lines.index("## Settings")
    rows: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return "\n".join(rows) + "\n"


def test_doc_table_is_the_settings_table() -> None:
    # On failure: paste settings_table()'s output over the page's table.
    assert doc_table() == settings_table()


def test_doc_has_one_settings_table() -> None:
    assert DOC.read_text().count("| TOML key |") == 1


def test_table_has_a_row_per_setting_with_its_names() -> None:
    rows = settings_table().splitlines()[2:]
    assert len(rows) == len(SETTINGS)
    for row, setting in zip(rows, SETTINGS, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert cells[0] == f"`{setting.key}`"
        assert cells[1] == (f"`{setting.flag}`" if setting.flag else "\u2013")
        assert cells[2] == f"`{setting.env}`"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_shown_default_reads_back_as_the_default(setting: Setting) -> None:
    """The default column is written by hand for some settings (``64MiB``); it must
    mean the default, read the way the environment variable would be."""
    cfg = load_config({}, env={setting.env: setting.shown})
    assert getattr(cfg, setting.name) == setting.default

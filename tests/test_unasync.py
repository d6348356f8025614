"""The sync client is generated from the async one: regenerating must change nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "unasync.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_sync_modules_are_what_the_script_writes() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_async_module_has_its_generated_twin() -> None:
    script = _script()
    sources = {p.name for p in script.SOURCE.glob("*.py")}
    targets = {p.name for p in script.TARGET.glob("*.py")}
    assert sources == targets
    for name in sources - script.HAND_WRITTEN:
        first = (script.TARGET / name).read_text().splitlines()[0]
        assert first.startswith("# Generated from tidings/client/_async/"), name


def test_the_rewrite_takes_out_awaits_and_keeps_marked_lines_apart() -> None:
    source = "\n".join(
        [
            "from tidings.client._async.session import AsyncSession",
            "async def f(s: AsyncSession) -> None:",
            "    # ---- async only",
            "    await sleep(0)",
            "    # ---- sync only",
            "    # s._commit_pool()",
            "    # ---- end",
            "    async with s.lock:",
            "        await s.aclose()",
        ]
    )
    assert _script()._lines(source, "example.py") == [
        "from tidings.client._sync.session import Session",
        "def f(s: Session) -> None:",
        "    s._commit_pool()",
        "    with s.lock:",
        "        s.close()",
    ]

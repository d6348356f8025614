"""Write the sync client (tidings/client/_sync/) from the async one (tidings/client/_async/).

The async code is the one source of truth; the sync modules are derived from it by
taking out ``async`` and ``await``, dropping the ``Async`` prefix of names, and a few
renames below. Lines between ``# ---- async only`` and ``# ---- sync only`` are left
out of the sync module; the comment lines between ``# ---- sync only`` and
``# ---- end`` go into it as code. The result is formatted with ruff, as the rest of
the package is.

    python scripts/unasync.py           # rewrite tidings/client/_sync/
    python scripts/unasync.py --check   # exit 1 if a generated file is out of date
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tidings" / "client" / "_async"
TARGET = ROOT / "tidings" / "client" / "_sync"
#: Written by hand on both sides: what the two sides wait on.
HAND_WRITTEN = {"__init__.py", "concurrency.py"}

RENAMES: list[tuple[str, str]] = [
    (r"tidings\.client\._async\b", "tidings.client._sync"),
    (
        r"^from tidings\.client\.asyncio_transport import AsyncioTransport$",
        "from tidings.client.socket_transport import SocketTransport",
    ),
    (r"\bAsyncioTransport\b", "SocketTransport"),
    (r"\bAsyncTransport\b", "SyncTransport"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\baclose\b", "close"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\basyncio client\b", "sync client"),
    (r"\ban async iterator\b", "an iterator"),
]
_RENAMES = [(re.compile(pattern, re.MULTILINE), repl) for pattern, repl in RENAMES]

ASYNC_ONLY = "# ---- async only"
SYNC_ONLY = "# ---- sync only"
END = "# ---- end"


def _lines(source: str, name: str) -> list[str]:
    out: list[str] = []
    mode = "both"
    for number, line in enumerate(source.splitlines(), 1):
        marker = line.strip()
        if marker in (ASYNC_ONLY, SYNC_ONLY, END):
            mode = {ASYNC_ONLY: "async", SYNC_ONLY: "sync", END: "both"}[marker]
            continue
        if mode == "async":
            continue
        if mode == "sync":
            indent = line[: len(line) - len(line.lstrip())]
            text = line.lstrip()
            if text != "#" and not text.startswith("# "):
                raise SystemExit(f"{name}:{number}: a sync-only line must be a comment")
            line = indent + text[2:]
        for pattern, repl in _RENAMES:
            line = pattern.sub(repl, line)
        out.append(line)
    if mode != "both":
        raise SystemExit(f"{name}: a marked block has no {END!r}")
    return out


def _ruff(args: list[str], source: str, filename: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", filename, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode not in (0, 1) or not done.stdout:
        raise SystemExit(f"ruff {' '.join(args)} failed on {filename}: {done.stderr}")
    return done.stdout


def generate(path: Path) -> str:
    """The sync module derived from the async module at ``path``."""
    relative = path.relative_to(ROOT).as_posix()
    header = [
        f"# Generated from {relative} by scripts/unasync.py; do not edit.",
        "",
    ]
    code = "\n".join(header + _lines(path.read_text(), relative)) + "\n"
    target = (TARGET / path.name).relative_to(ROOT).as_posix()
    code = _ruff(["check", "--fix", "--select", "I,F401", "--quiet", "--exit-zero"], code, target)
    return _ruff(["format", "--quiet"], code, target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    args = parser.parse_args()
    stale = []
    for path in sorted(SOURCE.glob("*.py")):
        if path.name in HAND_WRITTEN:
            continue
        target = TARGET / path.name
        code = generate(path)
        if target.exists() and target.read_text() == code:
            continue
        stale.append(target.relative_to(ROOT).as_posix())
        if not args.check:
            target.write_text(code)
    if args.check and stale:
        print("out of date (run python scripts/unasync.py):", *stale, sep="\n  ")
        return 1
    for name in stale:
        print("wrote", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The LMDB store is one process's: a second writer is refused before it changes
anything, while read-only opens (``tidings inspect``) work beside the first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tidings.errors import ServiceUnavailable
from tidings.store.backends.lmdb import LmdbStore


def _open_elsewhere(path: Path, readonly: bool = False) -> subprocess.CompletedProcess[str]:
    """Open the store in another process: prints why it was refused, or (read-only)
    the value of key ``k``."""
    code = textwrap.dedent(
        f"""
        from tidings.errors import ServiceUnavailable
        from tidings.store.backends.lmdb import LmdbStore
        try:
            store = LmdbStore({str(path)!r}, readonly={readonly})
        except ServiceUnavailable as exc:
            print(exc.message)
        else:
            if {readonly}:
                print(store.get("messages", b"k"))
            store.close()
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_second_process_cannot_open_it_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with LmdbStore(path) as store:
        store.apply(lambda v: v.put("messages", b"k", b"v"))
        files = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
        refused = _open_elsewhere(path)
        assert refused.returncode == 0, refused.stderr
        assert refused.stdout.strip() == (
            f"the store {path} is in use by another process (pid {os.getpid()}): "
            "one server per store"
        )
        assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == files
        assert _open_elsewhere(path, readonly=True).stdout == "b'v'\n"
        # In this process too: a second writable open is refused.
        with pytest.raises(ServiceUnavailable, match="in use"):
            LmdbStore(path)
    # Closing releases it.
    assert _open_elsewhere(path).stdout == ""
    with LmdbStore(path) as again:
        assert again.get("messages", b"k") == b"v"


def test_a_store_that_fails_to_open_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with pytest.raises(Exception):  # noqa: B017 - LMDB's own error for a bad map size
        LmdbStore(path, map_size=-1)
    with LmdbStore(path) as store:
        assert store.get("messages", b"k") is None

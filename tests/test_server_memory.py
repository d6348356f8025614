"""The server's allocator settings (tidings.server.memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tidings.server import memory

_GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


@pytest.mark.skipif(not _GLIBC, reason="mallopt thresholds are glibc's")
def test_the_thresholds_are_set_on_glibc() -> None:
    # In a process of its own: the test run's allocator is left as it was.
    code = "from tidings.server.memory import keep_large_buffers as k; print(k())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=True)
    assert done.stdout.strip() == b"True"


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_an_operators_own_setting_wins(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "131072")
    assert memory.keep_large_buffers() is False


def test_another_c_library_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def musl(name: str) -> str | None:
        raise ValueError(name)

    monkeypatch.setattr(memory.os, "confstr", musl)
    assert memory.keep_large_buffers() is False

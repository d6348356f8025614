"""Reloading the auth file (docs/security.md, "Tokens and principals"): each SIGHUP's
reload runs on a worker thread of its own, so two sent close together run at once.
Through the real server: tests/e2e/test_security_model_s30.py."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from tidings.server import auth
from tidings.server.auth import Authenticator


def _file(path: Path, *names: str) -> None:
    path.write_text(
        "".join(
            f'[[principal]]\nname = "{name}"\n'
            f'token_sha256 = "{hashlib.sha256(name.encode()).hexdigest()}"\n'
            for name in names
        )
    )


def test_the_last_reload_wins_when_two_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator revokes a token (the file's second version) just after a first
    # change: the two SIGHUPs' reloads overlap, and the first, which read the older
    # file, must not put the revoked token back after the second put the new file in
    # force.
    path = tmp_path / "auth.toml"
    _file(path, "alice", "mallory")
    authenticator = Authenticator(path)
    read_first = threading.Event()
    go_on = threading.Event()
    load = auth.load_principals
    calls = 0

    def slow_first_load(where: Path) -> tuple[auth.Principal, ...]:
        nonlocal calls
        calls += 1
        found = load(where)
        if calls == 1:  # the first reload stalls between reading the file and using it
            read_first.set()
            assert go_on.wait(10)
        return found

    monkeypatch.setattr(auth, "load_principals", slow_first_load)
    first = threading.Thread(target=authenticator.reload)
    first.start()
    assert read_first.wait(10)
    _file(path, "alice")  # mallory's token revoked
    second = threading.Thread(target=authenticator.reload)
    second.start()
    second.join(0.5)  # done by now, unless it waits for the first
    go_on.set()
    first.join(10)
    second.join(10)
    assert not first.is_alive() and not second.is_alive()
    assert [p.name for p in authenticator.principals] == ["alice"]

"""The exit code of an instance on PostgreSQL whose stop did not finish in time."""

from __future__ import annotations

import pytest

from tidings.server import services


class _Exited(Exception):
    pass


@pytest.mark.parametrize("code", [1, 3])
def test_a_stop_that_does_not_finish_exits_with_the_stops_code(
    code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader whose transaction log failed exits 1 (a supervisor then knows it is
    not a lost lease, exit 3), also when its stop hangs and it exits unclosed."""
    codes: list[int] = []

    def exit_(status: int) -> None:
        codes.append(status)
        raise _Exited

    monkeypatch.setattr(services.os, "_exit", exit_)
    with pytest.raises(_Exited):
        services._exit_unclosed("the transaction log stopped", 35.0, code)
    assert codes == [code]

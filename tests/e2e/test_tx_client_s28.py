"""Write pointers the client cannot name are refused before anything is sent."""

from __future__ import annotations

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("bad", [1.9, True, "12", -1, 0, 2**63])
def test_the_client_refuses_write_pointers_that_are_not_64_bit_integers(
    server: ServerProcess, bad: object
) -> None:
    # A float was truncated (int(1.9) == 1): the call ended another transaction than
    # the one named, and a pointer read as a float (they are ~1.8e18) names a
    # neighbour of it.
    with Client(server.url) as client:
        open_tx = client.begin().write_pointer
        near = float(open_tx)
        before = client.transactions()
        for call in (client.abort, client.invalidate, client.commit):
            with pytest.raises(ValueError, match="write_pointer"):
                call(bad)  # type: ignore[operator]
            with pytest.raises(ValueError, match="write_pointer"):
                call(near)  # type: ignore[operator]
        after = client.transactions()
        assert open_tx in after.in_progress
        assert (after.read_pointer, after.last_write_pointer) == (
            before.read_pointer,
            before.last_write_pointer,
        )
        client.abort(open_tx)

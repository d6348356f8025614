"""``tidings publish`` when a request fails part way."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.cli import main

pytestmark = pytest.mark.e2e


def test_a_publish_failing_part_way_says_how_much_was_published(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # Run again, the whole input would publish the first batch twice: the user has to
    # know it went out.
    srv = start_server(TIDINGS_MAX_BODY_BYTES="1MiB")
    runner = CliRunner()
    env = {"TIDINGS_URL": srv.url}
    assert runner.invoke(main, ["topics", "create", topic], env=env).exit_code == 0
    lines = "a\nb\nc\n" + "x" * 2_000_000 + "\nd\n"
    result = runner.invoke(main, ["publish", topic, "--batch-size", "3"], input=lines, env=env)
    assert result.exit_code == 1
    *before, error = result.stderr.strip().splitlines()
    assert error.startswith("Error: PayloadTooLarge")
    assert f"3 message(s) were published to {topic} before the error below" in before
    with Client(srv.url) as client:
        assert [m.payload for m in client.poll(topic)] == [b"a", b"b", b"c"]

"""The ``tidings`` command on inputs at the edges: start times past 64 bits, topic
properties that look like markup, payloads with control characters, principal names
that need quoting in TOML."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.cli import main
from tidings.server.auth import load_principals

pytestmark = pytest.mark.e2e

Run = Callable[..., Result]

PAST_INT64 = str(2**64)


@pytest.fixture
def run(server: ServerProcess) -> Run:
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None) -> Result:
        return runner.invoke(main, list(args), input=input, env={"TIDINGS_URL": server.url})

    return invoke


def _usage_error(result: Result, option: str) -> None:
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith(f"Error: Invalid value for {option}:"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_start_time_past_64_bits_is_a_usage_error(
    run: Run, server: ServerProcess, topic: str
) -> None:
    """A time in ms the server cannot take is wrong usage (exit 2, nothing sent), as
    every other bad ``--from``/``--to``: ``groups reset`` used to crash with a
    traceback encoding it, and ``consume`` sent it and failed with the server's 400."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a"])
    _usage_error(run("groups", "reset", topic, "g", "--to", PAST_INT64), "--to")
    _usage_error(run("consume", topic, "--from", PAST_INT64), "--from")
    # The largest time the server takes still works.
    assert run("consume", topic, "--from", str(2**63 - 1)).exit_code == 0


def test_inspect_shows_properties_with_brackets_as_they_are(
    run: Run, server: ServerProcess, topic: str
) -> None:
    """Topic properties are printed as text: a value such as ``[/b]`` used to stop
    ``inspect --topic`` with a markup error, and ``[red]x[/red]`` lost its brackets."""
    with Client(server.url) as client:
        client.create_topic(topic, properties={"note": "[/b] end", "colour": "[red]x[/red]"})
        client.publish(topic, [b"hello"])
    result = run("inspect", str(server.data_dir), "--topic", topic)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "'[/b] end'" in result.stdout and "'[red]x[/red]'" in result.stdout
    assert "message 5 B: hello" in result.stdout


def test_inspect_previews_keep_one_line_per_entry(
    run: Run, server: ServerProcess, topic: str
) -> None:
    """A payload's newlines and escape sequences are escaped in the preview: they used
    to split an entry over lines and reach the terminal raw."""
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"one\ntwo\x1b[2Jthree\tfour"])
    result = run("inspect", str(server.data_dir), "--topic", topic)
    assert result.exit_code == 0, (result.output, result.exception)
    entries = result.stdout.splitlines()[2:]  # after the topic line and the header
    assert len(entries) == 1
    assert entries[0].endswith(r"one\ntwo\x1b[2Jthree\tfour")
    assert "\x1b" not in result.stdout


@pytest.mark.parametrize("name", ['ops "night" shift', "back\\slash", "two\nlines", "plain"])
def test_auth_token_lines_read_back_for_any_name(tmp_path: Path, name: str) -> None:
    """The printed auth-file lines are valid TOML naming the principal as given: a
    quote or backslash in ``--name`` used to give a file the server refused."""
    result = CliRunner().invoke(main, ["auth", "token", "--name", name])
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("token: ")
    path = tmp_path / "auth.toml"
    path.write_text("\n".join(lines[2:]) + "\n")
    (principal,) = load_principals(path)
    assert principal.name == name
    # Its group and queue lines are commented out: an empty list would admit none.
    assert principal.groups is None and principal.queues is None
    assert any(line.startswith("# groups = ") for line in lines)


def test_a_token_with_a_line_break_is_a_usage_error(run: Run) -> None:
    """A token with a line break inside is refused before anything is sent (it used to
    go out raw and end the header line, sending the rest as headers of its own); the
    message does not show the token."""
    result = run("--token", "secret-1\r\nX-Forged: yes", "topics", "list")
    _usage_error(result, "--token")
    assert "secret-1" not in result.output


def test_a_token_file_s_final_line_break_is_dropped(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """``TIDINGS_TOKEN="$(cat file)"`` keeps a CRLF file's ``\\r``: the check above
    must not refuse it; the token is used without the space around it, as the server
    reads it."""
    token = "cli-review-token-0123456789"
    digest = hashlib.sha256(token.encode()).hexdigest()
    auth = tmp_path / "auth.toml"
    auth.write_text(f'[[principal]]\nname = "ops"\ntoken_sha256 = "{digest}"\nadmin = true\n')
    server = start_server("--auth-file", str(auth))
    env = {"TIDINGS_URL": server.url, "TIDINGS_TOKEN": token + "\r\n"}
    result = CliRunner().invoke(main, ["topics", "list"], env=env)
    assert result.exit_code == 0, (result.output, result.exception)


def test_tables_show_ids_and_urls_whole_in_80_columns(server: ServerProcess, topic: str) -> None:
    """In 80 columns (a pipe, a small terminal) ``groups describe`` cut the member id
    and the position with "…", so the id `groups reset --to` takes could not be
    copied, and ``cluster`` cut the instance's URL."""
    env = {"TIDINGS_URL": server.url, "COLUMNS": "80"}
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b", b"c"])
        consumer = client.consume(topic, group="g", follow=False, partitions=2)
        try:
            for _ in consumer:
                pass
            consumer.commit()
            info = client.describe_group(topic, "g")
            described = CliRunner().invoke(main, ["groups", "describe", topic, "g"], env=env)
        finally:
            consumer.close()
    assert described.exit_code == 0, (described.output, described.exception)
    assert "…" not in described.stdout
    positions = [p.position.hex for p in info.partitions if p.position is not None]
    assert positions and all(hex_id in described.stdout for hex_id in positions)
    cluster = CliRunner().invoke(main, ["cluster"], env=env)
    assert cluster.exit_code == 0, (cluster.output, cluster.exception)
    assert "…" not in cluster.stdout and server.url in cluster.stdout


def test_inspect_lists_topic_names_whole_however_many_and_long(tmp_path: Path) -> None:
    # Beside a long name and a deleted topic, the listing squeezed the name column in
    # 80 columns and cut names with an ellipsis: the name the next command takes.
    from tidings.messaging import MessagingService
    from tidings.store import LmdbStore

    store = LmdbStore(str(tmp_path / "store"))
    messaging = MessagingService(store)
    messaging.create_topic("default", "t-" + "x" * 120)
    names = [f"t-{i:012x}" for i in range(4)]
    for name in names:
        messaging.create_topic("default", name)
    messaging.create_topic("default", "gone")
    messaging.delete_topic("default", "gone")
    store.close()
    listing = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert listing.exit_code == 0, listing.output
    assert all(f"default/{name} " in listing.output for name in names)
    assert "…" not in listing.output

"""The ``tidings`` command against a real server (in-process through click's runner)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import Client
from tidings.cli import main

pytestmark = pytest.mark.e2e

Run = Callable[..., Result]


@pytest.fixture
def run(server: ServerProcess) -> Run:
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None, ok: bool = True) -> Result:
        result = runner.invoke(main, list(args), input=input, env={"TIDINGS_URL": server.url})
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


def test_topics(run: Run, topic: str) -> None:
    assert "created topic" in run("topics", "create", topic, "--ttl", "600", "-p", "team=a").stdout
    assert topic in run("topics", "list").stdout.split()
    described = json.loads(run("topics", "describe", topic, "--json").stdout)
    assert described["ttl"] == 600 and described["properties"]["team"] == "a"
    run("topics", "update", topic, "--ttl", "60")
    described = json.loads(run("topics", "describe", topic, "--json").stdout)
    assert described["ttl"] == 60 and "team" not in described["properties"]
    assert "ttl         60s" in run("topics", "describe", topic).stdout
    run("topics", "delete", topic)
    assert topic not in run("topics", "list").stdout.split()


def test_errors_are_one_line_and_exit_non_zero(run: Run, topic: str) -> None:
    result = run("topics", "describe", topic, ok=False)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: TopicNotFound: topic default:{topic} does not")
    assert len(result.stderr.strip().splitlines()) == 1
    bad = run("topics", "create", "a/b", ok=False)
    assert bad.exit_code == 1 and "InvalidName" in bad.stderr
    unreachable = CliRunner().invoke(
        main, ["--url", f"http://127.0.0.1:{free_port()}", "topics", "list"]
    )
    assert unreachable.exit_code == 1
    assert unreachable.stderr.startswith("Error: TidingsConnectionError")
    bad_start = run("consume", topic, "--from", "yesterday", ok=False)
    assert bad_start.exit_code == 2 and len(bad_start.stderr.strip().splitlines()) == 1


def test_publish_and_consume(run: Run, topic: str) -> None:
    run("topics", "create", topic)
    run("publish", topic, "one", "two", "--key", "k", "-H", "source=cli")
    published = run("publish", topic, input="three\nfour\n")
    assert "published 2 message(s)" in published.stdout
    tx = run("publish", topic, "--tx", input="five\nsix\n")
    assert "in transaction" in tx.stdout
    assert run("consume", topic).stdout == "one\ntwo\nthree\nfour\nfive\nsix\n"
    assert run("consume", topic, "--limit", "2").stdout == "one\ntwo\n"
    # Pages of one message each: the same output.
    assert run("consume", topic, "--max-bytes", "1").stdout == "one\ntwo\nthree\nfour\nfive\nsix\n"
    assert run("consume", topic, "--max-bytes", "0", ok=False).exit_code == 2
    lines = [
        json.loads(line) for line in run("consume", topic, "--format", "json").stdout.splitlines()
    ]
    assert [m["payload"] for m in lines] == ["one", "two", "three", "four", "five", "six"]
    assert lines[0]["key"] == "k" and lines[0]["headers"] == {"source": "cli"}
    assert lines[2]["key"] is None
    second = lines[1]["id"]
    assert run("consume", topic, "--from", second).stdout.startswith("two\n")
    assert run("consume", topic, "--from", "end").stdout == ""
    assert run("consume", topic, "--from", str(lines[4]["time"])).stdout.startswith("five\n")


def test_binary_payloads_in_json(run: Run, server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, b"\xff\x00")
    line = json.loads(run("consume", topic, "--format", "json").stdout)
    assert line["payload_base64"] == "/wA=" and "payload" not in line


def test_uncommitted_and_tx_admin(run: Run, server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        tx = client.begin()
        client.publish(topic, b"pending", write_pointer=tx.write_pointer)
    assert run("consume", topic).stdout == ""
    assert run("consume", topic, "--uncommitted").stdout == "pending\n"
    listed = json.loads(run("tx", "list", "--json").stdout)
    assert tx.write_pointer in [t["writePointer"] for t in listed["inProgress"]]
    assert str(tx.write_pointer) in run("tx", "list").stdout
    run("tx", "invalidate", str(tx.write_pointer))
    assert tx.write_pointer in json.loads(run("tx", "list", "--json").stdout)["invalid"]
    assert run("consume", topic).stdout == ""
    pruned = run("tx", "prune", str(tx.write_pointer)).stdout
    assert pruned.splitlines() == ["pruned 1 invalid pointer", f"  {tx.write_pointer}"]
    assert tx.write_pointer not in json.loads(run("tx", "list", "--json").stdout)["invalid"]
    assert run("tx", "prune", ok=False).exit_code == 2  # nothing named
    again = run("tx", "abort", "1", ok=False)
    assert again.exit_code == 1 and "TransactionNotFound" in again.stderr


def test_stats(run: Run, topic: str) -> None:
    run("topics", "create", topic)
    run("publish", topic, "abc", "de")
    stats = json.loads(run("stats", topic, "--json").stdout)
    assert stats["messageCount"] == 2 and stats["bytes"] == 5
    assert "messages published" in run("stats", topic).stdout


def test_inspect_reads_the_store_while_the_server_runs(
    run: Run, server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"plain"])
        with client.transaction(payload_threshold=0) as tx:
            tx.publish(topic, [b"stored-1", b"stored-2"])
        open_tx = client.begin()
        info = client.publish(topic, b"undone", write_pointer=open_tx.write_pointer)
        client.rollback(topic, info)
        client.abort(open_tx)
    overview = run("inspect", str(server.data_dir)).stdout
    assert "messages" in overview and f"default/{topic}" in overview
    entries = run("inspect", str(server.data_dir), "--topic", topic, "--payloads").stdout
    assert "message 5 B: plain" in entries
    assert "pointer to 2 payload row(s)" in entries
    assert "payload row 8 B: stored-1" in entries
    assert f"-{open_tx.write_pointer}" in entries and "(rolled back)" in entries
    missing = run("inspect", str(server.data_dir), "--topic", "nope-" + topic, ok=False)
    assert missing.exit_code == 1 and "no topic" in missing.stderr


def test_groups(run: Run, server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b", b"c"])
        member = client.consume(topic, group="cli", follow=False, partitions=2)
        first = member.poll()
        member.commit()
        member.close()
    assert run("groups", "list", topic).output.split() == ["cli"]
    described = json.loads(run("groups", "describe", topic, "cli", "--json").output)
    assert described["lag"] == 0 and described["partitionCount"] == 2
    assert "generation" in run("groups", "describe", topic, "cli").output
    run("groups", "reset", topic, "cli", "--to", "earliest")
    assert json.loads(run("groups", "describe", topic, "cli", "--json").output)["lag"] == 3
    run("groups", "reset", topic, "cli", "--to", first[0].id.hex)
    assert json.loads(run("groups", "describe", topic, "cli", "--json").output)["lag"] == 2
    bad = run("groups", "reset", topic, "cli", "--to", "someday", ok=False)
    assert bad.exit_code == 2
    missing = run("groups", "describe", topic, "nope", ok=False)
    assert missing.exit_code == 1 and "GroupNotFound" in missing.output
    run("groups", "delete", topic, "cli")
    assert run("groups", "list", topic).output.split() == []


def test_queues(run: Run, server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b", b"c"])
    # Without --ack a pop gives the message back: trying by hand takes nothing.
    assert run("pop", topic, "--group", "jobs").output == "a\n"
    assert run("pop", topic, "-g", "jobs", "-n", "2", "--ack").output == "a\nb\n"
    popped = json.loads(run("pop", topic, "-g", "jobs", "--format", "json").output)
    assert popped["payload"] == "c" and popped["deliveryCount"] == 1
    assert f"{topic} jobs" in run("queues", "list").output.splitlines()
    assert run("queues", "list", topic).output.split() == [topic, "jobs"]
    stats = json.loads(run("queues", "stats", topic, "jobs", "--json").output)
    assert (stats["acked"], stats["waiting"], stats["pending"]) == (2, 1, 0)
    assert "waiting (depth)" in run("queues", "stats", topic, "jobs").output
    assert "purged queue jobs" in run("queues", "purge", topic, "jobs").output
    assert json.loads(run("queues", "stats", topic, "jobs", "--json").output)["waiting"] == 0
    missing = run("queues", "stats", topic, "nope", ok=False)
    assert missing.exit_code == 1 and "QueueNotFound" in missing.output
    run("queues", "delete", topic, "jobs")
    assert run("queues", "list", topic).output.split() == []


def test_new_user_frictions(server: ServerProcess, topic: str) -> None:
    runner = CliRunner()
    # --url without a scheme means http://
    bare = server.url.removeprefix("http://")
    ok = runner.invoke(main, ["--url", bare, "topics", "create", topic])
    assert ok.exit_code == 0, ok.output
    # A URL that is none: one line, exit 2, no traceback.
    bad = runner.invoke(main, ["--url", "ftp://x", "topics", "list"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert "not a server URL" in bad.output
    # Tidings' own topics are hidden unless --all.
    with Client(server.url) as client:
        internal = "__tidings_sink_" + topic[-8:]
        client.create_topic(internal)
    env = {"TIDINGS_URL": server.url}
    shown = runner.invoke(main, ["topics", "list"], env=env).output.split()
    assert topic in shown and internal not in shown
    assert internal in runner.invoke(main, ["topics", "list", "--all"], env=env).output.split()


def test_publish_batches_by_bytes_too(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    # 12 lines of 1 MB: one request of them all would be over this server's body limit.
    srv = start_server(TIDINGS_MAX_BODY_BYTES="8MiB")
    env = {"TIDINGS_URL": srv.url}
    runner = CliRunner()
    assert runner.invoke(main, ["topics", "create", topic], env=env).exit_code == 0
    big = "".join(f"{i:02d}" + "x" * 1_000_000 + "\n" for i in range(12))
    for args in (["publish", topic], ["publish", topic, "--tx"]):
        published = runner.invoke(main, args, input=big, env=env)
        assert published.exit_code == 0, published.output
        assert "published 12 message(s)" in published.output
    consumed = runner.invoke(main, ["consume", topic], env=env).stdout.splitlines()
    assert [line[:2] for line in consumed] == [f"{i:02d}" for i in range(12)] * 2


def test_serve_says_where_it_listens(start_server: Callable[..., ServerProcess]) -> None:
    srv = start_server()
    assert f"listening on http://127.0.0.1:{srv.port}\n" in srv.log()


@pytest.mark.parametrize(
    "args",
    [
        ["--url", "http://[bad", "topics", "list"],
        ["--url", "localhost:abc", "topics", "list"],
        ["--url", ":8470", "topics", "list"],
        ["--url", "127.0.0.1:99999", "topics", "list"],
        ["--url", "ftp://x", "topics", "list"],
        ["--bogus"],
        ["topics", "create"],
        ["topics", "create", "t", "--ttl", "0"],
        ["topics", "create", "t", "-p", "novalue"],
        ["consume", "t", "--from", "someday"],
        ["consume", "t", "--from", "-10x"],
        ["groups", "reset", "t", "g", "--to", "2026-13-45"],
        ["tx", "abort", "x"],
        ["tx", "prune"],
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str]) -> None:
    # Nothing is sent: every one of these is refused before a request.
    result = CliRunner().invoke(main, args, env={"TIDINGS_URL": f"127.0.0.1:{free_port()}"})
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "--help" in lines[0]  # where to read more


def test_no_arguments_still_shows_the_help() -> None:
    result = CliRunner().invoke(main, ["topics"])
    assert "Usage:" in result.output and "create" in result.output


def test_positions_by_name_and_by_time(run: Run, server: ServerProcess, topic: str) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"a", b"b"])
    for first in ("beginning", "earliest", "-1h", "2000-01-01T00:00"):
        assert run("consume", topic, "--from", first).stdout == "a\nb\n", first
    for last in ("end", "latest", "-0s", "2999-01-01T00:00"):
        assert run("consume", topic, "--from", last).stdout == "", last
    with Client(server.url) as client:
        member = client.consume(topic, group="g", follow=False)
        assert [m.payload for m in member] == [b"a", b"b"]
        member.commit()
        member.close()

    def lag() -> int:
        described = json.loads(run("groups", "describe", topic, "g", "--json").stdout)
        return int(described["lag"])

    assert lag() == 0
    for where, expected in (("beginning", 2), ("end", 0), ("-1d", 2), ("latest", 0)):
        run("groups", "reset", topic, "g", "--to", where)
        assert lag() == expected, where
    run("groups", "reset", topic, "g", "--to", "2999-01-01T00:00")
    assert lag() == 0


def test_inspect_of_something_that_is_no_store_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"")
    result = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("Error: not a readable LMDB store: ")
    assert len(result.stderr.strip().splitlines()) == 1

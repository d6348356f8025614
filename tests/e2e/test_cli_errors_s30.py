"""The ``tidings`` command on bad input, over every command: unknown and bad names, bad
option values, arguments that are not UTF-8, a wrong token, a server answering errors.
Whatever goes wrong is one line on stderr, exit 1 (an error) or 2 (wrong usage), never
a traceback, and changes nothing; the JSON outputs keep their documented fields."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.serverproc import ServerProcess, free_port
from tidings import Client
from tidings.cli import main

pytestmark = pytest.mark.e2e

Run = Callable[..., Result]

#: Every command that talks to a server, with TOPIC, GROUP and QUEUE to fill in.
COMMANDS = [
    ["topics", "list"],
    ["topics", "create", "{t}"],
    ["topics", "describe", "{t}"],
    ["topics", "describe", "{t}", "--json"],
    ["topics", "update", "{t}", "--ttl", "5"],
    ["topics", "delete", "{t}"],
    ["publish", "{t}", "a"],
    ["publish", "{t}", "--tx", "a"],
    ["consume", "{t}"],
    ["consume", "{t}", "--format", "json"],
    ["stats", "{t}"],
    ["stats", "{t}", "--json"],
    ["groups", "list", "{t}"],
    ["groups", "describe", "{t}", "{g}"],
    ["groups", "describe", "{t}", "{g}", "--json"],
    ["groups", "reset", "{t}", "{g}", "--to", "latest"],
    ["groups", "delete", "{t}", "{g}"],
    ["queues", "list"],
    ["queues", "list", "{t}"],
    ["queues", "stats", "{t}", "{q}"],
    ["queues", "stats", "{t}", "{q}", "--json"],
    ["queues", "purge", "{t}", "{q}"],
    ["queues", "delete", "{t}", "{q}"],
    ["pop", "{t}", "-g", "{q}"],
    ["tx", "list"],
    ["tx", "list", "--json"],
    ["tx", "abort", "5"],
    ["tx", "invalidate", "5"],
    ["tx", "prune", "5"],
    ["cluster"],
    ["cluster", "--json"],
]


def _fill(command: list[str], t: str, g: str = "g", q: str = "q") -> list[str]:
    return [arg.format(t=t, g=g, q=q) for arg in command]


def one_line(result: Result, status: int) -> str:
    """The one line on stderr of a command that failed with ``status``."""
    assert result.exit_code == status, (result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def run(server: ServerProcess) -> Run:
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None, **env: str) -> Result:
        return runner.invoke(main, list(args), input=input, env={"TIDINGS_URL": server.url, **env})

    return invoke


def _state(server: ServerProcess, topic: str) -> tuple[object, ...]:
    """What a failed command must not have changed."""
    with Client(server.url) as client:
        names = client.list_topics()
        if topic not in names:
            return (names,)
        return (names, client.get_topic(topic).ttl, [m.payload for m in client.poll(topic)],
                client.groups(topic), client.queues(topic))  # fmt: skip


def test_unknown_and_bad_names_in_every_command(
    run: Run, server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        client.publish(topic, [b"kept"])
    before = _state(server, topic)
    for command in COMMANDS:
        if "{t}" in " ".join(command) and command[:2] != ["topics", "create"]:
            shown = one_line(run(*_fill(command, "nope-" + topic)), 1)
            assert "TopicNotFound" in shown, (command, shown)
        if "{g}" in " ".join(command):
            shown = one_line(run(*_fill(command, topic, g="nope")), 1)
            assert "GroupNotFound" in shown, (command, shown)
        if "{q}" in " ".join(command) and command[0] != "pop":
            shown = one_line(run(*_fill(command, topic, q="nope")), 1)
            assert "QueueNotFound" in shown, (command, shown)
        for bad in ("a/b", "", "../x", "a b"):
            if "{t}" in " ".join(command):
                shown = one_line(run(*_fill(command, bad)), 1)
                assert "InvalidName: topic name" in shown, (command, shown)
        shown = one_line(run("--namespace", "a/b", *_fill(command, topic)), 1)
        # The transaction commands name no namespace.
        assert "InvalidName" in shown or "Transaction" in shown or command[0] == "cluster", shown
    assert _state(server, topic) == before


@pytest.mark.parametrize(
    "args",
    [
        # These were tracebacks: values past what a request can carry, and infinities.
        ["topics", "create", "{t}", "--ttl", str(2**64)],
        ["topics", "update", "{t}", "--ttl", str(2**64)],
        ["topics", "create", "{t}", "--ttl", str(2**63 // 1000 + 1)],
        ["pop", "{t}", "-g", "q", "--wait", "nan"],
        ["pop", "{t}", "-g", "q", "--wait", "inf"],
        ["pop", "{t}", "-g", "q", "-n", str(2**64)],
        # Arguments that are not UTF-8 where text is needed (a shell passes any bytes).
        ["topics", "create", "{t}", "-p", "team=\udcff"],
        ["topics", "create", "{t}", "-p", "\udcff=a"],
        ["publish", "{t}", "-H", "\udcff=v", "a"],
        ["--url", "\udcff", "topics", "list"],
        ["--url", "http://a..b:1", "topics", "list"],
        ["--url", "\x80:1", "topics", "list"],
        ["--transactions-url", "http://" + "a" * 64, "tx", "list"],
        ["--token", "tok\udcffen", "topics", "list"],
        ["auth", "token", "--name", "\udcff"],
        # And some that were already refused, in every command that takes them.
        ["topics", "create", "{t}", "--ttl", "0"],
        ["topics", "update", "{t}", "-p", "novalue"],
        ["publish", "{t}", "--batch-size", "0", "a"],
        ["consume", "{t}", "--limit", "0"],
        ["consume", "{t}", "--max-bytes", "-1"],
        ["consume", "{t}", "--from", "-1y"],
        ["consume", "{t}", "--format", "xml"],
        ["groups", "reset", "{t}", "g", "--to", "-1y"],
        ["groups", "reset", "{t}", "g", "--to", "0001-01-01T00:00"],
        ["groups", "reset", "{t}", "g", "--to", ""],
        ["groups", "reset", "{t}", "g"],
        ["pop", "{t}", "-g", "q", "--wait", "-1"],
        ["pop", "{t}"],
        ["tx", "abort", str(2**63)],
        ["tx", "prune", "--below", "-1"],
        ["inspect", "{t}-no-such-dir"],
        ["backup", "{t}-no-such-dir", "{t}-dest"],
    ],
)
def test_bad_values_are_wrong_usage_and_change_nothing(
    run: Run, server: ServerProcess, topic: str, args: list[str]
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic, ttl=600)
        client.publish(topic, [b"kept"])
    before = _state(server, topic)
    shown = one_line(run(*_fill(args, topic)), 2)
    assert "--help" in shown  # where to read more
    assert _state(server, topic) == before


def test_arguments_that_are_not_utf8_are_published_as_their_bytes(
    run: Run, server: ServerProcess, topic: str
) -> None:
    """A message, key or header value argument holding bytes that are no UTF-8 (as
    `tidings publish t $'\\xff'` passes) used to fail with a traceback; stdin's lines
    were published as they are, and so are they now."""
    with Client(server.url) as client:
        client.create_topic(topic)
    result = run("publish", topic, "a\udcff", "--key", "k\udcfe", "-H", "h=v\udcfd")
    assert result.exit_code == 0, (result.output, result.exception)
    with Client(server.url) as client:
        (message,) = client.poll(topic)
    assert (message.payload, message.key, message.headers) == (b"a\xff", b"k\xfe", {"h": b"v\xfd"})


def test_a_wrong_token_and_a_forbidden_command_are_one_line(
    start_server: Callable[..., ServerProcess], tmp_path: Path, topic: str
) -> None:
    tokens = {"admin": "admin-token-s30", "reader": "reader-token-s30"}
    rights = {"admin": "admin = true", "reader": 'consume = ["other-*"]'}
    auth = tmp_path / "auth.toml"
    auth.write_text(
        "\n".join(
            f'[[principal]]\nname = "{name}"\n'
            f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n{rights[name]}\n'
            for name, token in tokens.items()
        )
    )
    srv = start_server("--auth-file", str(auth))
    with Client(srv.url, token=tokens["admin"]) as client:
        client.create_topic(topic)
        client.publish(topic, [b"kept"])
        client.queue(topic, "q").pop(1)
        with client.consume(topic, group="g", follow=False) as member:
            next(iter(member))
            member.commit()

    def state() -> tuple[object, ...]:
        with Client(srv.url, token=tokens["admin"]) as client:
            return (client.list_topics(), client.get_topic(topic).ttl,
                    [m.payload for m in client.poll(topic)], client.describe_group(topic, "g").lag,
                    client.describe_queue(topic, "q").waiting)  # fmt: skip

    before = state()
    runner = CliRunner()
    for command in COMMANDS:
        args = _fill(command, topic)
        for token, expected in ((None, "Unauthorized"), ("wrong", "Unauthorized")):
            env = {"TIDINGS_URL": srv.url} | ({} if token is None else {"TIDINGS_TOKEN": token})
            shown = one_line(runner.invoke(main, args, env=env), 1)
            assert shown.startswith(f"Error: {expected}: "), (args, shown)
        as_reader = runner.invoke(main, ["--url", srv.url, "--token", tokens["reader"], *args])
        if as_reader.exit_code != 0:  # what a reader may do (list, cluster) just works
            shown = one_line(as_reader, 1)
            assert "Forbidden" in shown or "NotFound" in shown, (args, shown)
            assert tokens["reader"] not in shown
    assert state() == before


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every request with the class's status and body."""

    status = 503
    body = b"<html>\nService\nUnavailable\n</html>"
    content_type = "text/html"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[Callable[[int, bytes, str], str]]:
    """Starts an HTTP server on 127.0.0.1 that answers every request alike."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: int, body: bytes, content_type: str) -> str:
        handler = type("Handler", (_Answers,), {
            "status": status, "body": body, "content_type": content_type,
        })  # fmt: skip
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_an_error_answer_with_line_breaks_is_still_one_line(
    answering: Callable[[int, bytes, str], str],
) -> None:
    """The server's message goes on the error line as it came: one holding line breaks
    (from a proxy, or a server of another version) made several lines, and an escape
    sequence in it reached the terminal."""
    body = {"error": "first\nsecond\r\n\x1b[2Jthird", "type": "TopicNotFound"}
    answered = [
        answering(404, json.dumps(body).encode(), "application/json"),
        answering(418, json.dumps(body | {"type": "NoSuchType"}).encode(), "application/json"),
        answering(503, b"<html>\nService\nUnavailable\n</html>", "text/html"),
    ]
    runner = CliRunner()
    for url in answered:
        # Every command on the first; a few on the others (a 503 is retried first).
        for command in COMMANDS if url == answered[0] else COMMANDS[:3]:
            shown = one_line(runner.invoke(main, ["--url", url, *_fill(command, "t")]), 1)
            assert "\x1b" not in shown, (command, shown)
    shown = one_line(runner.invoke(main, ["--url", answered[0], "topics", "list"]), 1)
    assert shown == "Error: TopicNotFound: first\\nsecond\\r\\n\\x1b[2Jthird"


def test_the_json_outputs_keep_their_documented_fields(
    run: Run, server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic, properties={"team": "a"})
        client.publish(topic, [b"one", b"two"])
        with client.consume(topic, group="g", follow=False) as member:
            next(iter(member))
            member.commit()
    run("pop", topic, "-g", "q")

    def parsed(*args: str) -> dict[str, object]:
        result = run(*args)
        assert result.exit_code == 0, (result.output, result.exception)
        value = json.loads(result.stdout)
        assert isinstance(value, dict)
        return value

    fields = {
        ("topics", "describe", topic, "--json"): {
            "namespace", "name", "generation", "ttl", "properties"},
        ("stats", topic, "--json"): {
            "namespace", "topic", "messageCount", "bytes", "oldestId", "newestId",
            "oldestTime", "newestTime", "messagesPublished", "bytesPublished", "fetches",
            "publishRate", "fetchRate", "lastStableId", "groupLag"},
        ("groups", "describe", topic, "g", "--json"): {
            "group", "partitionCount", "generation", "start", "members", "partitions",
            "end", "lag"},
        ("queues", "stats", topic, "q", "--json"): {
            "queue", "waiting", "pending", "consumers", "acked", "redelivered",
            "maxDeliveries", "deadLetterTopic"},
        ("tx", "list", "--json"): {"readPointer", "lastWritePointer", "inProgress", "invalid"},
        ("cluster", "--json"): {"store", "instance", "leader", "instances"},
    }  # fmt: skip
    for args, names in fields.items():
        shown = parsed(*args)
        assert names <= set(shown), (args, names - set(shown))
    lines = run("consume", topic, "--format", "json").stdout.splitlines()
    assert [set(json.loads(line)) for line in lines] == [
        {"id", "time", "key", "headers", "payload"}
    ] * 2
    popped = json.loads(run("pop", topic, "-g", "q", "--format", "json").stdout)
    assert {"id", "time", "key", "headers", "payload", "deliveryCount"} <= set(popped)


#: A URL where nothing listens: the values below are checked before anything is sent,
#: or fail at once to connect.
NOWHERE = f"http://127.0.0.1:{free_port()}"

_values = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"-?[0-9]{1,25}(\.[0-9]{0,3})?([smhdy]|e[0-9]{1,3})?", fullmatch=True),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "0x10", "latest", "-0s", "\udcff"]),
)
_options = st.sampled_from(
    [
        ["consume", "t", "--from", "{v}"],
        ["groups", "reset", "t", "g", "--to", "{v}"],
        ["topics", "create", "t", "--ttl", "{v}"],
        ["topics", "update", "t", "-p", "ttl={v}"],
        ["publish", "t", "--batch-size", "{v}", "a"],
        ["publish", "t", "-H", "{v}", "a"],
        ["consume", "t", "--limit", "{v}"],
        ["consume", "t", "--max-bytes", "{v}"],
        ["pop", "t", "-g", "q", "--wait", "{v}"],
        ["pop", "t", "-g", "q", "-n", "{v}"],
        ["tx", "abort", "{v}"],
        ["tx", "prune", "--below", "{v}"],
        ["--url", "{v}", "topics", "list"],
        ["--token", "{v}", "topics", "list"],
        ["--namespace", "{v}", "topics", "list"],
        ["auth", "token", "--name", "{v}"],
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command=_options, value=_values)
def test_any_option_value_is_an_answer_or_one_line(command: list[str], value: str) -> None:
    args = [arg.replace("{v}", value) for arg in command]
    result = CliRunner().invoke(main, args, env={"TIDINGS_URL": NOWHERE})
    if result.exit_code == 0:
        return  # auth token: any UTF-8 name is fine
    one_line(result, result.exit_code)
    assert result.exit_code in (1, 2)


def test_an_interrupted_publish_says_how_much_was_published(
    server: ServerProcess, topic: str
) -> None:
    """Ctrl-C in ``cat lines | tidings publish t`` said only "Aborted!": whoever ran the
    input again published twice what had gone out. It says how many now, as a failed
    request does."""
    with Client(server.url) as client:
        client.create_topic(topic)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidings", "publish", topic, "--batch-size", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TIDINGS_URL": server.url},
    )
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"one\ntwo\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 20
        with Client(server.url) as client:
            while len(client.poll(topic)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        # Stdin stays open (no end of input) until the command has ended.
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        err = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    # The second publish may still wait for its answer: then it is not counted.
    said = rf"[12] message\(s\) were published to {topic} before the interrupt"
    assert re.fullmatch(said, lines[0]), lines
    assert lines[-1] == "Aborted!" and "Traceback" not in err


def test_inspect_shows_every_figure_whole(
    start_server: Callable[..., ServerProcess], topic: str
) -> None:
    """The topics table cut a long figure with "…" in 80 columns (a ttl of
    9223372036854775 s showed as 92233720368547…): a number cut short is another
    number. It folds onto the next line now, as the names do."""
    srv = start_server()
    longest = 2**63 // 1000 - 1
    with Client(srv.url) as client:
        client.create_topic(topic, ttl=longest)
    result = CliRunner().invoke(main, ["inspect", str(srv.data_dir)], terminal_width=80)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if f"default/{topic}" in line)
    cells = [line.split("│")[4].strip() for line in lines[row : row + 2]]
    assert "".join(cells) == str(longest), cells


@pytest.mark.parametrize("command", [["stats", "{t}"], ["cluster"], ["topics", "list"]])
def test_a_reader_gone_early_ends_tables_quietly_too(
    server: ServerProcess, topic: str, command: list[str]
) -> None:
    """``tidings stats t | head -0`` exited 1 (rich's own handling of a closed pipe),
    where ``consume`` and the plain outputs exit 0 quietly, as docs/cli.md says."""
    with Client(server.url) as client:
        client.create_topic(topic)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tidings", *_fill(command, topic)],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, "TIDINGS_URL": server.url},
            timeout=30,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (0, b"")


def test_a_failed_pop_names_the_pop() -> None:
    """With no server at the URL, ``pop`` said that it could not connect for
    ``.../release`` (giving back on exit failed too, and its error took the pop's
    place): the request that failed was the pop."""
    result = CliRunner().invoke(main, ["pop", "t", "-g", "q"], env={"TIDINGS_URL": NOWHERE})
    shown = one_line(result, 1)
    assert shown.startswith("Error: TidingsConnectionError: ") and "/queues/q/pop" in shown, shown


class _BusyThenGone(_Answers):
    """503 with a page of several lines twice, then the topic does not exist."""

    answered = 0

    def _answer(self) -> None:
        type(self).answered += 1
        if type(self).answered > 2:
            self.status, self.content_type = 404, "application/json"
            self.body = json.dumps({"error": "no topic t", "type": "TopicNotFound"}).encode()
        super()._answer()

    do_GET = do_POST = _answer


def test_a_following_consumer_says_an_outage_in_one_line() -> None:
    """``consume --follow`` says that the server stopped answering in one line (docs/
    cli.md), but the error it names came as it was: a proxy's 503 page printed over
    several lines."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BusyThenGone)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        result = CliRunner().invoke(main, ["--url", url, "consume", "t", "--follow"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert result.exit_code == 1, (result.output, result.exception)
    outage, error = result.stderr.strip().splitlines()
    assert outage.startswith("consumer of topic 't': ServiceUnavailable: <html>\\nService"), outage
    assert error == "Error: TopicNotFound: no topic t"


def test_arguments_with_line_breaks_stay_on_the_error_line(
    run: Run, server: ServerProcess, tmp_path: Path
) -> None:
    """An error that quotes what was given (an extra argument, a topic for inspect, a
    directory) printed a line break in it as one: the one line became several."""
    full = tmp_path / "full\nof things"
    full.mkdir()
    (full / "f").write_text("")
    for args, status in (
        (["topics", "list", "\r\nextra"], 2),
        (["inspect", str(server.data_dir), "--topic", "a\nb"], 1),
        (["backup", str(server.data_dir), str(full)], 2),
    ):
        shown = one_line(run(*args), status)
        assert "\\n" in shown, shown

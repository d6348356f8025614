"""The ``tidings`` command's global --timeout, its checks of values the server would
misread or drop (--max-bytes past 64 bits, a ttl given twice, credentials in --url),
and ``publish`` from a slow pipe, which sends each line as it comes."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.cli import main

pytestmark = pytest.mark.e2e


def invoke(*args: str, **env: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def one_line(result: Result, status: int) -> str:
    assert result.exit_code == status, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_timeout_bounds_the_wait_for_a_server_that_never_answers(silent_url: str, how: str) -> None:
    started = time.monotonic()
    if how == "flag":
        result = invoke("--url", silent_url, "--timeout", "0.3", "topics", "list")
    else:
        result = invoke("topics", "list", TIDINGS_URL=silent_url, TIDINGS_TIMEOUT="0.3")
    assert one_line(result, 1).startswith("Error: RequestTimeout: ")
    # Three tries of 0.3 s and their backoffs, not three of 30 s.
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_positive_number_is_wrong_usage(value: str) -> None:
    result = invoke("--url", "127.0.0.1:1", "--timeout", value, "topics", "list")
    assert "--timeout" in one_line(result, 2)


def test_max_bytes_past_64_bits_is_wrong_usage() -> None:
    result = invoke("--url", "127.0.0.1:1", "consume", "t", "--max-bytes", str(2**64))
    assert "--max-bytes" in one_line(result, 2)


@pytest.mark.parametrize("port", ["1", "99999"])
def test_a_url_with_credentials_is_wrong_usage_and_shows_no_password(port: str) -> None:
    result = invoke("--url", f"http://alice:s3cret@127.0.0.1:{port}", "topics", "list")
    shown = one_line(result, 2)
    assert "--url" in shown and "s3cret" not in shown


def test_a_ttl_given_twice_with_two_values_is_wrong_usage(
    server: ServerProcess, topic: str
) -> None:
    url = server.url
    for args in (["--ttl", "10", "-p", "ttl=5"], ["-p", "owner=a", "-p", "owner=b"]):
        one_line(invoke("--url", url, "topics", "create", topic, *args), 2)
        one_line(invoke("--url", url, "topics", "update", topic, *args), 2)
    with Client(server.url) as client:
        assert topic not in client.list_topics()
    done = invoke("--url", url, "topics", "create", topic, "--ttl", "10", "-p", "ttl=10")
    assert done.exit_code == 0, done.output
    with Client(server.url) as client:
        assert client.get_topic(topic).ttl == 10


def test_publish_from_a_slow_pipe_sends_each_line_as_it_comes(
    server: ServerProcess, topic: str
) -> None:
    with Client(server.url) as client:
        client.create_topic(topic)
        env = {**os.environ, "TIDINGS_URL": server.url}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidings", "publish", topic],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"first\n")
            proc.stdin.flush()
            # The pipe stays open: the line must go out after the linger, not at the end.
            deadline = time.monotonic() + 8
            seen: list[bytes] = []
            while not seen and time.monotonic() < deadline:
                seen = [m.payload for m in client.poll(topic, wait=0.5)]
            assert seen == [b"first"]
            # The rest, then the end of the input (communicate closes the pipe).
            out, err = proc.communicate(b"second\nthird", timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert b"published 3 message(s)" in out
        assert [m.payload for m in client.consume(topic, follow=False)] == [
            b"first",
            b"second",
            b"third",
        ]


@pytest.fixture
def garbage_url() -> Iterator[str]:
    """A server answering 200 to everything: ``{}`` to transactions, else no JSON."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = b"{}" if "/v1/transactions/" in self.path else b"<html>ok</html>"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(
    "args",
    [
        ["tx", "abort", "5"],
        ["tx", "invalidate", "5"],
        ["topics", "delete", "t"],
        ["publish", "t", "a"],
    ],
)
def test_a_malformed_success_answer_is_an_error_not_a_success(
    garbage_url: str, args: list[str]
) -> None:
    result = invoke("--url", garbage_url, *args)
    assert one_line(result, 1).startswith("Error: ServerError: ")
    assert "aborted" not in result.stdout and "deleted" not in result.stdout

"""Bearer tokens, permissions and TLS through the real server (issue: security).

Every route of /openapi.json is sent by each kind of principal, and the status must be
what the permission table (tidings/server/permissions.py, docs/security.md) says.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from tests.e2e.serverproc import ServerProcess
from tidings import AsyncClient, Client
from tidings.cli import main
from tidings.errors import Forbidden, TidingsConnectionError, Unauthorized
from tidings.server.permissions import Need, need_of

pytestmark = pytest.mark.e2e

TOKENS = {
    "admin": "admin-token-0123456789",
    "writer": "writer-token-0123456789",
    "reader": "reader-token-0123456789",
    "nobody": "nobody-token-0123456789",
    "teamed": "teamed-token-0123456789",
}


def principal_lines(name: str, **fields: object) -> str:
    digest = hashlib.sha256(TOKENS[name].encode()).hexdigest()
    lines = ["[[principal]]", f'name = "{name}"', f'token_sha256 = "{digest}"']
    for key, value in fields.items():
        rendered = "true" if value is True else repr(value).replace("'", '"')
        lines.append(f"{key} = {rendered}")
    return "\n".join(lines) + "\n"


def auth_file(path: Path, *extra: str) -> Path:
    path.write_text(
        principal_lines("admin", admin=True)
        + principal_lines("writer", publish=["t-*"], transactional_ids=["w-*"])
        + principal_lines("reader", consume=["t-*"])
        + principal_lines("nobody")
        # Consumes the same topics, but only groups and queues of other names.
        + principal_lines("teamed", consume=["t-*"], groups=["other-*"], queues=["other-*"])
        + "".join(extra)
    )
    return path


@pytest.fixture
def secured(start_server: Callable[..., ServerProcess], tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own: for tests that rewrite its auth file, or that go
    through every route (and so leave transactions open that time out later)."""
    path = auth_file(tmp_path / "auth.toml")
    yield start_server("--auth-file", str(path))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with the same auth file for the tests that leave it unchanged (each
    on topics, transactional ids and transactions of its own)."""
    where = tmp_path_factory.mktemp("secured")
    proc = ServerProcess(where / "data", ["--auth-file", str(auth_file(where / "auth.toml"))])
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def bearer(name: str | None) -> dict[str, str]:
    if name is None:
        return {}
    token = TOKENS.get(name, "not-a-known-token")
    return {"Authorization": f"Bearer {token}"}


def allowed(need: Need, who: str) -> bool:
    if who == "admin":
        return True
    return {
        Need.ANY: True,
        Need.BODY: True,
        Need.PUBLISH: who == "writer",
        Need.CONSUME: who in ("reader", "teamed"),
        Need.GROUP: who == "reader",
        Need.QUEUE: who == "reader",
        Need.TOPIC: who in ("writer", "reader", "teamed"),
        Need.ADMIN: False,
    }[need]


def test_every_route_answers_each_principal_as_the_table_says(secured: ServerProcess) -> None:
    spec = httpx.get(secured.url + "/openapi.json").json()
    values = {"ns": "default", "topic": "t-x", "group": "g", "queue": "q", "wp": "1"}
    checked = 0
    for path, operations in spec["paths"].items():
        url = secured.url + path.format(**values)
        for method in operations:
            need = need_of(method.upper(), path)
            for who in ("admin", "writer", "reader", "teamed", "nobody", "stranger", None):
                kwargs: dict[str, object] = {"headers": bearer(who), "timeout": 10}
                if method in ("post", "put"):
                    kwargs["json"] = {}
                status = httpx.request(method.upper(), url, **kwargs).status_code  # type: ignore[arg-type]
                what = f"{method.upper()} {path} as {who}: {status}"
                if need in (Need.OPEN, Need.METRICS):
                    assert status not in (401, 403), what
                elif who in (None, "stranger"):
                    assert status == 401, what
                elif allowed(need, who):
                    assert status not in (401, 403), what
                else:
                    assert status == 403, what
                checked += 1
    assert checked > 200


def test_401_carries_a_challenge_and_403_names_no_token(shared: ServerProcess) -> None:
    url = shared.url + "/v1/namespaces/default/topics"
    answer = httpx.get(url)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert answer.json()["type"] == "Unauthorized"
    wrong = httpx.get(url, headers={"Authorization": "Bearer guess-1234"})
    assert wrong.status_code == 401 and "guess-1234" not in wrong.text
    forbidden = httpx.put(url + "/t-x", json={}, headers=bearer("nobody"))
    assert forbidden.status_code == 403 and TOKENS["nobody"] not in forbidden.text
    assert "nobody" in forbidden.json()["error"]
    # The log names principals, never tokens.
    log = shared.log()
    assert "nobody" in log
    assert all(token not in log for token in TOKENS.values()) and "guess-1234" not in log


def test_refused_requests_change_nothing(shared: ServerProcess) -> None:
    with Client(shared.url, token=TOKENS["admin"]) as admin:
        admin.create_topic("t-kept")
        admin.create_topic("other")
        admin.publish("t-kept", [b"first"])
        before = admin.transactions()
    with Client(shared.url, token=TOKENS["reader"]) as reader:
        with pytest.raises(Forbidden):
            reader.publish("t-kept", [b"not mine"])
        with pytest.raises(Forbidden):
            reader.delete_topic("t-kept")
        with pytest.raises(Forbidden):
            reader.register_producer("w-1")
        assert [m.payload for m in reader.poll("t-kept")] == [b"first"]
        with pytest.raises(Forbidden):
            reader.poll("other")
    with Client(shared.url, token=TOKENS["writer"]) as writer:
        writer.register_producer("w-1")
        with pytest.raises(Forbidden):
            writer.register_producer("x-1")
        with pytest.raises(Forbidden), writer.transaction() as tx:
            tx.publish("t-kept", b"in")
            tx.publish("other", b"not allowed here")
        with pytest.raises(Unauthorized):
            Client(shared.url, token="wrong").list_topics()
    with Client(shared.url, token=TOKENS["admin"]) as admin:
        assert [m.payload for m in admin.poll("t-kept")] == [b"first"]
        assert admin.poll("other") == []
        after = admin.transactions()
        assert after.invalid == before.invalid
        assert set(admin.list_topics()) >= {"t-kept", "other"}


async def test_async_client_and_cli_send_the_token(shared: ServerProcess) -> None:
    async with AsyncClient(shared.url, token=TOKENS["admin"]) as client:
        await client.create_topic("t-async")
        await client.publish("t-async", [b"x"])
    runner = CliRunner()
    env = {"TIDINGS_URL": shared.url, "TIDINGS_TOKEN": TOKENS["reader"]}
    ok = runner.invoke(main, ["consume", "t-async"], env=env)
    assert ok.exit_code == 0 and ok.stdout == "x\n", ok.output
    denied = runner.invoke(main, ["--token", TOKENS["nobody"], "consume", "t-async"], env=env)
    assert denied.exit_code == 1 and "Forbidden" in denied.output


def test_sighup_reloads_the_auth_file(secured: ServerProcess, tmp_path: Path) -> None:
    assert secured.proc is not None
    url = secured.url + "/v1/namespaces/default/topics"
    late = {"Authorization": "Bearer late-token-0123456789"}
    assert httpx.get(url, headers=late).status_code == 401
    TOKENS["late"] = "late-token-0123456789"
    try:
        auth_file(tmp_path / "auth.toml", principal_lines("late"))
    finally:
        del TOKENS["late"]
    os.kill(secured.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while httpx.get(url, headers=late).status_code != 200:
        assert time.monotonic() < deadline, secured.log()[-2000:]
        time.sleep(0.05)
    # A broken file is refused and changes nothing.
    (tmp_path / "auth.toml").write_text("[[principal]]\nname = 3\n")
    os.kill(secured.proc.pid, signal.SIGHUP)
    time.sleep(0.5)
    assert httpx.get(url, headers=late).status_code == 200
    assert "auth file not reloaded" in secured.log()


def test_a_bad_auth_file_stops_the_start(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[principal]]\nname = "x"\ntoken_sha256 = "abc"\n')
    with pytest.raises(RuntimeError, match="token_sha256 must be 64 hex digits"):
        start_server("--auth-file", str(bad))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate with")
    done = subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        capture_output=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {done.stderr.decode()[-200:]}")
    return cert, key


async def test_tls_round_trip_with_a_certificate_made_here(
    start_server: Callable[..., ServerProcess], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    srv = start_server("--tls-cert", str(cert), "--tls-key", str(key))
    assert srv.url.startswith("https://")
    assert f"listening on {srv.url}" in srv.log()
    with Client(srv.url, verify=str(cert)) as client:
        client.create_topic("tls")
        client.publish("tls", [b"over tls"])
        assert [m.payload for m in client.poll("tls")] == [b"over tls"]
        # A body large enough to be sent beside its head rather than joined to it.
        client.publish("tls", [b"L" * 4096] * 100)
        assert len(client.poll("tls", limit=200)) == 101
    async with AsyncClient(srv.url, verify=str(cert)) as client:
        assert [m.payload for m in await client.poll("tls")][:1] == [b"over tls"]
        await client.publish("tls", [b"A" * 4096] * 100)
        assert len(await client.poll("tls", limit=300)) == 201
    with pytest.raises(TidingsConnectionError), Client(srv.url) as untrusting:
        untrusting.list_topics()  # the system's CAs do not know this certificate
    plain = srv.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(plain + "/healthz", timeout=2)


def test_metrics_need_a_token_only_with_metrics_auth(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = auth_file(tmp_path / "auth.toml")
    open_metrics = start_server("--auth-file", str(path))
    assert httpx.get(open_metrics.url + "/metrics").status_code == 200
    guarded = start_server("--auth-file", str(path), TIDINGS_METRICS_AUTH="true")
    assert httpx.get(guarded.url + "/metrics").status_code == 401
    assert httpx.get(guarded.url + "/metrics", headers=bearer("nobody")).status_code == 200
    assert httpx.get(guarded.url + "/healthz").status_code == 200


def test_ending_a_producers_transaction_takes_its_transactional_id(
    shared: ServerProcess,
) -> None:
    # Leaving the transactional id out of a commit or abort (the anonymous path) must
    # not let a principal end a transaction a producer began under an id it may not
    # use: that would be more than the fencing that registering the id takes.
    with Client(shared.url, token=TOKENS["admin"]) as admin:
        admin.create_topic("t-exactly-once")
    with (
        Client(shared.url, token=TOKENS["writer"]) as writer,
        Client(shared.url, token=TOKENS["reader"]) as reader,
        Client(shared.url, token=TOKENS["nobody"]) as nobody,
    ):
        epoch = writer.register_producer("w-1").epoch
        tx = writer.begin(transactional_id="w-1", epoch=epoch)
        info = writer.publish("t-exactly-once", [b"once"], write_pointer=tx.write_pointer)
        for stranger in (reader, nobody):
            with pytest.raises(Forbidden, match="may not end transaction") as refused:
                stranger.abort(tx)
            assert "w-1" not in str(refused.value)  # nor does it learn the id
            with pytest.raises(Forbidden, match="may not end transaction"):
                stranger.commit(tx)
            with pytest.raises(Forbidden, match="transactional id 'w-1'"):
                stranger.commit(tx, transactional_id="w-1", epoch=epoch)
        with Client(shared.url, token=TOKENS["admin"]) as admin:
            assert tx.write_pointer in admin.transactions().in_progress  # nothing changed
        writer.commit(tx, transactional_id="w-1", epoch=epoch)
        assert [m.payload for m in reader.poll("t-exactly-once")] == [b"once"]
        assert info.write_pointer == tx.write_pointer
        # Its holder may leave the id out (it may use it), and so may an admin.
        writer.abort(writer.begin(transactional_id="w-1", epoch=epoch))
        with Client(shared.url, token=TOKENS["admin"]) as admin:
            admin.abort(writer.begin(transactional_id="w-1", epoch=epoch))
        # A transaction begun without an id stays anyone's to end (docs/transactions.md).
        nobody.abort(reader.begin())
    # The refusals are logged with the principal's name.
    assert '"principal":"nobody","route":"/v1/transactions/{wp}/abort"' in shared.log()


def test_invalidating_a_transaction_takes_what_ending_it_takes(shared: ServerProcess) -> None:
    # The clients invalidate their own transaction where a rollback failed or a
    # commit's answer was lost: a producer that may end its transaction may invalidate
    # it, and a stranger may not invalidate a producer's transaction.
    with (
        Client(shared.url, token=TOKENS["writer"]) as writer,
        Client(shared.url, token=TOKENS["reader"]) as reader,
        Client(shared.url, token=TOKENS["admin"]) as admin,
    ):
        epoch = writer.register_producer("w-2").epoch
        held = writer.begin(transactional_id="w-2", epoch=epoch)
        with pytest.raises(Forbidden, match="may not end transaction"):
            reader.invalidate(held)
        assert held.write_pointer in admin.transactions().in_progress  # nothing changed
        writer.invalidate(held)
        assert held.write_pointer in admin.transactions().invalid
        # A transaction begun without an id is anyone's to end, and so to invalidate.
        anonymous = writer.begin()
        reader.invalidate(anonymous)
        assert anonymous.write_pointer in admin.transactions().invalid


def test_a_rollback_after_the_commit_leaves_the_committed_messages(
    shared: ServerProcess,
) -> None:
    # A rollback naming a committed transaction changes nothing: neither its client,
    # which lost the commit's answer, nor anyone else who may publish to the topic can
    # take committed messages away from read-committed readers.
    with Client(shared.url, token=TOKENS["admin"]) as admin:
        admin.create_topic("t-kept-after-commit")
    with (
        Client(shared.url, token=TOKENS["writer"]) as writer,
        Client(shared.url, token=TOKENS["admin"]) as other,
        Client(shared.url, token=TOKENS["reader"]) as reader,
    ):
        tx = writer.begin()
        info = writer.publish("t-kept-after-commit", [b"committed"], write_pointer=tx.write_pointer)
        writer.commit(tx)
        for who in (writer, other):
            assert who.rollback("t-kept-after-commit", info) == 0
        committed = reader.poll("t-kept-after-commit", isolation="read_committed")
        assert [m.payload for m in committed] == [b"committed"]
        # Before the commit, and after an abort, a rollback does what it always did.
        for end in ("before", "after"):
            tx = writer.begin()
            info = writer.publish("t-kept-after-commit", [b"no"], write_pointer=tx.write_pointer)
            if end == "after":
                writer.abort(tx)
            assert writer.rollback("t-kept-after-commit", info) == 1
            if end == "before":
                writer.abort(tx)
        committed = reader.poll("t-kept-after-commit", isolation="read_committed")
        assert [m.payload for m in committed] == [b"committed"]


@pytest.mark.parametrize(
    "header",
    [b"", b"Bearer", b"Bearer\tx", b"Basic YTpi", b"Token x", b"Bearer \xff\xfe", b"Bearer a b",
     b"Bearer " + b"x" * 20_000],
)  # fmt: skip
def test_a_malformed_authorization_header_is_401(shared: ServerProcess, header: bytes) -> None:
    answer = httpx.get(
        shared.url + "/v1/namespaces/default/topics", headers={b"Authorization": header}
    )
    assert answer.status_code == 401, answer.text
    assert answer.json()["type"] == "Unauthorized"
    assert answer.headers["www-authenticate"].startswith("Bearer")


def test_a_reload_holds_for_connections_already_open(
    secured: ServerProcess, tmp_path: Path
) -> None:
    assert secured.proc is not None
    topics = secured.url + "/v1/namespaces/default/topics"
    with httpx.Client(headers=bearer("reader")) as kept_alive:
        assert kept_alive.get(topics).status_code == 200
        before = kept_alive.post(topics + "/t-x/poll", json={})  # the hot path too
        assert before.status_code in (200, 404)
        # The reader goes: the same connection is refused from the reload on.
        (tmp_path / "auth.toml").write_text(
            principal_lines("admin", admin=True) + principal_lines("writer", publish=["t-*"])
        )
        os.kill(secured.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while kept_alive.get(topics).status_code != 401:
            assert time.monotonic() < deadline, secured.log()[-2000:]
            time.sleep(0.05)
        assert kept_alive.post(topics + "/t-x/poll", json={}).status_code == 401
        assert kept_alive.post(topics + "/t-x/queues/q/pop", json={}).status_code == 401

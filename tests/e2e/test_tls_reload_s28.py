"""Renewing the TLS certificate: replace the files, SIGHUP, and new connections get the
new one without a restart; a pair that does not load leaves the old one serving."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import TidingsConnectionError

pytestmark = pytest.mark.e2e


def make_pair(where: Path, name: str) -> tuple[Path, Path]:
    cert, key = where / f"{name}-cert.pem", where / f"{name}-key.pem"
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate with")
    done = subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        capture_output=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {done.stderr.decode()[-200:]}")
    return cert, key


def trusts(url: str, cert: Path) -> bool:
    try:
        with Client(url, verify=str(cert)) as client:
            client.list_topics()
    except TidingsConnectionError:
        return False
    return True


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_sighup_reloads_a_renewed_certificate(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    old_cert, old_key = make_pair(tmp_path, "old")
    new_cert, new_key = make_pair(tmp_path, "new")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copyfile(old_cert, cert)
    shutil.copyfile(old_key, key)
    srv = start_server("--tls-cert", str(cert), "--tls-key", str(key))
    assert srv.proc is not None
    assert trusts(srv.url, old_cert) and not trusts(srv.url, new_cert)

    # Half-renewed (the new certificate, the old key): refused, the old pair serves on.
    shutil.copyfile(new_cert, cert)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "TLS certificate not reloaded" in srv.log())
    assert trusts(srv.url, old_cert)

    shutil.copyfile(new_key, key)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: trusts(srv.url, new_cert)), srv.log()
    assert not trusts(srv.url, old_cert)
    assert srv.proc.poll() is None  # still the same process

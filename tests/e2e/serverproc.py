"""Start and stop real ``tidings serve`` processes for black-box tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    """A running ``tidings serve`` subprocess on 127.0.0.1."""

    data_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        scheme = "https" if "--tls-cert" in self.args else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        """Launch and wait until ``/healthz`` answers (or fail with the server's log).

        A port picked here can be taken by another process before the server binds
        it; then the start is retried on a fresh port.
        """
        picked = not self.port
        for _ in range(3):
            try:
                return self._start(timeout)
            except RuntimeError as exc:
                if not (picked and "address already in use" in str(exc).lower()):
                    raise
                self.port = 0
        return self._start(timeout)

    def _start(self, timeout: float) -> ServerProcess:
        self.launch()
        return self.wait_healthy(timeout)

    def launch(self) -> ServerProcess:
        """Start the process without waiting for it to answer (an instance that stands
        by for the leader lease does not listen until it leads)."""
        self.port = self.port or free_port()
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"
        cmd = [
            sys.executable, "-m", "tidings", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-dir", str(self.data_dir), *self.args,
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the process stops
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        log.close()
        return self

    def wait_healthy(self, timeout: float = 20.0) -> ServerProcess:
        """Wait until ``/healthz`` answers (or fail with the server's log)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                # A test's own certificate: whether it is trusted is that test's business.
                answer = httpx.get(self.url + "/healthz", timeout=0.5, verify=False)
                if answer.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                # Not a failure (a loaded machine may be that slow), but a server that
                # ignores SIGTERM this long is an operations defect, and a session
                # fixture's stop is otherwise only a slow teardown in the durations: say
                # which server it was, past pytest's capture.
                tail = "\n".join(self.log().splitlines()[-15:])
                print(
                    f"\n{self.url} ({' '.join(self.args)}) did not exit within {timeout:g} s"
                    f" of SIGTERM; killed. Its log ends:\n{tail}",
                    file=sys.__stderr__,
                    flush=True,
                )
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the crash tests' way to stop a server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class LeadingServerProcess(ServerProcess):
    """A server on a PostgreSQL store whose start (and restart) returns once it leads:
    restarted after a kill -9, it stands by until the killed one's lease passes."""

    def start(self, timeout: float = 20.0) -> ServerProcess:
        super().start(timeout)
        wait_leading(self, timeout)
        return self


def readiness(proc: ServerProcess) -> str | None:
    """What ``/readyz`` says of ``proc`` ("ready", "forwarding", ...); None if it does
    not answer."""
    try:
        return str(httpx.get(proc.url + "/readyz", timeout=0.5).json()["status"])
    except (httpx.HTTPError, ValueError):
        return None


def wait_leading(proc: ServerProcess, timeout: float) -> float:
    """Seconds until ``proc`` leads (its /readyz says "ready", not "forwarding")."""
    began = time.monotonic()
    while readiness(proc) != "ready":
        assert proc.proc is not None and proc.proc.poll() is None, proc.log()
        assert time.monotonic() - began < timeout, f"no takeover in {timeout} s:\n{proc.log()}"
        time.sleep(0.02)
    return time.monotonic() - began

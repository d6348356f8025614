"""``tidings backup`` while a server publishes: the copy starts as a server and holds
every message acknowledged before the backup began."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import tidings.backup
from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.cli import main

pytestmark = pytest.mark.e2e


def test_backup_while_publishing_restores_every_acknowledged_message(
    start_server: Callable[..., ServerProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = start_server(data_dir=tmp_path / "live")
    with Client(live.url) as client:
        client.create_topic("orders")
    acked: list[bytes] = []
    stop = threading.Event()

    def publish(tag: str) -> None:
        with Client(live.url) as client:
            for i in range(100_000):
                if stop.is_set():
                    return
                batch = [f"{tag}-{i}-{j}".encode() for j in range(5)]
                client.publish("orders", batch)
                acked.extend(batch)
                # One-request transactions: their commit records ride on store writes.
                with client.transaction() as tx:
                    tx.publish("orders", f"{tag}-tx-{i}".encode())
                acked.append(f"{tag}-tx-{i}".encode())
                # A transaction of several calls: its records go to the log file.
                with client.transaction() as tx:
                    tx.publish("orders", f"{tag}-long-{i}".encode())
                    tx.publish("orders", f"{tag}-long2-{i}".encode())
                acked.extend([f"{tag}-long-{i}".encode(), f"{tag}-long2-{i}".encode()])

    copy_tx = tidings.backup._copy_tx_files

    def slow_copy(source: Path, target: Path) -> dict[int, int]:
        # Publishing goes on between the two copies, as it does on a busy server.
        logs = copy_tx(source, target)
        time.sleep(2.0)
        return logs

    monkeypatch.setattr(tidings.backup, "_copy_tx_files", slow_copy)
    workers = [threading.Thread(target=publish, args=(tag,)) for tag in "abcd"]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1.0)
        before = list(acked)
        result = CliRunner().invoke(main, ["backup", str(live.data_dir), str(tmp_path / "copy")])
        time.sleep(0.3)
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "backed up" in result.stdout
    assert before

    # Every pointer an entry of the copy carries is one the restored server knows (and
    # will not hand out again): committed, or invalid for good.
    runner = CliRunner()
    entries = runner.invoke(
        main, ["inspect", str(tmp_path / "copy"), "--topic", "orders", "--limit", "1000000"]
    ).stdout
    pointers = [
        abs(int(fields[3]))
        for line in entries.splitlines()
        if len(fields := line.split()) > 4
        and fields[0].isdigit()
        and len(fields[2]) == 40  # an entry's line (not a message of a batch entry)
        and fields[3].lstrip("-").isdigit()
    ]
    restored = start_server(data_dir=tmp_path / "copy")
    state = json.loads(runner.invoke(main, ["--url", restored.url, "tx", "list", "--json"]).stdout)
    unknown = [wp for wp in pointers if wp > state["lastWritePointer"]]
    assert pointers and not unknown
    with Client(restored.url) as client:
        # New transactions after the restore: none may take over a pointer whose old
        # entries are in the copy (they would show with its commit).
        for i in range(300):
            with client.transaction() as tx:
                tx.publish("orders", f"after-{i}".encode())
                tx.publish("orders", f"after2-{i}".encode())
        got = {m.payload for m in client.consume("orders", follow=False)}
        assert not [m for m in before if m not in got]
        # Nothing of a transaction shows without the rest of it.
        partial = [p for p in got if b"-long-" in p and p.replace(b"-long-", b"-long2-") not in got]
        assert not partial
        assert {f"after-{i}".encode() for i in range(300)} <= got


def test_backup_refuses_a_destination_in_use(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "tx").mkdir(parents=True)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "something").write_text("x")
    result = CliRunner().invoke(main, ["backup", str(data), str(dest)])
    assert result.exit_code == 2
    assert "is not empty" in result.stderr and "Traceback" not in result.output


def test_backup_of_a_directory_without_data(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["backup", str(tmp_path), str(tmp_path / "dest")])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and "no store/ and no tx/" in result.stderr

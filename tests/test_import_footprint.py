"""A client user's ``import tidings`` loads the client (on first use of its names), not
the server's machinery nor HTTP libraries its default transports do not use; a server
start loads no client module."""

from __future__ import annotations

import subprocess
import sys


def test_import_tidings_loads_no_server_side_module() -> None:
    code = (
        "import sys, tidings\n"
        "tidings.Client\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('tidings')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "tidings.client" in out  # the check itself sees what was loaded
    server_side = ("tidings.tx", "tidings.store", "tidings.server", "tidings.messaging")
    loaded = [m for m in out if m.startswith(server_side)]
    assert loaded == []


def test_import_tidings_loads_no_http_library_the_defaults_do_not_use() -> None:
    # The default transports are the project's own; urllib3 (a fifth of the import
    # time) and aiohttp load only for whoever passes their transports.
    code = "import sys, tidings\ntidings.Client\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "tidings.client.transports" in out
    assert "urllib3" not in out and "aiohttp" not in out


def test_the_server_loads_no_client_module() -> None:
    # Every server start (hundreds in the test suite) would pay for the whole client.
    code = (
        "import sys, tidings.cli, tidings.server.main\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('tidings')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "tidings.server.main" in out
    assert [m for m in out if m.startswith("tidings.client")] == []


def test_the_client_names_load_on_first_use() -> None:
    code = (
        "import sys, tidings\n"
        "before = 'tidings.client' in sys.modules\n"
        "from tidings import *\n"
        "print(before, Client is tidings.client.Client, 'AsyncQueue' in dir(tidings))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert out == ["False", "True", "True"]

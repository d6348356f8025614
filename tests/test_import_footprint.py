"""A client user's ``import tidings`` loads the client, not the server's machinery nor
HTTP libraries its default transports do not use."""

from __future__ import annotations

import subprocess
import sys


def test_import_tidings_loads_no_server_side_module() -> None:
    code = (
        "import sys, tidings\n"
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
    code = "import sys, tidings\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "tidings.client.transports" in out
    assert "urllib3" not in out and "aiohttp" not in out

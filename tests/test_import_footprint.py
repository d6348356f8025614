"""A client user's ``import tidings`` loads the client, not the server's machinery."""

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

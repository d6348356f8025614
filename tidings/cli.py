"""The ``tidings`` command: run the server, administer topics, publish, consume, inspect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

__all__ = ["main"]


@click.group()
@click.version_option(package_name="tidings")
def main() -> None:
    """Tidings: a transactional messaging system."""


@main.command()
@click.option("--host", default=None, help="Interface to listen on [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="TCP port [default: 8470].")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the embedded store and the transaction log live [default: ./tidings-data].",
)
@click.option(
    "--role",
    type=click.Choice(["all", "messaging", "transactions"]),
    default=None,
    help="Which services this process runs [default: all].",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A TOML configuration file (flags win over it, it wins over TIDINGS_* variables).",
)
def serve(
    host: str | None,
    port: int | None,
    data_dir: Path | None,
    role: str | None,
    config_file: Path | None,
) -> None:
    """Run the messaging and transaction services on the embedded store."""
    from tidings.server.config import load_config
    from tidings.server.main import run

    overrides: dict[str, Any] = {
        k: v
        for k, v in {"host": host, "port": port, "data_dir": data_dir, "role": role}.items()
        if v is not None
    }
    raise SystemExit(run(load_config(overrides, config_file=config_file)))

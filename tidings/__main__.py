"""``python -m tidings`` runs the ``tidings`` command."""

from tidings.cli import main

main()

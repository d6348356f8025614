"""The web console's static files (``static/``), served by ``tidings serve`` at
``/console/`` (:mod:`tidings.server.routes.console`; docs/console.md).

A page and one script without a build step: the script calls the REST API with the
user's token, so the console can show and do exactly what that token may.
"""

"""The HTTP server: CDAP TMS's REST API plus Tidings' additions (docs/api.md).

``tidings serve`` calls :func:`tidings.server.config.load_config` and
:func:`tidings.server.main.run`. Modules, one idea each:

- ``config``: settings and their sources (flags > ``TIDINGS_*`` > TOML > defaults)
- ``services``: opening and closing the store, messaging and transaction services per role
- ``app``, ``handlers``, ``bodies``: the ASGI app, the error boundary, request bodies
- ``routes/``: ``messaging``, ``transactions`` and ``ops`` endpoints
- ``longpoll``: waking parked polls on commit
- ``metrics``, ``openapi``, ``logs``: Prometheus, the OpenAPI document, JSON log lines
- ``main``: uvicorn, signals, exit codes
"""

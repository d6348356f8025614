# The server as a non-root user with its data on a volume: on the embedded store (LMDB)
# by default, on PostgreSQL with TIDINGS_STORE=postgresql://... (the extra is installed).
# Build: docker build -t tidings .  Run: docker compose up (see compose.yaml)
FROM python:3.11-slim

RUN useradd --create-home --uid 10001 tidings
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tidings ./tidings
COPY pyspark_tidings ./pyspark_tidings
RUN pip install --no-cache-dir ".[postgres]" && mkdir -p /data && chown tidings /data

USER tidings
VOLUME ["/data"]
EXPOSE 8470
# Every setting comes from these variables (or a TOML file via TIDINGS_CONFIG), none
# from flags in CMD: a flag would win over `docker run -e TIDINGS_...` (docs/configuration.md).
ENV TIDINGS_DATA_DIR=/data TIDINGS_HOST=0.0.0.0 TIDINGS_PORT=8470
# The port and scheme the server was given, so the check follows TIDINGS_PORT and TLS.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import os, ssl, sys, urllib.request as u; tls = bool(os.environ.get('TIDINGS_TLS_CERT')); url = ('https' if tls else 'http') + '://127.0.0.1:' + os.environ.get('TIDINGS_PORT', '8470') + '/readyz'; sys.exit(u.urlopen(url, timeout=2, context=ssl._create_unverified_context() if tls else None).status != 200)"
CMD ["tidings", "serve"]

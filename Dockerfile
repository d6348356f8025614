# The server as a non-root user with its data on a volume: on the embedded store (LMDB)
# by default, on PostgreSQL with --store postgresql://... (the extra is installed).
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
ENV TIDINGS_DATA_DIR=/data TIDINGS_HOST=0.0.0.0
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8470/readyz', timeout=2).status != 200)"
CMD ["tidings", "serve", "--host", "0.0.0.0", "--port", "8470", "--data-dir", "/data"]

# The same install step as `make install` (scripts/install.sh); tests/test_process.py runs the
# CMD and the HEALTHCHECK below against a real proxy.
FROM python:3.11-slim
WORKDIR /app
RUN useradd --create-home --uid 10001 proxy
COPY pyproject.toml README.md config.yaml ./
COPY scripts ./scripts
COPY proxy ./proxy
RUN scripts/install.sh /opt/venv && mkdir -p /app/data && chown proxy /app/data
ENV PATH=/opt/venv/bin:$PATH \
    CONTEXT_PROXY_SERVER__HOST=0.0.0.0 \
    CONTEXT_PROXY_STORAGE__PATH=/app/data
USER proxy
EXPOSE 8080
VOLUME ["/app/data"]
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s CMD ["python", "-m", "proxy.healthcheck"]
CMD ["context-proxy", "serve", "--config", "config.yaml"]

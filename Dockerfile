# claimscope: one image for the web server, the Celery workers and beat (the command picks the role).
# Build: docker build -t claimscope:dev .   Run: see docker-compose.yml and docs/operations.md.

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# The lock file pins every package; all of them ship manylinux wheels, so no compiler is needed.
COPY requirements/base.txt /tmp/requirements.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --require-virtualenv -r /tmp/requirements.txt

FROM python:3.11.14-slim-bookworm
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=dashboard.settings \
    STATIC_ROOT=/app/staticfiles \
    CLAIMSCOPE_DATA_DIR=/tmp/claimscope
RUN groupadd --system --gid 10001 claimscope \
    && useradd --system --uid 10001 --gid claimscope --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin claimscope
WORKDIR /app
COPY --from=build /opt/venv /opt/venv
# Application files stay owned by root: the app user can read them, not change them.
COPY manage.py pyproject.toml ./
COPY dashboard ./dashboard
COPY fleet ./fleet
COPY claims ./claims
COPY usage ./usage
COPY web ./web
COPY simulator ./simulator
COPY templates ./templates
COPY static ./static
# Static files are collected at build time (WhiteNoise serves them); the key below exists only for this
# step, which never signs anything. Bytecode is compiled now because the root filesystem is read-only.
RUN SECRET_KEY=build-time-only-collectstatic-never-signs-anything \
    python manage.py collectstatic --noinput \
    && python -m compileall -q dashboard fleet claims /opt/venv/lib
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# uvicorn: HTTP + websockets (Channels). --no-proxy-headers: the app itself believes forwarded headers
# from TRUSTED_PROXIES only (uvicorn would believe 127.0.0.1 by default).
CMD ["uvicorn", "dashboard.asgi:application", "--host", "0.0.0.0", "--port", "8000", \
     "--lifespan", "off", "--no-proxy-headers", "--no-server-header"]

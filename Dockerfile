# The planner's HTTP service (api/): `docker build -t planner . && docker run -p 8000:8000 planner`
# Plans and jobs live in /data (mount a volume to keep them), or in PostgreSQL with
# PLANNER_DATABASE_URL=postgresql://... for replicas (docker-compose.yml: PostgreSQL and two
# replicas); PLANNER_* variables set limits and keys (README, "The HTTP service"). torch is
# not installed: the service never runs the executor. Every package is pinned, with its
# hash, in requirements.lock (python scripts/lock_service.py writes it from pyproject.toml);
# the project itself is installed without dependencies, so nothing unpinned comes in.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY cost_models ./cost_models
COPY planner ./planner
COPY api ./api
COPY fixtures ./fixtures
RUN pip install --no-deps --no-build-isolation . \
    && pip check \
    && useradd --create-home --uid 10001 planner \
    && mkdir -p /data \
    && chown planner:planner /data

USER planner
ENV PLANNER_DB_PATH=/data/planner.sqlite3
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]

CMD ["planner", "serve", "--host", "0.0.0.0", "--port", "8000"]

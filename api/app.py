"""The app factory: settings, store, solver pool and metrics live on `app.state`; the lifespan
starts the pool (and re-runs jobs a stopped server left unfinished) and stops it."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from api.body import BodyBudget
from api.docs import docs_router
from api.jobs import JobRunner
from api.metrics import Metrics, MetricsMiddleware
from api.openapi import build_openapi
from api.problems import install_handlers
from api.routes_health import health_router, metrics_router
from api.routes_plans import router as plans_router
from api.routes_tools import router as tools_router
from api.security import KeyRing, require_api_key
from api.settings import ServiceSettings
from api.store import open_store

log = logging.getLogger("planner.service")

DESCRIPTION = """Plans the sharding of a DLRM's embedding tables over GPUs and hosts with the same
`planner.plan()` the CLI calls. Errors are RFC 9457 problem details."""


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings or ServiceSettings.from_env()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await asyncio.to_thread(open_store, settings)
        runner = JobRunner(settings, store, metrics)
        app.state.runner = runner
        await runner.start()
        # Build the OpenAPI document (it plans an example) before serving, off the loop.
        await asyncio.to_thread(app.openapi)
        log.info("planner service ready: %s store, instance %s, %d solver(s)", store.kind,
                 runner.instance, settings.max_concurrent_solves)
        try:
            yield
        finally:
            await runner.stop()
            await asyncio.to_thread(store.close)
            metrics.close()

    # /docs and /openapi.json are api/docs.py's: local assets, behind the key when set.
    app = FastAPI(title="DLRM sharding planner", version="1", description=DESCRIPTION,
                  lifespan=lifespan, separate_input_output_schemas=False, openapi_url=None,
                  docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.body_budget = BodyBudget(settings.max_body_bytes_in_flight)
    app.state.keys = KeyRing(settings)
    guarded: dict[str, Any] = {}
    if app.state.keys.enabled:
        guarded["dependencies"] = [Depends(require_api_key)]
    app.include_router(plans_router, **guarded)
    app.include_router(tools_router, **guarded)
    app.include_router(metrics_router, **guarded)
    app.include_router(health_router)
    app.include_router(docs_router(app))
    install_handlers(app)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    def openapi() -> dict[str, Any]:
        return build_openapi(app)

    app.openapi = openapi  # type: ignore[method-assign]
    return app

"""The HTTP service: a FastAPI app around `planner.plan()` (docs/DESIGN.md, "The service").

`api.app.create_app(settings)` builds the app; `planner serve` runs it with uvicorn. Nothing
is imported here: `planner` imports `api.cli` on every command, and must start fast.
"""

from typing import Any

__all__ = ["ServiceSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from api.app import create_app

        return create_app
    if name == "ServiceSettings":
        from api.settings import ServiceSettings

        return ServiceSettings
    raise AttributeError(f"module 'api' has no attribute {name!r}")

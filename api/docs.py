"""/docs (Swagger UI) and /openapi.json, served with no network: Swagger UI's script, style
sheet and icon come from the `fastapi-offline` package's copy (a pinned dependency), not from
a CDN. When the server has API keys these routes need one too: `X-API-Key`, `Authorization:
Bearer KEY`, or HTTP Basic with the key as the password (any user name), so a browser asks
for it and then sends it with the page's own requests (the schema and the assets)."""

import base64
import binascii
from pathlib import Path
from typing import Annotated

import fastapi_offline
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.security import APIKeyHeader

from api.problems import UNAUTHORIZED, Problem, ProblemError
from api.security import KeyRing

ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSET_URL = "/docs/assets"
# The only files served from ASSETS, with their media types.
ASSET_FILES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8",
               "swagger-ui.css": "text/css; charset=utf-8", "favicon.png": "image/png"}
OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
_authorization = APIKeyHeader(name="Authorization", auto_error=False)
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False)


def key_given(x_api_key: str | None, authorization: str | None) -> str | None:
    """The key a request carries: X-API-Key, Bearer, or Basic's password (else user)."""
    if x_api_key:
        return x_api_key
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(
                ":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or user or None
    return None


async def require_docs_key(
    request: Request,
    x_api_key: Annotated[str | None, Depends(_api_key)],
    authorization: Annotated[str | None, Depends(_authorization)],
) -> None:
    ring: KeyRing = request.app.state.keys
    if not ring.enabled:
        return
    given = key_given(x_api_key, authorization)
    if given is None or ring.lookup(given) is None:
        raise ProblemError(
            Problem(type=UNAUTHORIZED, title="Unauthorized", status=401,
                    detail="this server needs an API key for its documentation too: "
                           "X-API-Key, Authorization: Bearer, or HTTP Basic with the key as "
                           "the password"),
            headers={"WWW-Authenticate": 'Basic realm="planner", charset="UTF-8"'})


def docs_router(app: FastAPI) -> APIRouter:
    router = APIRouter(include_in_schema=False, dependencies=[Depends(require_docs_key)])

    @router.get(OPENAPI_URL)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get(DOCS_URL)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_URL, title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            swagger_js_url=f"{ASSET_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSET_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSET_URL}/favicon.png",
            # No validator badge: it would send the schema to a public validator.
            swagger_ui_parameters={"validatorUrl": None})

    @router.get(OAUTH2_REDIRECT_URL)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @router.get(ASSET_URL + "/{name}")
    async def asset(name: str) -> FileResponse:
        media = ASSET_FILES.get(name)
        if media is None:
            from api.routes_plans import not_found

            raise not_found(f"no documentation asset {name!r}")
        return FileResponse(ASSETS / name, media_type=media,
                            headers={"Cache-Control": "private, max-age=86400"})

    return router

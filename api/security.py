"""Optional API-key auth: when PLANNER_API_KEY is set, /v1 and /metrics need the key as
`X-API-Key: KEY` or `Authorization: Bearer KEY`; /healthz and /readyz stay open."""

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from api.problems import UNAUTHORIZED, Problem, ProblemError

api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                              description="the value of PLANNER_API_KEY, when it is set")
bearer = HTTPBearer(auto_error=False, description="the value of PLANNER_API_KEY, when it is set")


async def require_api_key(
    request: Request,
    key: Annotated[str | None, Depends(api_key_header)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Installed on the routers only when a key is set, so the OpenAPI schema says so."""
    expected: str | None = request.app.state.settings.api_key
    if not expected:
        return
    given = key if key is not None else (creds.credentials if creds is not None else None)
    if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
        raise ProblemError(
            Problem(type=UNAUTHORIZED, title="Unauthorized", status=401,
                    detail="this server needs an API key: X-API-Key or Authorization: Bearer"),
            headers={"WWW-Authenticate": 'Bearer realm="planner"'})

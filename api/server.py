"""The HTTP edge: uvicorn's h11 protocol with a connection cap and a header read timeout.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) and bounds a header's size
(`h11_max_incomplete_event_size`), but a connection that sends half a header and stops is
kept forever, and its `limit_concurrency` answers 503 to every request, /healthz included,
once half-open connections fill it. So here:

- a connection is closed at once when `max_connections` are already open (checked when it
  is accepted, before anything is read or buffered);
- the headers of each request must arrive within `header_timeout_s` of the connection
  opening (or of the previous response), else the connection is closed;
- the body is read by the routes within `body_timeout_s` and `max_body_bytes` (api/body.py),
  and all bodies being read at once share `max_body_bytes_in_flight`.
"""

import asyncio
import json
from functools import cache
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.problems import LIMIT
from api.settings import ServiceSettings


@cache
def _settings() -> ServiceSettings:
    # Worker processes build their settings from the environment, as the app does.
    return ServiceSettings.from_env()


class BoundedH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > _settings().max_connections:
            transport.close()
            return
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(_settings().header_timeout_s,
                                                      self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        # Still waiting for a request's headers (none in progress): close.
        if (self.conn.their_state is h11.IDLE and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete)):
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        # h11 bounds only a header still incomplete: one arriving whole in a single read
        # passes at any size. So the headers' size is checked here, before parsing.
        limit = _settings().max_header_bytes
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            head = self.conn.trailing_data[0] + data[:limit + 4]
            end = head.find(b"\r\n\r\n")
            if end > limit or (end == -1 and len(head) > limit):
                self._refuse_headers(limit)
                return
        super().data_received(data)

    def _refuse_headers(self, limit: int) -> None:
        body = json.dumps({"type": LIMIT, "title": "Request Header Fields Too Large",
                           "status": 431, "detail": f"the headers are over this server's limit "
                                                    f"of {limit:,} bytes "
                                                    "(PLANNER_MAX_HEADER_BYTES)"}).encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                             b"Content-Type: application/problem+json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        # Headers received: the request is the routes' to time (body_timeout_s).
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request on this keep-alive connection: its headers have a deadline too
        # (uvicorn's keep-alive timer stops at the first byte received).
        self._disarm_header_timer()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)


def uvicorn_options(settings: ServiceSettings) -> dict[str, Any]:
    """The bounds `planner serve` gives uvicorn."""
    return {"http": BoundedH11Protocol, "timeout_keep_alive": settings.keep_alive_s,
            "h11_max_incomplete_event_size": settings.max_header_bytes}

"""The gateway under uvicorn, with uvicorn's access log off.

uvicorn's access log prints each request's raw path, and a webhook's path is its hook's token:
it is turned off, and ``guards.AccessLog`` writes the gateway's own, redacted, on the
``flowstream.gateway.access`` logger. uvicorn does not configure logging here
(``log_config=None``): its ``uvicorn.error`` lines (started, stopped, an application error with
its class) go wherever the process's logging sends them, like every flowstream logger.
"""

from __future__ import annotations

import uvicorn
from starlette.types import ASGIApp

from flowstream.gateway.settings import GatewaySettings

__all__ = ["serve", "server_config"]


def server_config(app: ASGIApp, settings: GatewaySettings) -> uvicorn.Config:
    """uvicorn's configuration for ``app``: the settings' address, no access log, no
    ``Server`` header, uvicorn's logging left to the process."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        access_log=False,
        log_config=None,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def serve(app: ASGIApp, settings: GatewaySettings) -> None:
    """Serve ``app`` until interrupted (SIGINT, SIGTERM)."""
    uvicorn.Server(server_config(app, settings)).run()

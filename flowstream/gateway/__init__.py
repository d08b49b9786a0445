"""The HTTP gateway: runs started, steered and read over HTTP, hooks resumed by webhook URL.

One ASGI application (``app.create_app``, FastAPI, served by uvicorn: ``server``) over a
``backend.Backend``: ``embedded.EmbeddedBackend`` drives a ``FlowEngine`` in the gateway's own
process, ``kafka.KafkaBackend`` sends commands to a deployment through ``FlowClient`` and reads
its events topic. ``guards`` holds the bearer check, the body limit and the redacted access
log, ``problems`` the mapping of errors to statuses, ``views`` the JSON of a run, ``settings``
what the gateway is configured with. The API is in docs/gateway.md and at ``/openapi.json``.
"""

from __future__ import annotations

from flowstream.gateway.app import create_app
from flowstream.gateway.backend import Answer, Backend
from flowstream.gateway.embedded import EmbeddedBackend
from flowstream.gateway.kafka import KafkaBackend
from flowstream.gateway.settings import GatewaySettings

__all__ = [
    "Answer",
    "Backend",
    "EmbeddedBackend",
    "GatewaySettings",
    "KafkaBackend",
    "create_app",
]

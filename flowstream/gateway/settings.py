"""``GatewaySettings``: who may call the gateway, where it listens, how much it reads.

Read once at the entry point from ``FLOWSTREAM_GATEWAY_<FIELD>`` variables (command-line options
override them) and passed down, like ``flowstream.settings.Settings``, which the Kafka mode
still uses for the deployment it talks to. The bearer token is a ``SecretStr``: its repr and
its JSON dump are masked, so it cannot reach a log line or an error through this object.

Nobody gets in by default: without a token the gateway refuses to start, unless ``no_auth``
says so explicitly, which is for local development and only allowed on a loopback address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, model_validator

from flowstream.model.base import FrozenModel
from flowstream.settings import from_environment

__all__ = ["DEFAULT_MAX_BODY_BYTES", "GatewaySettings", "is_loopback"]

#: A request body larger than this is refused (413) before it is read further: one event's
#: limit, since a payload must fit in the event that records it.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

#: Host names that resolve to the loopback interface only.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): reachable from this machine
    alone."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class GatewaySettings(FrozenModel):
    """The HTTP gateway's settings."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    #: The bearer token every endpoint but the webhooks and the console's static files needs.
    token: SecretStr | None = None
    #: Serve the API without a credential: local development only (loopback hosts alone).
    no_auth: bool = False
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1)
    #: How long a command waits for its outcome (Kafka) or its drive (embedded) before the
    #: gateway answers 202 (accepted, still under way) or 504 (Kafka: no outcome in time).
    command_timeout: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _someone_guards_the_door(self) -> GatewaySettings:
        if self.token is not None and not self.token.get_secret_value():
            raise ValueError("the gateway token is empty: give a long random one")
        if self.token is None and not self.no_auth:
            raise ValueError(
                "the gateway needs a bearer token (FLOWSTREAM_GATEWAY_TOKEN or --token-file); "
                "--no-auth serves it without one, on a loopback address, for local development"
            )
        if self.token is not None and self.no_auth:
            raise ValueError("give a token or --no-auth, not both")
        if self.no_auth and not is_loopback(self.host):
            raise ValueError(
                f"--no-auth is for local development: it serves only on a loopback address, "
                f"not {self.host}"
            )
        return self

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> GatewaySettings:
        """Settings from ``FLOWSTREAM_GATEWAY_*`` variables, then non-``None`` ``overrides``."""
        return from_environment(cls, "FLOWSTREAM_GATEWAY_", environ, overrides)

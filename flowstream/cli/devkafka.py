"""``flowstream dev-kafka``: a real Kafka broker from Maven Central jars (placeholder)."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    subparsers.add_parser("dev-kafka", help="start/stop a local Kafka broker (not built yet)")

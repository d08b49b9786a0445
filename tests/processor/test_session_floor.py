"""The worker's session timeout meets the brokers' ``group.min.session.timeout.ms`` instead of
failing to join: raised to the floor when below it, kept when the floor cannot be read."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.processor.connect import session_timeout_ms
from flowstream.settings import Settings


@dataclass
class _Entry:
    value: str


class _Admin:
    """Answers ``describe_configs`` for one broker with a floor, or fails like a denied request."""

    def __init__(self, floor: int | None) -> None:
        self.floor = floor
        self.asked: list[str] = []

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        (resource,) = resources
        self.asked.append(resource.name)
        answer: Future[dict[str, _Entry]] = Future()
        if self.floor is None:
            answer.set_exception(
                clients.KafkaException(clients.KafkaError(clients.KafkaError._TIMED_OUT))
            )
        else:
            answer.set_result({"group.min.session.timeout.ms": _Entry(str(self.floor))})
        return {resource: answer}


@pytest.mark.parametrize(
    ("wanted", "floor", "used"),
    [(2000, 1000, 2000), (2000, 6000, 6000), (8000, 6000, 8000), (2000, None, 2000)],
)
def test_the_session_timeout_is_raised_to_the_brokers_floor(
    wanted: int, floor: int | None, used: int
) -> None:
    admin = _Admin(floor)
    assert session_timeout_ms(Settings(session_timeout_ms=wanted), admin, [3, 1, 2]) == used
    assert admin.asked == ["1"]


def test_without_brokers_the_setting_is_used_as_it_is() -> None:
    assert session_timeout_ms(Settings(session_timeout_ms=2000), _Admin(6000), []) == 2000

"""The worker's session timeout meets the brokers' ``group.min.session.timeout.ms`` instead of
failing to join: raised to the floor when below it, kept when the floor cannot be read. The group
protocol follows what the brokers offer and allow (``connect.membership``)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.processor.connect import Membership, membership, session_timeout_ms
from flowstream.settings import Settings


@dataclass
class _Entry:
    value: str


class _Admin:
    """Answers ``describe_configs`` for one broker with a floor, or fails like a denied request."""

    def __init__(self, floor: int | None, **more: str) -> None:
        self.floor = floor
        self.more = {name.replace("_", "."): value for name, value in more.items()}
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
            found = {"group.min.session.timeout.ms": str(self.floor), **self.more}
            answer.set_result({name: _Entry(value) for name, value in found.items()})
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


#: What a Kafka 4 broker reports with its defaults for the consumer protocol.
KAFKA4 = {
    "group_coordinator_rebalance_protocols": "classic,consumer,streams",
    "group_consumer_min_session_timeout_ms": "45000",
    "group_consumer_min_heartbeat_interval_ms": "5000",
}


@pytest.mark.parametrize(
    ("more", "wanted", "chosen"),
    [
        # Kafka 4 defaults: the consumer protocol's 45 s floor would cost the failover.
        (KAFKA4, 1500, Membership("classic", 6000, 600)),
        # Floors lowered (as `flowstream dev-kafka` and the compose broker do).
        (
            {
                **KAFKA4,
                "group_consumer_min_session_timeout_ms": "1000",
                "group_consumer_min_heartbeat_interval_ms": "100",
            },
            1500,
            Membership("consumer", 1500, 150),
        ),
        # A heartbeat floor above a tenth of the session: classic keeps its own heartbeat.
        (
            {**KAFKA4, "group_consumer_min_session_timeout_ms": "1000"},
            1500,
            Membership("classic", 6000, 600),
        ),
        # A broker that does not offer the consumer protocol (or is older than Kafka 4).
        (
            {
                "group_coordinator_rebalance_protocols": "classic",
                "group_consumer_min_session_timeout_ms": "1000",
                "group_consumer_min_heartbeat_interval_ms": "100",
            },
            1500,
            Membership("classic", 6000, 600),
        ),
        ({}, 8000, Membership("classic", 8000, 800)),
    ],
)
def test_auto_takes_the_consumer_protocol_where_the_brokers_allow_the_session(
    more: dict[str, str], wanted: int, chosen: Membership
) -> None:
    asked = Settings(group_protocol="auto", session_timeout_ms=wanted)
    got = membership(asked, _Admin(6000, **more), [1])
    assert got == chosen


def test_a_chosen_protocol_is_kept_and_its_floors_apply() -> None:
    admin = _Admin(1000, **KAFKA4)
    consumer = membership(Settings(group_protocol="consumer", session_timeout_ms=1500), admin, [1])
    assert consumer == Membership("consumer", 45000, 5000)
    classic = membership(Settings(group_protocol="classic", session_timeout_ms=1500), admin, [1])
    assert classic == Membership("classic", 1500, 150)
    assert "session.timeout.ms" not in consumer.consumer_config()
    assert classic.consumer_config()["session.timeout.ms"] == 1500

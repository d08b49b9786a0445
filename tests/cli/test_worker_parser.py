"""``flowstream worker`` options and environment, without a broker."""

from __future__ import annotations

from flowstream.cli import build_parser
from flowstream.cli.worker import worker_settings


def test_eager_steps_comes_from_the_flag_or_the_environment_and_is_off_by_default() -> None:
    parser = build_parser()
    plain = parser.parse_args(["worker", "--app", "flowstream.examples.order:runtime"])
    flagged = parser.parse_args(["worker", "--eager-steps"])
    assert worker_settings(plain, {}).eager_steps is False
    assert worker_settings(flagged, {}).eager_steps is True
    assert worker_settings(plain, {"FLOWSTREAM_EAGER_STEPS": "true"}).eager_steps is True
    # An option given on the command line wins over the environment; one not given leaves it.
    bootstrap = parser.parse_args(["worker", "--bootstrap", "127.0.0.1:1"])
    env = {"FLOWSTREAM_BOOTSTRAP": "127.0.0.1:2", "FLOWSTREAM_GROUP": "g"}
    settings = worker_settings(bootstrap, env)
    assert (settings.bootstrap, settings.group) == ("127.0.0.1:1", "g")

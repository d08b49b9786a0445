"""The test kit's own fixtures, for the runtime these tests use (``flowstream.examples.shop``)."""

import pytest

from flowstream.examples.shop import app
from flowstream.runtime import FlowRuntime
from flowstream.testing.fixtures import flow_env, flow_env_replaying, flow_replayer

__all__ = ["flow_env", "flow_env_replaying", "flow_replayer", "flowstream_runtime"]


@pytest.fixture
def flowstream_runtime() -> FlowRuntime:
    return app

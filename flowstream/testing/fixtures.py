"""pytest fixtures of the test kit. Enable them in a ``conftest.py`` with
``pytest_plugins = ["flowstream.testing.fixtures"]`` and name the runtime under test by
overriding ``flowstream_runtime``::

    @pytest.fixture
    def flowstream_runtime():
        return my_app

* ``flow_env``: a ``WorkflowEnvironment`` (memory store, virtual clock) for ``flowstream_runtime``;
* ``flow_env_replaying``: the same in always-replay mode; the test fails on any divergence,
  raised or recorded;
* ``flow_replayer``: a ``Replayer`` of exported histories for ``flowstream_runtime``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowstream.runtime import FlowRuntime
from flowstream.testing.env import WorkflowEnvironment
from flowstream.testing.replayer import Replayer

__all__ = ["flow_env", "flow_env_replaying", "flow_replayer", "flowstream_runtime"]


@pytest.fixture
def flowstream_runtime() -> FlowRuntime:
    """The runtime under test: override this fixture in your ``conftest.py``."""
    raise pytest.UsageError("override the flowstream_runtime fixture with your App or runtime")


@pytest.fixture
def flow_env(flowstream_runtime: FlowRuntime) -> WorkflowEnvironment:
    """A test environment on the memory store with a virtual clock."""
    return WorkflowEnvironment(flowstream_runtime)


@pytest.fixture
def flow_env_replaying(flowstream_runtime: FlowRuntime) -> Iterator[WorkflowEnvironment]:
    """A test environment that replays every run from scratch after each commit."""
    env = WorkflowEnvironment(flowstream_runtime, always_replay=True)
    yield env
    env.check()


@pytest.fixture
def flow_replayer(flowstream_runtime: FlowRuntime) -> Replayer:
    """A replayer of exported histories for the runtime under test."""
    return Replayer(flowstream_runtime)

"""The test kit: run workflows on the memory store with a virtual clock, replay them.

* ``WorkflowEnvironment``: engine, memory store, ``VirtualClock`` and an ``EmbeddedClient``;
  waits skip to the next deadline, so a one-hour timer passes in milliseconds; with
  ``always_replay=True`` every commit is followed by a replay from scratch that fails the test
  on any changed decision (``ReplayDivergedError``).
* ``Replayer``: replays exported histories (``flowstream history --json``) against the current
  code and reports nondeterminism, for a CI job before a rollout.
* ``flowstream.testing.fixtures``: the pytest fixtures of both.
"""

from flowstream.testing.clock import EPOCH, VirtualClock
from flowstream.testing.env import ReplayDivergedError, WorkflowEnvironment, replay_now
from flowstream.testing.replayer import Replayer, ReplayReport, export_histories, load_histories

__all__ = [
    "EPOCH",
    "ReplayDivergedError",
    "ReplayReport",
    "Replayer",
    "VirtualClock",
    "WorkflowEnvironment",
    "export_histories",
    "load_histories",
    "replay_now",
]

"""The embedded engine: drives runs over a store with the replay cycle."""

from flowstream.engine.builds import RuntimeBuilds
from flowstream.engine.engine import FlowEngine
from flowstream.engine.inputs import SchedulerTick
from flowstream.engine.inspection import Suspension
from flowstream.engine.steps import call_step

__all__ = ["FlowEngine", "RuntimeBuilds", "SchedulerTick", "Suspension", "call_step"]

"""The embedded engine: drives runs over a store with the replay cycle."""

from flowstream.engine.engine import FlowEngine, RuntimeBuilds, SchedulerTick, Suspension

__all__ = ["FlowEngine", "RuntimeBuilds", "SchedulerTick", "Suspension"]

"""``import flowstream`` is the curated surface: its names are pinned, documented and light."""

from __future__ import annotations

import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import flowstream

ROOT = Path(__file__).resolve().parents[2]

EXPORTED = {
    # plain-code workflows
    "App",
    "Context",
    "Operation",
    "Model",
    "current_step",
    # handles
    "EmbeddedClient",
    "KafkaClient",
    "WorkflowHandle",
    # the seeds' contract
    "FlowRuntime",
    "WorkflowInvocation",
    "StepInvocation",
    "WorkflowContext",
    "RuntimeCommand",
    "StepCommand",
    "ChildWorkflowCommand",
    "RetryPolicy",
    "Backoff",
    "ExhaustedAction",
    "WorkflowSpec",
    "WorkflowRunSnapshot",
    "RunStatus",
    "TerminalOutcome",
    "EventEnvelope",
    "ChildCancellationPolicy",
    # engines, stores, the Kafka client
    "FlowEngine",
    "SchedulerTick",
    "EventStore",
    "MemoryEventStore",
    "RocksDBEventStore",
    "FlowClient",
    "Settings",
    # errors
    "FlowError",
    "ApplicationError",
    "StepFailedError",
    "ChildFailedError",
    "RunFailedError",
    "NonDeterministicError",
    "InvalidInputError",
    "InvalidTransitionError",
    "RunConflictError",
    "RunNotFoundError",
    "SerializationError",
    "StepError",
    "NonRetryableError",
    "UnknownOutcomeError",
    "WorkflowNotServedError",
    "__version__",
}


def test_the_exported_names_are_pinned() -> None:
    assert set(flowstream.__all__) == EXPORTED
    assert len(flowstream.__all__) == len(EXPORTED)


def test_every_exported_name_resolves_and_has_a_docstring() -> None:
    undocumented = []
    for name in flowstream.__all__:
        value = getattr(flowstream, name)
        if name == "__version__":
            continue
        if not (inspect.getdoc(value) or "").strip():
            undocumented.append(name)
    assert undocumented == []


def test_public_methods_of_the_new_api_have_docstrings() -> None:
    from flowstream import testing
    from flowstream.handles import Client

    classes = [
        flowstream.App,
        flowstream.Context,
        flowstream.WorkflowHandle,
        Client,
        flowstream.WorkflowContext,
        flowstream.WorkflowInvocation,
        flowstream.StepInvocation,
        testing.WorkflowEnvironment,
        testing.Replayer,
        testing.VirtualClock,
    ]
    missing = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for name, member in vars(cls).items()
        if not name.startswith("_")
        and (callable(member) or isinstance(member, property))
        and not (inspect.getdoc(member) or "").strip()
    ]
    assert missing == []


def test_the_version_is_the_project_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert flowstream.__version__ == project["version"]


def test_import_flowstream_stays_light() -> None:
    code = (
        "import sys, flowstream\n"
        "heavy = [m for m in ('confluent_kafka', 'rocksdict', 'fastavro') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_retry_policy_by_keyword_with_timedeltas_and_the_old_positional_form() -> None:
    from datetime import timedelta

    keyword = flowstream.RetryPolicy(
        max_attempts=5,
        delay=timedelta(milliseconds=200),
        backoff="exponential",
        max_delay=timedelta(seconds=5),
    )
    assert keyword == flowstream.RetryPolicy.exponential(5, 200, 5_000)
    assert keyword == flowstream.RetryPolicy.exponential(
        5, timedelta(milliseconds=200), timedelta(seconds=5)
    )
    assert flowstream.RetryPolicy(max_attempts=2, delay_ms=300) == flowstream.RetryPolicy.fixed(
        2, 300
    )
    assert flowstream.RetryPolicy.model_validate(keyword.model_dump(mode="json")) == keyword

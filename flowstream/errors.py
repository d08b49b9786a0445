"""Every error flowstream raises, under one root.

::

    FlowError
    ├── EventConflictError           append_if_sequence lost a race (engine re-reads and replays)
    ├── NonDeterministicError        replay produced another definition for a durable identity
    ├── InvalidTransitionError       a history or command breaks the event state machine
    │   └── CorruptHistoryError      a stored history fails validation on read, or stored
    │                                 links contradict each other (a chain or ancestry cycle)
    ├── SerializationError           bytes or JSON that do not decode into the expected type
    ├── RunConflictError             a start/signal/cancel disagrees with what is durable
    │   └── HookTokenConflictError   a hook token is already active in another run
    ├── RunNotFoundError             no history for the run id
    │   └── RunNotStartedError       (Kafka) a command for a run that does not exist yet is
    │                                 parked until it starts (also a CommandParkedError)
    ├── CommandParkedError           (Kafka) a command waits in its partition's inbox (its run
    │                                 does not exist yet, its build is not served there)
    ├── PayloadTooLargeError         an event exceeds MAX_EVENT_BYTES
    ├── InvalidIdentifierError       a run, step, wait, hook, signal or patch id is malformed
    ├── RuntimeBuildUnavailableError the run is pinned to a build this engine cannot serve
    ├── WorkflowNotServedError       the engine's runtime does not serve the run's workflow
    ├── InvalidInputError            a start's input does not validate against its input model
    ├── LimitExceededError           replay iterations, child depth or continuation hops
    ├── RunFailedError               a run a handle waited for ended without completing
    ├── StoreLockedError             another process holds the embedded store (or a newer
    │                                 writer fenced this Kafka store)
    ├── StoreNotFoundError           no embedded store at the path (read commands never create one)
    ├── StoreCorruptError            the embedded store's files fail RocksDB's checks
    ├── InstanceInUseError           a live member of the group runs with this worker's
    │                                 instance id
    ├── TopologyError                topics missing or unlike topology/ (flowstream.topology)
    ├── DevKafkaError                the local broker launcher failed (flowstream.devkafka)
    ├── StepError                    raised *by step handlers* to control retries
    │   ├── NonRetryableError        fail the attempt without using the retry budget
    │   └── UnknownOutcomeError      the side effect may or may not have happened (non-retryable)
    └── ApplicationError             raised *in a plain-code workflow* to fail its run
        ├── StepFailedError          a step ran out of attempts (its policy continues the workflow)
        └── ChildFailedError         a child workflow ended without completing

Messages never contain hook tokens or other secrets; they say what to do next where possible.

A Kafka client raises the class a processor named in a command's outcome (:func:`error_from`):
the same class the embedded engine raises for the same request, with the processor's message.
"""

from __future__ import annotations

__all__ = [
    "ApplicationError",
    "ChildFailedError",
    "CommandParkedError",
    "CorruptHistoryError",
    "EventConflictError",
    "FlowError",
    "HookTokenConflictError",
    "InstanceInUseError",
    "InvalidIdentifierError",
    "InvalidInputError",
    "InvalidTransitionError",
    "LimitExceededError",
    "NonDeterministicError",
    "NonRetryableError",
    "PayloadTooLargeError",
    "RunConflictError",
    "RunFailedError",
    "RunNotFoundError",
    "RunNotStartedError",
    "RuntimeBuildUnavailableError",
    "SerializationError",
    "StepError",
    "StepFailedError",
    "StoreCorruptError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownOutcomeError",
    "WorkflowNotServedError",
]


class FlowError(Exception):
    """Root of every flowstream error."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class EventConflictError(FlowError):
    """``append_if_sequence`` found another last sequence than the caller expected."""

    def __init__(self, run_id: str, expected_sequence: int, actual_sequence: int) -> None:
        super().__init__(
            f"run {run_id}: expected last sequence {expected_sequence} but the store holds "
            f"{actual_sequence}; re-read the history and replay",
            run_id=run_id,
        )
        self.expected_sequence = expected_sequence
        self.actual_sequence = actual_sequence


class NonDeterministicError(FlowError):
    """A durable identity reappeared with other parameters; the decision was not appended."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"nondeterministic replay of run {run_id}: {reason}", run_id=run_id)
        self.reason = reason


class InvalidTransitionError(FlowError):
    """An event or command is not legal in the run's current state."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        prefix = f"run {run_id}: " if run_id else ""
        super().__init__(prefix + message, run_id=run_id)


class CorruptHistoryError(InvalidTransitionError):
    """A stored history fails validation, or stored links (continuations, parents) form a
    cycle; the run is reported, never executed."""


class SerializationError(FlowError):
    """A value could not be encoded or decoded into the requested type."""


class RunConflictError(FlowError):
    """A request disagrees with the run's durable state (spec, input, signal payload…)."""


class HookTokenConflictError(RunConflictError):
    """A hook token is already active; names the owning run and hook, never the token."""

    def __init__(self, run_id: str, owner_run_id: str, owner_hook_id: str) -> None:
        super().__init__(
            f"run {run_id}: hook token is already active for hook {owner_hook_id} "
            f"of run {owner_run_id}; use a distinct token",
            run_id=run_id,
        )
        self.owner_run_id = owner_run_id
        self.owner_hook_id = owner_hook_id


class RunNotFoundError(FlowError):
    """No history exists for the run id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} does not exist", run_id=run_id)


class CommandParkedError(FlowError):
    """A command sent to a Kafka deployment waits in its partition's inbox: it applies once it
    can (its run starts, its build is served), within the parked time-to-live, and is given up
    with the reason after it. ``kind`` names the error it meets meanwhile."""

    def __init__(self, message: str, *, run_id: str | None = None, kind: str | None = None) -> None:
        super().__init__(message, run_id=run_id)
        self.kind = kind


class RunNotStartedError(CommandParkedError, RunNotFoundError):
    """The run does not exist (yet): a Kafka command for it (a signal, a hook resumption) is
    parked until it starts, within the parked time-to-live."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        FlowError.__init__(self, message, run_id=run_id)
        self.kind = RunNotFoundError.__name__


class PayloadTooLargeError(FlowError):
    """An encoded event is larger than the store accepts."""

    def __init__(self, run_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"run {run_id}: event of {size} bytes exceeds the limit of {limit} bytes; "
            "keep large payloads outside the history and store a reference",
            run_id=run_id,
        )
        self.size = size
        self.limit = limit


class InvalidIdentifierError(FlowError):
    """A run id, step id or other identity is malformed."""


class RuntimeBuildUnavailableError(FlowError):
    """The run is pinned to a runtime build this engine does not serve; nothing was appended."""

    def __init__(self, run_id: str, required: str | None, current: str | None) -> None:
        super().__init__(
            f"run {run_id} needs runtime build {required or '<unpinned>'} but this engine serves "
            f"{current or '<unpinned>'}; route it to a compatible worker",
            run_id=run_id,
        )
        self.required_build_id = required
        self.current_build_id = current


class WorkflowNotServedError(FlowError):
    """The runtime does not serve the run's workflow (it declares others); nothing was
    appended."""

    def __init__(self, run_id: str, workflow: str, served: list[str]) -> None:
        super().__init__(
            f"run {run_id} is workflow {workflow}, which this runtime does not serve (it serves "
            f"{', '.join(served) or 'none'}); use the runtime that declares it",
            run_id=run_id,
        )
        self.workflow = workflow
        self.served = tuple(served)


class InvalidInputError(FlowError):
    """A start's input does not validate against the workflow's input model; nothing was
    appended. The message names the fields, never their values."""

    def __init__(self, run_id: str, workflow: str, model: str, problems: str) -> None:
        super().__init__(
            f"run {run_id}: input does not validate against {model}, the input model of "
            f"workflow {workflow}: {problems}",
            run_id=run_id,
        )
        self.workflow = workflow
        self.problems = problems


class LimitExceededError(FlowError):
    """A configured engine limit was hit: ``max_replay_iterations`` in one drive (raised), or
    ``max_child_depth`` or ``max_continuations`` hops of a continuation chain (the decision that
    would exceed it is not written; the refusal is recorded as the run's workflow-task
    failure)."""


class RunFailedError(FlowError):
    """A run a handle waited for (``handle.result()``) ended without completing: ``outcome``
    is how it ended (failed, cancelled, timed_out, retry_exhausted), ``error`` why."""

    def __init__(self, run_id: str, outcome: str, error: str | None) -> None:
        detail = f": {error}" if error else ""
        super().__init__(f"run {run_id} ended {outcome}{detail}", run_id=run_id)
        self.outcome = outcome
        self.error = error


class StoreLockedError(FlowError):
    """Another process holds the embedded store open."""


class StoreNotFoundError(FlowError):
    """No embedded store at the path (a mistyped ``--data``); read commands never create one."""


class StoreCorruptError(FlowError):
    """The embedded store's files fail RocksDB's checks (the message names the file)."""


class InstanceInUseError(FlowError):
    """Another live member of the group runs with this processor's instance id."""


class StepError(FlowError):
    """Base for errors a step handler raises to steer retries."""


class NonRetryableError(StepError):
    """The attempt failed and must not be retried."""


class UnknownOutcomeError(StepError):
    """The side effect's outcome is unknown; do not retry blindly."""


class ApplicationError(FlowError):
    """Raised in a plain-code workflow (``flowstream.App``) to fail its run with this message;
    any other exception is a workflow-task failure, retried once the code is fixed."""


class StepFailedError(ApplicationError):
    """A step ran out of attempts and its retry policy hands the failure back to the workflow
    (``on_exhausted="continue_workflow"``); uncaught, it fails the run."""

    def __init__(self, run_id: str, step_id: str, error: str) -> None:
        super().__init__(f"step {step_id} failed: {error}", run_id=run_id)
        self.step_id = step_id
        self.error = error


class ChildFailedError(ApplicationError):
    """A child workflow ended without completing (failed, cancelled, timed out…)."""

    def __init__(self, run_id: str, child_id: str, outcome: str, error: str | None) -> None:
        detail = f": {error}" if error else ""
        super().__init__(f"child workflow {child_id} ended {outcome}{detail}", run_id=run_id)
        self.child_id = child_id
        self.outcome = outcome
        self.error = error


def _named() -> dict[str, type[FlowError]]:
    found: dict[str, type[FlowError]] = {}
    pending: list[type[FlowError]] = [FlowError]
    while pending:
        cls = pending.pop()
        if cls.__module__ == __name__:
            found.setdefault(cls.__name__, cls)
        pending.extend(cls.__subclasses__())
    return found


def error_from(kind: str | None, message: str, *, run_id: str | None = None) -> FlowError:
    """The error of class ``kind`` (a name in this module, e.g. ``RunConflictError``) with
    ``message``, as a Kafka client raises a command's rejection; a kind this release does not
    know (or none) gives a ``FlowError``. Only the message and ``run_id`` are set: attributes
    that the class's own constructor sets (``InvalidInputError.problems``, say) are not."""
    cls = _named().get(kind or "", FlowError)
    error = cls.__new__(cls)
    FlowError.__init__(error, message, run_id=run_id)
    return error

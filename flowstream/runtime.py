"""``FlowRuntime``: the two entry points user code implements, and what a runtime may declare.

``run_workflow`` decides the next command from history and has no side effects; ``run_step``
performs side effects and runs at least once. Either may be a coroutine function.

A runtime may also declare the workflows it serves, as a ``workflow_inputs`` mapping from
workflow name to that workflow's input model (a pydantic model class, or any type pydantic
validates: a dataclass, ``list[Item]``…; ``None`` for any JSON)::

    class OrderRuntime:
        workflow_inputs = {"order": OrderInput}

One declaration answers both questions an engine asks before it writes anything: does this code
serve the run's workflow (``check_served``), and is a start's input one the workflow can read
(``check_input``)? A runtime without ``workflow_inputs`` serves every name and takes any input,
so the two seed entry points stay the whole required contract. It is data, not a method, so an
error can list what a runtime serves and a client can read the input's shape from the model; it
is keyed by name only, as one runtime build serves one version of each of its workflows. (Not
``workflows``: runtimes commonly keep their dispatch table of workflow functions under that
name.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, TypeAdapter, ValidationError

from flowstream.errors import InvalidInputError, WorkflowNotServedError
from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

__all__ = ["DeclaresWorkflows", "FlowRuntime", "check_input", "check_served", "serves"]


@runtime_checkable
class FlowRuntime(Protocol):
    """What the engine calls: one decision per replay cycle, and step handlers."""

    def run_workflow(
        self, invocation: WorkflowInvocation
    ) -> RuntimeCommand | Awaitable[RuntimeCommand]:
        """Decide the run's next command from its history (no side effects, no clock)."""

    def run_step(self, invocation: StepInvocation) -> object:
        """Perform one attempt of a step: its output (JSON, or a model or dataclass stored as
        JSON by ``flowstream.model.payloads.to_json``), or an awaitable of it."""


@runtime_checkable
class DeclaresWorkflows(Protocol):
    """A runtime that names the workflows it serves and, per workflow, its input model."""

    @property
    def workflow_inputs(self) -> Mapping[str, type[BaseModel] | Any | None]: ...


def _declared(runtime: object) -> Mapping[str, Any] | None:
    # getattr, not isinstance on the protocol: this runs before every decision.
    declared = getattr(runtime, "workflow_inputs", None)
    if declared is None or isinstance(declared, Mapping):
        return declared
    kind = type(runtime).__name__
    raise TypeError(f"{kind}.workflow_inputs must map workflow names to input models or None")


def serves(runtime: object, name: str) -> bool:
    """Whether ``runtime`` runs workflows called ``name`` (every name, if it declares none)."""
    declared = _declared(runtime)
    return declared is None or name in declared


def check_served(runtime: object, run_id: str, spec: WorkflowSpec) -> None:
    """Raise ``WorkflowNotServedError`` unless ``runtime`` serves ``spec``'s workflow."""
    declared = _declared(runtime)
    if declared is not None and spec.name not in declared:
        raise WorkflowNotServedError(run_id, spec.name, sorted(declared))


def check_input(runtime: object, run_id: str, spec: WorkflowSpec, input: JSON) -> None:
    """Raise ``InvalidInputError`` if ``input`` does not validate against the input model
    ``runtime`` declares for ``spec``'s workflow (no model: any JSON is accepted)."""
    declared = _declared(runtime)
    model = None if declared is None else declared.get(spec.name)
    if model is None:
        return
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            model.model_validate(input)
        else:
            _adapter(model).validate_python(input)
    except ValidationError as exc:
        name = getattr(model, "__name__", repr(model))
        raise InvalidInputError(run_id, spec.name, name, _problems(exc)) from None


@lru_cache(maxsize=256)
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def _problems(error: ValidationError) -> str:
    """The validation errors in one line, without the input values (they may be secrets)."""
    items: list[Any] = error.errors(include_input=False, include_url=False)
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or 'input'}: {item['msg']}" for item in items
    )

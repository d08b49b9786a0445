"""``FlowEngine``: the embedded engine, which drives runs over an ``EventStore`` in this process.

It is put together from one part per responsibility, each a mixin over the replay cycle:

* ``cycle.ReplayCycle``: the replay cycle itself, ``drive`` and ``advance``, and the hooks below;
* ``continuation.Continuation``: the chain of runs a run continues into;
* ``children.ChildRuns``: child runs, and what a run's end means for its parent;
* ``steps.StepRunner``: running decided steps and recording their outcomes;
* ``inputs.RunInputs``: timers, delayed retries, signals and hooks;
* ``cancellation.Cancellation``: cancellation requests and forced cancellation;
* ``inspection.Inspection``: snapshots, open suspensions, the summary;
* ``host.Host``: firing its own deadlines (``run_until_idle``, ``wait``, ``serve``).

Here: creating and starting a run.
"""

from __future__ import annotations

from flowstream.engine.cancellation import Cancellation
from flowstream.engine.children import ChildRuns
from flowstream.engine.continuation import Continuation
from flowstream.engine.host import Host
from flowstream.engine.inspection import Inspection
from flowstream.engine.steps import StepRunner, call_step
from flowstream.errors import EventConflictError, RunConflictError
from flowstream.model.base import JSON, json_equal, validate_run_id
from flowstream.model.events import ParentLink, RunCreated
from flowstream.model.payloads import to_json
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.runtime import check_input

# ``call_step`` is named here too because the processor loop imports it from this module.
__all__ = ["FlowEngine", "call_step"]


class FlowEngine(Host, Cancellation, Inspection, ChildRuns, Continuation, StepRunner):
    """Drives workflow runs stored in ``store`` with the code in ``runtime``."""

    async def start(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: object = None,
        *,
        drive: bool = True,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> WorkflowRunSnapshot:
        """Create ``run_id`` (idempotent for the same spec and input) and drive it; ``input``
        is JSON, or a model or dataclass stored as JSON."""
        self.create(
            run_id, spec, to_json(input, f"input of run {run_id}"), parent=parent, depth=depth
        )
        if drive:
            return await self.drive(run_id)
        await self.store.wait_durable()
        return self.snapshot(run_id)

    async def signal(
        self, run_id: str, name: str, payload: object = None, *, id: str
    ) -> WorkflowRunSnapshot:
        """Send signal ``name`` to ``run_id`` once per ``id``: the CLI's order (``signal RUN
        NAME --id ID``) and the handles' (``send_signal`` is the same with the id first)."""
        return await self.send_signal(run_id, id, name, to_json(payload, f"signal {name}"))

    async def cancel(
        self, run_id: str, reason: str | None = None, *, force: bool = False
    ) -> WorkflowRunSnapshot:
        """Ask ``run_id`` to cancel (``request_cancellation``), or end it at once with
        ``force`` (``force_cancel``): the verb of the CLI, ``FlowClient`` and the handles."""
        if force:
            return await self.force_cancel(run_id, reason)
        return await self.request_cancellation(run_id, reason)

    def create(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        *,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> None:
        """Append ``run_created`` unless the run exists with the same spec and input.

        Nothing is appended for a run this engine may not run (its build or workflow is not
        served) or whose input does not validate against the workflow's input model. A
        continuation's successor is not validated: its predecessor already ended, so there is
        no one to refuse it to, and its own first workflow task reports an input its code
        cannot read.
        """
        validate_run_id(run_id)
        while True:
            if self.store.exists(run_id):
                state = self.store.state(run_id)
                if state.spec != spec:
                    raise RunConflictError(f"run {run_id}: workflow spec differs", run_id=run_id)
                if not json_equal(state.input, input):
                    raise RunConflictError(f"run {run_id}: workflow input differs", run_id=run_id)
                return
            self._admit(run_id, spec)
            if parent is None or not parent.continued:
                check_input(self._runtime_for(spec), run_id, spec, input)
            try:
                created = RunCreated(spec=spec, input=input, parent=parent, depth=depth)
                self.store.append_if_sequence(run_id, 0, [created])
            except EventConflictError:
                continue
            return

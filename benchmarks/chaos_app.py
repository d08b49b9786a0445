"""The chaos test's workflow: every kind of durable wait in one run, and a log of side effects.

``chaos`` runs, in order: a batch of three steps (``schedule_steps``), a step that fails on its
first attempt and is retried after a delay, a short timer, a wait for signal ``go``, a hook
resumed by its token alone (the driver passes the token's digest in the input), a child
workflow (``chaos-child``: one step), and a last step. Its output names what each wait received.

Every step execution first appends one line to this process's side-effect log,
``$CHAOS_EFFECTS_DIR/effects-<pid>.log`` (opened ``O_APPEND``, one ``write`` per line, so lines
of concurrent steps never interleave)::

    <idempotency key> TAB <run id> TAB <step id> TAB <attempt> TAB <pid> TAB <unix time>

so the auditor can count how often each step really ran. ``runtime`` is what ``flowstream worker
--app benchmarks.chaos_app:runtime`` serves.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from datetime import timedelta

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

__all__ = [
    "BATCH",
    "CHILD_SPEC",
    "EFFECTS_ENV",
    "HOOK_ID",
    "SIGNAL_NAME",
    "SPEC",
    "ChaosRuntime",
    "make_input",
    "runtime",
]

SIGNAL_NAME = "go"
HOOK_ID = "approval"
SPEC = WorkflowSpec(name="chaos", signal_names=(SIGNAL_NAME,))
CHILD_SPEC = WorkflowSpec(name="chaos-child")
BATCH = ("fetch", "price", "stock")
FLAKY = "charge"
EFFECTS_ENV = "CHAOS_EFFECTS_DIR"
#: The flaky step's retry: a delay long enough to be a timer of its own.
_RETRY = RetryPolicy.fixed(4, 400)


def make_input(index: int, token_digest: str, timer_ms: int) -> dict[str, JSON]:
    """The input of run ``index``: the digest of its hook token and its timer's length."""
    return {"index": index, "hook_digest": token_digest, "timer_ms": timer_ms}


class ChaosRuntime:
    """Runs ``chaos`` and ``chaos-child``; each step sleeps a few ms (keyed by its idempotency key)
    so that steps are in flight when faults land."""

    def __init__(self) -> None:
        self._log_fd: int | None = None
        self._log_pid = 0
        self._lock = threading.Lock()

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        options = invocation.input if isinstance(invocation.input, dict) else {}
        if invocation.spec.name == CHILD_SPEC.name:
            if not ctx.step_completed("kid-work"):
                return ctx.schedule_step("kid-work", "work", {"parent": options.get("parent")})
            return ctx.complete({"kid": ctx.step_output("kid-work")})
        if not all(ctx.step_completed(step_id) for step_id in BATCH):
            batch = [ctx.step(step_id, "work", {"part": step_id}) for step_id in BATCH]
            return ctx.schedule_steps(batch)
        if not ctx.step_completed(FLAKY):
            return ctx.schedule_step(FLAKY, "flaky", {"parts": list(BATCH)}, _RETRY)
        if not ctx.wait_completed("nap"):
            return ctx.wait_for("nap", timedelta(milliseconds=int(options.get("timer_ms", 500))))
        if not ctx.signal_received("go"):
            return ctx.wait_for_signal("go", SIGNAL_NAME)
        if not ctx.hook_received(HOOK_ID):
            return ctx.create_hook(HOOK_ID, token_digest=str(options["hook_digest"]))
        if ctx.child_workflow_outcome("kid") is None:
            return ctx.start_child_workflow("kid", CHILD_SPEC, {"parent": invocation.run_id})
        if not ctx.step_completed("finish"):
            return ctx.schedule_step("finish", "work", {"charged": ctx.step_output(FLAKY)})
        return ctx.complete(
            {
                "go": ctx.signal_payload("go"),
                "approval": ctx.hook_payload(HOOK_ID),
                "kid": ctx.child_workflow_outcome("kid") is not None,
            }
        )

    def run_step(self, invocation: StepInvocation) -> JSON:
        self._record(invocation)
        key = invocation.idempotency_key
        time.sleep((zlib.crc32(key.encode()) % 60 + 10) / 1000)
        if invocation.step_name == "flaky" and invocation.attempt == 1:
            raise ConnectionError("the flaky dependency fails its first attempt")
        return {"step": invocation.step_id, "attempt": invocation.attempt}

    def _record(self, invocation: StepInvocation) -> None:
        directory = os.environ.get(EFFECTS_ENV)
        if not directory:
            return
        pid = os.getpid()
        with self._lock:  # steps run on several threads
            if self._log_fd is None or self._log_pid != pid:
                path = os.path.join(directory, f"effects-{pid}.log")
                self._log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._log_pid = pid
            fd = self._log_fd
        fields = (
            invocation.idempotency_key,
            invocation.run_id,
            invocation.step_id,
            str(invocation.attempt),
            str(pid),
            f"{time.time():.6f}",
        )
        os.write(fd, ("\t".join(fields) + "\n").encode())


runtime = ChaosRuntime()

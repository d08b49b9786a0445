"""Record the golden histories: ``python -m tests.golden.record [scenario ...]``.

Each scenario of ``workflows.py`` runs on a fresh memory store with a fake clock; every run it
touched is written to ``histories/<scenario>.json`` with its complete history and the decision
workflow code returned at each point (``after_sequence`` = the last event it saw). Re-record only
on purpose: a golden file is a promise that old histories keep replaying.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from flowstream.engine import FlowEngine
from flowstream.model.commands import RuntimeCommand
from flowstream.replay.context import WorkflowContext
from flowstream.stores.memory import MemoryEventStore
from tests.golden.workflows import SCENARIOS, STEPS, WORKFLOWS
from tests.support import FakeClock, make_runtime

HISTORIES = Path(__file__).parent / "histories"


def record(name: str) -> dict[str, Any]:
    decisions: dict[str, list[dict[str, Any]]] = {}

    def recorded(fn):  # type: ignore[no-untyped-def]
        def workflow(ctx: WorkflowContext) -> RuntimeCommand:
            seen = ctx.history[-1].sequence
            command = fn(ctx)
            decisions.setdefault(ctx.run_id, []).append(
                {"after_sequence": seen, "command": command.model_dump(mode="json")}
            )
            return command

        return workflow

    clock = FakeClock()
    store = MemoryEventStore(clock=clock)
    runtime = make_runtime(
        {name: recorded(fn) for name, fn in WORKFLOWS.items()}, STEPS, asynchronous=True
    )
    engine = FlowEngine(store, runtime, clock=clock)
    asyncio.run(SCENARIOS[name](engine, clock))
    return {
        "scenario": name,
        "runs": {
            run_id: {
                "history": [e.model_dump(mode="json") for e in store.read(run_id)],
                "decisions": decisions.get(run_id, []),
            }
            for run_id in store.list_runs()
        },
    }


def main(names: list[str]) -> None:
    HISTORIES.mkdir(exist_ok=True)
    for name in names or sorted(SCENARIOS):
        path = HISTORIES / f"{name}.json"
        path.write_text(json.dumps(record(name), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])

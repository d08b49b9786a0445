"""The embedded engine as a long-running host: ``run_until_idle``, ``wait`` and ``serve`` fire
timers and delayed retries on the real clock, and ``history --json`` exports for the replayer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import flowstream
from flowstream.examples import order
from flowstream.testing import Replayer
from tests.api import hosted

ROOT = Path(__file__).resolve().parents[2]


def test_run_until_idle_fires_timers_and_delayed_retries_until_nothing_is_due() -> None:
    async def scenario() -> tuple[flowstream.WorkflowRunSnapshot, float]:
        engine = flowstream.FlowEngine(flowstream.MemoryEventStore(), hosted.app)
        await engine.start("nap-1", hosted.app.spec(hosted.napper))
        began = time.monotonic()
        await engine.run_until_idle(timeout=10)
        return engine.snapshot("nap-1"), time.monotonic() - began

    snapshot, took = asyncio.run(scenario())
    assert snapshot.status is flowstream.RunStatus.COMPLETED
    assert snapshot.output == "nap@2"  # the retry waited its 50 ms, after the 50 ms timer
    assert 0.09 <= took < 5


def test_a_served_engine_takes_a_run_through_timer_signal_and_retries() -> None:
    async def scenario() -> str:
        engine = flowstream.FlowEngine(flowstream.MemoryEventStore(), hosted.app)
        client = flowstream.EmbeddedClient(engine)
        server = asyncio.create_task(engine.serve())
        try:
            handle = await client.start(hosted.errand, "k", id="errand-1")
            await asyncio.sleep(0.3)  # the retry and the timer fire on their own
            assert engine.snapshot("errand-1").signal_waits["go"].status.value == "waiting"
            await handle.signal("go", "now", id="go-1")
            return await handle.result(timeout=10)
        finally:
            server.cancel()

    assert asyncio.run(scenario()) == "k@2+now+k-a@2+k-b@2"


def test_history_json_exports_what_the_replayer_reads(tmp_path: Path) -> None:
    data = tmp_path / "data"

    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "flowstream", *args, "--data", str(data)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return result.stdout

    app = "flowstream.examples.order:runtime"
    cli("demo", "--app", app)
    export = cli("history", "--json", "--app", app)
    report = asyncio.run(Replayer(order.runtime).replay_export(export))
    assert report.ok and len(report.runs) == 1 and report.runs[0].decisions_checked >= 5


def test_the_cli_loads_an_app_by_module_alone() -> None:
    from flowstream.cli.local import load_runtime
    from flowstream.examples import shop

    assert load_runtime("flowstream.examples.shop") is shop.app
    assert load_runtime("flowstream.examples.shop:app") is shop.app
    assert load_runtime("flowstream.examples.order") is order.runtime


def test_kafka_start_pins_a_run_to_a_plain_code_workflow() -> None:
    from flowstream.cli.kafka import load_spec
    from flowstream.examples import shop

    assert load_spec("flowstream.examples.shop:order") == shop.app.spec(shop.order)
    assert load_spec("flowstream.examples.order").name == "order"

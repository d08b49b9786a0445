"""The test kit: time skipping, the always-replay mode, the replayer and the fixtures."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest

import flowstream
from flowstream.examples import shop
from flowstream.testing import (
    EPOCH,
    ReplayDivergedError,
    Replayer,
    WorkflowEnvironment,
    export_histories,
    load_histories,
)
from tests.api import workflows as wf

HERE = Path(__file__).resolve().parent


def test_always_replay_catches_a_workflow_that_reads_the_clock() -> None:
    env = WorkflowEnvironment(wf.app, always_replay=True)
    with pytest.raises(ReplayDivergedError, match="replays differently") as caught:
        asyncio.run(env.client.start(wf.clock_reader, id="clock-1"))
    assert "wait_created" in str(caught.value)
    assert env.divergences and env.divergences[0].run_id == "clock-1"


def test_always_replay_passes_a_workflow_that_uses_durable_time() -> None:
    env = WorkflowEnvironment(wf.app, always_replay=True)

    async def scenario() -> str:
        handle = await env.client.start(wf.honest_timer, id="timer-1")
        return await handle.result(timeout=5)

    assert asyncio.run(scenario()) == "woke"

    assert env.replays >= 4  # one replay from scratch per committed batch
    env.check()


def test_the_replayer_catches_a_changed_step_input_in_an_exported_history(
    tmp_path: Path,
) -> None:
    env = WorkflowEnvironment(shop.app)

    async def record() -> None:
        for number in ("1", "2"):
            handle = await env.client.start(
                shop.order, shop.Order(order_id=number, cents=100), id=f"order-{number}"
            )
            await handle.signal("shipped", f"T-{number}", id=f"ship-{number}")
            await handle.result(timeout=5)

    asyncio.run(record())
    export = tmp_path / "orders.json"
    export.write_bytes(export_histories(env.engine.history(r) for r in env.engine.list_runs()))
    assert set(load_histories(export.read_bytes())) == {"order-1", "order-2"}

    same = asyncio.run(Replayer(shop.app).replay_file(export))
    assert same.ok and len(same.runs) == 2 and all(r.decisions_checked > 5 for r in same.runs)

    changed = flowstream.App()
    changed.step(shop.reserve_stock)
    changed.step(shop.charge_card)

    @changed.workflow(name="order", signals=["shipped"])
    async def order(ctx: flowstream.Context, order: shop.Order) -> None:
        await ctx.step(shop.reserve_stock, order)
        # The new code charges a rounded amount: old runs took another input.
        await ctx.step(shop.charge_card, order.model_copy(update={"cents": 200}))

    report = asyncio.run(Replayer(changed).replay_file(export))
    assert not report.ok and len(report.failures) == 2
    with pytest.raises(flowstream.NonDeterministicError, match='"cents":200'):
        report.raise_for_problems()


def test_fixtures_give_an_environment_of_the_runtime_under_test(
    flow_env: WorkflowEnvironment, flow_env_replaying: WorkflowEnvironment
) -> None:
    async def scenario(env: WorkflowEnvironment) -> str:
        handle = await env.client.start(shop.order, shop.Order(order_id="f", cents=5), id="f")
        await handle.signal("shipped", "T", id="f-shipped")
        return await handle.result(timeout=5)

    began = time.monotonic()
    for env in (flow_env, flow_env_replaying):
        assert asyncio.run(scenario(env)) == "shipped as T"
    assert time.monotonic() - began < 2.0
    assert flow_env_replaying.replays > 0 and flow_env.replays == 0


def test_the_replayer_fixture(flow_replayer: Replayer) -> None:
    report = asyncio.run(flow_replayer.replay([]))
    assert report.ok and report.runs == []


def test_a_result_that_only_outside_input_could_bring_says_what_the_run_waits_for() -> None:
    env = WorkflowEnvironment(shop.app, idle_timeout=0.2)

    async def scenario() -> str:
        handle = await env.client.start(shop.order, shop.Order(order_id="w", cents=1), id="w")
        return await handle.result()  # nobody sends "shipped"

    began = time.monotonic()
    with pytest.raises(TimeoutError, match="waiting for signal 'shipped'"):
        asyncio.run(scenario())
    assert time.monotonic() - began < 2.0
    assert env.clock() >= EPOCH + timedelta(hours=1)  # the timer passed; then only input


def test_exported_histories_kept_with_the_code_replay_against_it() -> None:
    # ``python -m tests.api.record`` wrote them: one finished run and one waiting for its signal.
    report = asyncio.run(Replayer(shop.app).replay_file(HERE / "histories" / "shop.json"))
    assert [run.run_id for run in report.runs] == ["order-1", "order-2"]
    assert report.ok, [run.problems for run in report.runs]
    assert all(run.decisions_checked >= 4 for run in report.runs)

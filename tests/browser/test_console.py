"""The web console in headless Chromium against the real gateway: over an embedded store on
disk, and over the broker with a real ``flowstream worker``.

One scenario, the same in both modes: the console asks for the gateway's token (again after a
wrong one), lists the runs, filters them to the suspended ones, opens the run that waits for a
manager's approval (its page shows the check step's failed first attempt, the open hook, the
timeline), resumes the hook through its webhook URL and sees the run complete; then it signals
one run, asks for a retry of another and cancels it, and shows a continuation chain with its
child. Screenshots of each page are kept in the test artifacts (see ``conftest``), their paths
printed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowstream.replay.decide import token_digest
from tests.browser.apps import SPEC
from tests.browser.gateway import GatewayServer
from tests.processor.harness import Cluster

APP = "tests.browser.apps:runtime"
SPEC_AT = "tests.browser.apps:SPEC"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def embedded_gateway(tmp_path: Path) -> Iterator[GatewayServer]:
    options = ["gateway", "--data", str(tmp_path / "store"), "--app", APP, "--workflow", SPEC_AT]
    gateway = GatewayServer(options, tmp_path)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def kafka_gateway(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> Iterator[GatewayServer]:
    cluster = Cluster(kafka_bootstrap, unique_prefix, tmp_path)
    gateway = None
    try:
        cluster.start("w1", app=APP)
        options = ["kafka", "gateway", "--bootstrap", kafka_bootstrap, "--prefix", unique_prefix]
        options += ["--index-dir", str(tmp_path / "index"), "--workflow", SPEC_AT]
        gateway = GatewayServer(options, tmp_path)
        yield gateway
    finally:
        if gateway is not None:
            gateway.stop()
        cluster.close()


def test_console_embedded(
    browser_page: Any, embedded_gateway: GatewayServer, artifacts: Path
) -> None:
    drive_console(browser_page, embedded_gateway, artifacts, "embedded")


@pytest.mark.kafka
def test_console_kafka(browser_page: Any, kafka_gateway: GatewayServer, artifacts: Path) -> None:
    drive_console(browser_page, kafka_gateway, artifacts, "kafka")


class Shots:
    """Numbered screenshots of one mode; prints each path."""

    def __init__(self, page: Any, folder: Path, mode: str) -> None:
        self.page = page
        self.folder = folder
        self.mode = mode
        self.count = 0

    def take(self, name: str) -> None:
        self.count += 1
        path = self.folder / f"{self.mode}-{self.count:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")


def seed(gateway: GatewayServer, tag: str, hook_token: str) -> dict[str, str]:
    """Four runs through the API: one waits for its hook (after a failed first attempt), two
    for a signal, one continues as new once and starts a child before it completes."""
    ids = {name: f"{name}-{tag}" for name in ("approve", "signal", "cancel", "chain")}
    inputs: dict[str, Any] = {
        "approve": {"flaky": True, "hook_digest": token_digest(hook_token)},
        "signal": {"signal": True},
        "cancel": {"signal": True},
        "chain": {"hops": 1, "child": True},
    }
    for name, run_id in ids.items():
        body = {"workflow": SPEC.name, "run_id": run_id, "input": inputs[name]}
        gateway.call("POST", "/api/runs", body)
    for name in ("approve", "signal", "cancel"):
        gateway.wait_for(ids[name], "suspended")
    chained = gateway.wait_for(ids["chain"], "continued_as_new")
    ids["chain-next"] = chained["snapshot"]["outcome"]["successor_run_id"]
    gateway.wait_for(ids["chain-next"], "completed")
    return ids


def drive_console(page: Any, gateway: GatewayServer, folder: Path, mode: str) -> None:
    from playwright.sync_api import expect

    # A shared CI machine under load draws and polls slower than the 5 s Playwright expects.
    expect.set_options(timeout=30_000)
    hook_token = f"hook-{uuid.uuid4().hex}"
    ids = seed(gateway, uuid.uuid4().hex[:6], hook_token)
    shots = Shots(page, folder, mode)

    # The console's files need no credential; its API does, and the console asks for it.
    page.goto(f"{gateway.url}/")
    expect(page.locator("#token-form")).to_be_visible()
    shots.take("token")
    page.fill("#api-token", "not-the-token")
    page.click("#token-save")
    expect(page.locator("#token-form")).to_contain_text("refused this token")
    assert page.evaluate("sessionStorage.getItem('flowstream.token')") is None
    page.fill("#api-token", gateway.token)
    page.click("#token-save")
    runs = page.locator("#runs")
    for run_id in ids.values():
        expect(runs.locator(f'tr[data-run="{run_id}"]')).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('flowstream.token')") == gateway.token
    assert page.evaluate("localStorage.length") == 0
    shots.take("runs")

    # Filter to the suspended runs.
    page.select_option("#filter-status", "suspended")
    page.click("#filter-apply")
    expect(page).to_have_url(f"{gateway.url}/#/runs?status=suspended")
    expect(runs.locator("tbody tr")).to_have_count(3)
    rows = runs.locator("tbody tr")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.status)")) == ["suspended"] * 3
    listed = set(rows.evaluate_all("rs => rs.map(r => r.dataset.run)"))
    assert listed == {ids["approve"], ids["signal"], ids["cancel"]}
    shots.take("suspended")

    # The run waiting for approval: its first check attempt failed and was retried.
    runs.locator(f'tr[data-run="{ids["approve"]}"] a.run-link').click()
    expect(page.locator("#run-id")).to_have_text(ids["approve"])
    expect(page.locator(".facts")).to_have_attribute("data-status", "suspended")
    expect(page.locator('#waits tr[data-wait="hook:approval"]')).to_be_visible()
    check = page.locator('#steps tr[data-step="check"]')
    expect(check).to_have_attribute("data-status", "completed")
    expect(check.locator('li[data-attempt="1"]')).to_contain_text(
        "the stock service did not answer"
    )
    expect(check.locator('li[data-attempt="2"]')).to_contain_text("completed")
    expect(page.locator('#hooks tr[data-hook="approval"]')).to_have_attribute(
        "data-status", "active"
    )
    expect(page.locator('#timeline li[data-type="hook_created"]')).to_have_count(1)
    expect(page.locator('#timeline li[data-type="step_retrying"]')).to_have_count(1)
    shots.take("approve-suspended")

    # Resume its hook through the webhook URL; the page follows the run to its end.
    page.fill("#hook-token", hook_token)
    page.fill("#hook-payload", '{"approved_by": "ana"}')
    page.click("#hook-resume")
    expect(page.locator(".facts")).to_have_attribute("data-status", "completed", timeout=60_000)
    expect(page.locator('#timeline li[data-type="hook_received"]')).to_contain_text("ana")
    expect(page.locator('#timeline li[data-type="run_completed"]')).to_have_count(1)
    expect(page.locator('#hooks tr[data-hook="approval"]')).to_have_attribute(
        "data-status", "received"
    )
    expect(page.locator("#actions")).to_be_hidden()
    shots.take("approve-completed")
    done = gateway.run(ids["approve"])
    assert done["snapshot"]["output"]["approval"] == {"approved_by": "ana"}
    assert hook_token not in page.content()

    # Signal a run from its page.
    page.goto(f"{gateway.url}/#/runs/{ids['signal']}")
    expect(page.locator('#waits tr[data-wait="signal:go"]')).to_be_visible()
    page.fill("#signal-name", "go")
    page.fill("#signal-payload", '{"by": "console"}')
    page.click("#signal-send")
    expect(page.locator(".facts")).to_have_attribute("data-status", "completed", timeout=60_000)
    expect(page.locator('#signals tr[data-signal-wait="go"]')).to_contain_text("completed")
    shots.take("signal-completed")

    # Ask for a retry (nothing to redo: the answer says so), then cancel.
    page.goto(f"{gateway.url}/#/runs/{ids['cancel']}")
    expect(page.locator(".facts")).to_have_attribute("data-status", "suspended")
    page.click("#retry-run")
    expect(page.locator("#notice")).to_contain_text("retry:")
    page.fill("#cancel-reason", "customer changed their mind")
    page.click("#cancel-run")
    expect(page.locator(".facts")).to_have_attribute("data-status", "cancelled", timeout=60_000)
    expect(page.locator('#timeline li[data-type="run_cancelled"]')).to_have_count(1)
    shots.take("cancelled")

    # A continuation chain: the successor's page links back to the first run, shows its child.
    page.goto(f"{gateway.url}/#/runs/{ids['chain-next']}")
    expect(page.locator(".facts")).to_have_attribute("data-status", "completed")
    expect(page.locator(f'#chain a[href="#/runs/{ids["chain"]}"]')).to_be_visible()
    child = page.locator('#children tr[data-child="packing"]')
    expect(child).to_contain_text("completed")
    shots.take("chain")
    child.locator("a.run-link").click()
    expect(page.locator(".facts")).to_have_attribute("data-status", "completed")
    expect(page.locator("#run-head")).to_contain_text(ids["chain-next"])
    page.goto(f"{gateway.url}/#/runs/{ids['chain']}")
    expect(page.locator(f'#chain a[href="#/runs/{ids["chain-next"]}"]')).to_be_visible()
    expect(page.locator(".facts")).to_have_attribute("data-status", "continued_as_new")
    shots.take("chain-first")

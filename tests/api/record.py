"""Record the exported histories the Replayer test replays: ``python -m tests.api.record``.

Runs of the README's workflow (``flowstream.examples.shop``) and of the host app, recorded on
the test kit's virtual clock and written in the export format of ``flowstream history --json``
to ``histories/``. Re-record only on purpose: an exported history is a promise that runs
started by the code that wrote it keep replaying against the code of today.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from flowstream.examples import shop
from flowstream.testing import WorkflowEnvironment, export_histories

HISTORIES = Path(__file__).parent / "histories"


async def record_shop() -> bytes:
    env = WorkflowEnvironment(shop.app)
    for number in ("1", "2"):
        handle = await env.client.start(
            shop.order, shop.Order(order_id=number, cents=100 * int(number)), id=f"order-{number}"
        )
        if number == "1":  # the second stays open, waiting for its signal
            await handle.signal("shipped", f"T-{number}", id=f"order-{number}-shipped")
            await handle.result()
    await env.run_until_idle()
    return export_histories(env.engine.history(r) for r in env.engine.list_runs())


def main() -> None:
    HISTORIES.mkdir(exist_ok=True)
    (HISTORIES / "shop.json").write_bytes(asyncio.run(record_shop()) + b"\n")


if __name__ == "__main__":
    main()

"""Typed user code passes ``mypy --strict``: the types of steps, signals, children and handles
flow through the context (``typed_example.py`` asserts them with ``assert_type``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.timeout(300)
def test_typed_user_code_passes_mypy_strict() -> None:
    files = [HERE / "typed_example.py", ROOT / "flowstream" / "examples" / "shop.py"]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_catches_a_wrongly_typed_step_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import flowstream\n"
        "from tests.api.typed_example import Order, count\n"
        "async def wf(ctx: flowstream.Context, order: Order) -> None:\n"
        "    n: str = await ctx.step(count, order)\n"
        "    await ctx.step(count, 'not an order')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    # The output is an int, not a str (line 4); a str is not an Order (line 5).
    assert "bad.py:4: error" in result.stdout and "bad.py:5: error" in result.stdout

"""The linters are part of the test command: ruff over the code and tests, mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.timeout(600)
def test_ruff() -> None:
    result = _run("ruff", "check", "--no-cache", "flowstream", "tests")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_mypy_strict() -> None:
    # Configuration (strict, files, plugins) comes from pyproject.toml.
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr

"""The linters are part of the test command: ruff over the code and tests, mypy --strict, and the
import contracts (layers, one importer per heavy dependency) of pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return _command(sys.executable, "-m", *args)


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
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


@pytest.mark.timeout(600)
def test_import_contracts() -> None:
    # Contracts come from [tool.importlinter] in pyproject.toml. The script sits next to the
    # interpreter; it reads the flowstream of the current directory.
    script = Path(sys.executable).with_name("lint-imports")
    if not script.exists():
        pytest.fail(f"{script} is missing: install the test extra (pip install -e '.[test]')")
    result = _command(str(script), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr

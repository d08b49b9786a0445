"""The linters are part of the test command: ruff over the code and tests, mypy --strict."""

from __future__ import annotations

import ast
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


def test_only_the_clients_module_imports_confluent_kafka() -> None:
    allowed = ROOT / "flowstream" / "kafka" / "clients.py"
    offenders = []
    for path in sorted((ROOT / "flowstream").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if path != allowed and any(n.split(".")[0] == "confluent_kafka" for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], "import Kafka clients from flowstream.kafka.clients instead"

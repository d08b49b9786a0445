"""The schemas ship with the package, have one source, and only the codec imports fastavro."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

import flowstream

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(flowstream.__file__).resolve().parent


def test_schemas_at_the_root_are_the_package_schemas() -> None:
    assert (ROOT / "schemas").resolve() == PACKAGE / "schemas"


def test_package_data_covers_every_schema_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["flowstream"]
    files = [p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "schemas").rglob("*.avsc")]
    assert len(files) >= 15
    uncovered = [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert not uncovered, f"add these to [tool.setuptools.package-data]: {uncovered}"


def test_only_the_codec_imports_fastavro() -> None:
    importers = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "fastavro" or n.startswith("fastavro.") for n in names):
                importers.append(path.relative_to(PACKAGE).as_posix())
    assert sorted(set(importers)) == ["codec.py"]

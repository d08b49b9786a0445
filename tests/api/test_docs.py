"""Every code block of README.md and docs/ runs as a test.

How blocks are marked (the fence's info string):

* ``python``: run. The blocks of one file run in order in one namespace, so a later block uses
  what an earlier one defined (the README's first example, then its test).
* ``python fragment``: a piece that cannot run on its own (it needs a broker, say); compiled.
* ``bash`` (commands; the CLI's own tests run them), ``text`` (diagrams, output), ``toml``,
  ``json``: not Python, not run.

A block without a language, or in another one, fails the test: say what it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_PYTHON = {"bash", "text", "toml", "json"}


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, info string, code) of each fenced block of ``path``."""
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(1).strip(), match.group(2))
        for match in _FENCE.finditer(text)
    ]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
@pytest.mark.timeout(120)
def test_every_code_block_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem.lower()}"}
    for line, info, code in blocks(path):
        where = f"{path.name}:{line}"
        if info == "python":
            exec(compile(code, where, "exec"), namespace)
        elif info == "python fragment":
            compile(code, where, "exec")
        else:
            assert info in NOT_PYTHON, f"{where}: mark the block (python, bash, text...)"
    capsys.readouterr()


def test_the_readme_opens_with_the_plain_code_workflow_in_at_most_25_lines() -> None:
    python = [(line, code) for line, info, code in blocks(ROOT / "README.md") if info == "python"]
    _, first = python[0]
    assert len(first.splitlines()) <= 25
    imports = [row for row in first.splitlines() if row.startswith(("import ", "from "))]
    assert imports == ["import flowstream"]
    assert "@app.workflow" in first and "ctx.sleep" in first and "wait_for_signal" in first
    assert first.count("@app.step") == 3 and "retry=" in first
    # The raw contract comes after it.
    assert "def run_workflow" not in first
    assert any("def run_workflow" in code for _, code in python[1:])
    # flowstream.examples.shop is the same code (what the Kafka workers serve).
    module = (ROOT / "flowstream" / "examples" / "shop.py").read_text()
    body = module.split('"""', 2)[2]
    assert [r for r in body.splitlines() if r.strip()] == [
        r for r in first.splitlines() if r.strip()
    ]

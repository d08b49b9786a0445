"""``flowstream completion bash`` completes commands, Kafka verbs and each one's options, from
the parser itself; checked by running the script in bash."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from flowstream.cli import main


@pytest.mark.parametrize(
    ("words", "wanted"),
    [
        (["de"], "demo describe dev-kafka"),
        (["kafka", "s"], "signal start status"),
        (["kafka", "start", "--w"], "--wait --workflow"),
        (["list", "--s"], "--status"),
        (["--ver"], "--version"),
    ],
)
def test_bash_completes_commands_verbs_and_options(
    words: list[str], wanted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    line = shlex.join(["flowstream", *words])
    ask = f"COMP_WORDS=({line}); COMP_CWORD={len(words)}; _flowstream"
    probe = f'{script}\n{ask}\necho "${{COMPREPLY[@]}}"'
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == wanted

"""The rule of the test apps that patch the processor (``tests/*/*_app.py`` that inject aborts,
hangs or gates): they patch the one worker process that loads them with ``--app``, never the test
process. Imported there (a test module taking a constant from one), a patch would reach every
processor the test process runs in its threads: the scenario suite's kafka mode once had every
seventh commit aborted that way, for the whole session, and failed in CI only.
"""

from __future__ import annotations

import sys

__all__ = ["worker_process_only"]


def worker_process_only(app: str) -> None:
    """Refuse to patch the processor of a process that runs pytest."""
    if "pytest" in sys.modules or "_pytest" in sys.modules:
        raise ImportError(
            f"{app} patches the processor of the worker that loads it: the test process must "
            "not import it (take its constants from the module they are defined in)"
        )

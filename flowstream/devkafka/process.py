"""Broker processes: start detached, find again by PID file, signal, and wait for exit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["is_alive", "port_is_free", "read_pid", "spawn", "terminate"]

#: Children started by this interpreter, kept so they are reaped (no zombies, no
#: ``ResourceWarning`` from a collected ``Popen`` of a running process).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def spawn(command: Sequence[str], *, log_path: Path, cwd: Path, nice: int = 0) -> int:
    """Start ``command`` in its own session, stdout and stderr appended to ``log_path``; with
    ``nice``, at that niceness (every thread it makes inherits it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"===== flowstream dev-kafka: starting at {stamp} =====\n".encode())
        log.flush()
        child = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            # Ctrl-C in the shell that ran `dev-kafka start` must not stop the broker.
            start_new_session=True,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
    _CHILDREN[child.pid] = child
    return child.pid


def renice(pid: int, nice: int) -> bool:
    """Set every thread of process ``pid`` to niceness ``nice`` (Linux keeps one per thread);
    ``False`` where that is not allowed (lowering it needs ``CAP_SYS_NICE``) or not possible."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    try:
        for tid in threads:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        return False
    return True


def exit_code(pid: int) -> int | None:
    """The exit code of a child of this interpreter that has ended, else ``None``."""
    child = _CHILDREN.get(pid)
    return None if child is None else child.poll()


def is_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and, where ``/proc`` can tell, its command line contains ``marker``.

    The marker (the node's ``server.properties`` path) keeps a recycled PID from passing for
    the broker.
    """
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self").exists():
        return True
    try:
        # A zombie's command line is empty, so it does not count as alive either.
        return marker.encode() in cmdline.read_bytes()
    except OSError:
        return False


def terminate(processes: Iterable[tuple[int, str]], *, grace: float) -> None:
    """SIGTERM every process at once, wait up to ``grace`` seconds, then SIGKILL the rest."""
    pending = [(pid, marker) for pid, marker in processes if is_alive(pid, marker)]
    for pid, _ in pending:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        pending = [(pid, marker) for pid, marker in pending if is_alive(pid, marker)]
    for pid, _ in pending:
        _signal(pid, signal.SIGKILL)
    kill_deadline = time.monotonic() + 10
    while pending and time.monotonic() < kill_deadline:
        time.sleep(0.05)
        pending = [(pid, marker) for pid, marker in pending if is_alive(pid, marker)]
    for pid, _ in processes:
        _forget(pid)


def kill(pid: int, marker: str) -> None:
    """SIGKILL one process and wait until it is gone."""
    if is_alive(pid, marker):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_alive(pid, marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    _forget(pid)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _forget(pid: int) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)


def read_pid(path: Path) -> int | None:
    """The PID in ``path``, or ``None`` if the file is missing or unreadable."""
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like Kafka's own listener, ignore connections lingering in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False

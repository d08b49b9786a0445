"""How long a step's thread waits for the interpreter lock beside a busy loop.

A loop thread does Python work with a short system call every few dozen microseconds (as the
processor's loop calls librdkafka and RocksDB); a step thread makes ``--calls`` short system
calls (as a handler that talks to a service does). Printed: the step's time, median and worst of
``--steps`` steps, with the loop never pausing (``none``), and with a zero sleep after each
millisecond of its work (``zero-sleep``, what ``StepRunner.make_way`` does between decisions once
a step has run 50 ms). Run it quiet and beside load: the starvation shows on a quiet machine.

    python -m benchmarks.gil_handoff [--calls 32] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time


def _loop(stop: threading.Event, pause: bool, laps: list[int]) -> None:
    n = 0
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < 0.001:
            for _ in range(2000):
                n += 1
            os.stat(".")  # the lock is released and taken back at once
        laps[0] += 1
        if pause:
            time.sleep(0)


def _step(calls: int, into: list[float]) -> None:
    began = time.perf_counter()
    for _ in range(calls):
        os.stat(".")
    into.append(time.perf_counter() - began)


def measure(calls: int, steps: int, pause: bool) -> tuple[float, float, float]:
    stop = threading.Event()
    laps = [0]
    loop = threading.Thread(target=_loop, args=(stop, pause, laps), daemon=True)
    loop.start()
    time.sleep(0.2)
    times: list[float] = []
    first, began = laps[0], time.perf_counter()
    for _ in range(steps):
        thread = threading.Thread(target=_step, args=(calls, times))
        thread.start()
        thread.join()
    rate = (laps[0] - first) / (time.perf_counter() - began)
    stop.set()
    loop.join()
    return statistics.median(times), max(times), rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32, help="system calls a step makes")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}, a step of {args.calls} system calls, {args.steps} steps")
    print("| loop | step median s | step worst s | loop ms of work per s |")
    print("|---|---|---|---|")
    for name, pause in (("none", False), ("zero-sleep", True)):
        median, worst, rate = measure(args.calls, args.steps, pause)
        print(f"| {name} | {median:.4f} | {worst:.4f} | {rate:.0f} |")


if __name__ == "__main__":
    main()

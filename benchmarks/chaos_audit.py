"""The chaos test's auditor: reads the events topic on its own and checks every run's history.

It shares no code with flowstream (:mod:`benchmarks.chaos_wire` reads the topic with a plain
confluent-kafka consumer and decodes with fastavro and the ``.avsc`` files of ``schemas/``), and
its checks are written from the event schema's meaning alone.

The topic is read twice, ``read_committed`` and ``read_uncommitted``, once no transaction is
open on it (its last stable offset has reached its high watermark). Checks:

* committed view: each run's events lie on one partition, their sequences run 1, 2, ... with no
  gap and no duplicate, the first is ``RunCreated``, exactly one is terminal and it is the last,
  and the run completed; no event id appears twice; every record decodes;
* every run the driver started, and every child a run requested, is terminal; each child
  request is resolved once;
* every signal the driver sent is received exactly once (and no other), every hook the driver
  resumed is received exactly once, every timer (``WaitCreated``) completed once, every step
  retry was followed by a later attempt, every created step completed once;
* the two views: every committed record is in the uncommitted view with the same bytes; every
  record seen only uncommitted is from an aborted transaction, and none of its events (by event
  id) is visible committed;
* side effects, from the chaos app's logs: every completed step ran at least once; steps are
  at least once, so keys and attempts that ran more than once are counted, not failed.

``python -m benchmarks.chaos_audit --bootstrap ... --prefix ... --expect expected.json
--effects DIR`` audits a finished run again from the manifest ``benchmarks.chaos`` wrote.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from benchmarks.chaos_wire import (
    Decoder,
    Event,
    Record,
    read_dead_letters,
    read_view,
    stable_ends,
    topic_partitions,
)

__all__ = ["Audit", "Expectations", "audit", "format_audit"]

TERMINAL = frozenset(
    {
        "RunCompleted",
        "RunFailed",
        "RunCancelled",
        "RunTimedOut",
        "RunRetryExhausted",
        "RunContinuedAsNew",
    }
)
#: Violations listed in full; past this many of one check, only counted.
_DETAILS_PER_CHECK = 20


@dataclass
class Expectations:
    """What the driver did: the runs it started, the signals it sent, the hooks it resumed."""

    runs: list[str] = field(default_factory=list)
    #: run id -> the signal ids sent to it (each distinct; a resent signal is listed once)
    signals: dict[str, list[str]] = field(default_factory=dict)
    #: run id -> the hook id it resumed by token
    hooks: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Expectations:
        data = json.loads(path.read_text())
        return cls(runs=data["runs"], signals=data["signals"], hooks=data["hooks"])


@dataclass
class Audit:
    """Figures, and the violations found (empty when every check passed)."""

    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    by_check: Counter[str] = field(default_factory=Counter)
    #: run id -> the checks it failed (violations that concern one run)
    by_run: dict[str, set[str]] = field(default_factory=dict)
    #: violations that concern no one run (the views, open transactions, decoding)
    unattributed: int = 0

    def violate(self, check: str, message: str, run_id: str | None = None) -> None:
        if run_id is None:
            self.unattributed += 1
        else:
            self.by_run.setdefault(run_id, set()).add(check)
        self.by_check[check] += 1
        if self.by_check[check] <= _DETAILS_PER_CHECK:
            self.violations.append(f"[{check}] {message}")
        elif self.by_check[check] == _DETAILS_PER_CHECK + 1:
            self.violations.append(f"[{check}] ... (more not listed)")

    @property
    def violation_count(self) -> int:
        return sum(self.by_check.values())


# -- the checks -----------------------------------------------------------------------------


def _history(events: list[Event], limit: int = 40) -> str:
    shown = [e.brief() for e in events[:limit]]
    return " ".join(shown) + (" ..." if len(events) > limit else "")


def _check_history(run_id: str, events: list[Event], result: Audit) -> None:
    """Sequences, the first and the terminal event, and the run's waits."""
    partitions = {e.partition for e in events}
    if len(partitions) > 1:
        result.violate(
            "one-partition", f"{run_id} spans partitions {sorted(partitions)}", run_id=run_id
        )
    sequences = [e.sequence for e in events]
    if sequences != list(range(1, len(events) + 1)):
        counts = Counter(sequences)
        duplicated = sorted(s for s, n in counts.items() if n > 1)
        missing = sorted(set(range(1, max(sequences) + 1)) - set(sequences))
        if duplicated:
            result.violate(
                "duplicate-sequence", f"{run_id}: {duplicated}: {_history(events)}", run_id=run_id
            )
        if missing:
            result.violate(
                "sequence-gap", f"{run_id}: missing {missing}: {_history(events)}", run_id=run_id
            )
        _check_order(run_id, events, result)
    if events[0].type != "RunCreated":
        result.violate("first-event", f"{run_id} begins with {events[0].brief()}", run_id=run_id)
    terminal = [i for i, e in enumerate(events) if e.type in TERMINAL]
    if len(terminal) > 1:
        result.violate(
            "one-terminal", f"{run_id} has {len(terminal)}: {_history(events)}", run_id=run_id
        )
    elif terminal and terminal[0] != len(events) - 1:
        result.violate("terminal-last", f"{run_id}: {_history(events)}", run_id=run_id)
    if terminal and events[terminal[0]].type != "RunCompleted":
        result.violate("completed", f"{run_id} ended {events[terminal[0]].brief()}", run_id=run_id)
    _check_waits(run_id, events, result)


def _check_order(run_id: str, events: list[Event], result: Audit) -> None:
    """A sequence seen for the first time after a higher one: written out of order."""
    highest: Event | None = None
    seen: set[int] = set()
    for event in events:
        if highest is not None and event.sequence < highest.sequence and event.sequence not in seen:
            result.violate(
                "sequence-order",
                f"{run_id}: {event.brief()} written after {highest.brief()}",
                run_id=run_id,
            )
            return
        seen.add(event.sequence)
        if highest is None or event.sequence > highest.sequence:
            highest = event


def _check_waits(run_id: str, events: list[Event], result: Audit) -> None:
    """Timers fired once, retries retried, steps completed once, children resolved once."""
    ended = any(e.type in TERMINAL for e in events)
    pairs = (
        ("timer-fired", "WaitCreated", "WaitCompleted", "wait_id"),
        ("step-once", "StepCreated", "StepCompleted", "step_id"),
        ("child-resolved", "ChildWorkflowRequested", "ChildWorkflowResolved", "child_id"),
    )
    for check, opened, closed, key in pairs:
        made = Counter(e.body[key] for e in events if e.type == opened)
        done = Counter(e.body[key] for e in events if e.type == closed)
        for subject in made.keys() | done.keys():
            if made[subject] != 1 or done[subject] > 1 or (ended and not done[subject]):
                result.violate(
                    check,
                    f"{run_id} {key} {subject}: {opened} {made[subject]}, {closed} {done[subject]}",
                    run_id=run_id,
                )
    for i, event in enumerate(events):
        if event.type == "StepRetrying" and ended:
            step_id, attempt = event.body["step_id"], event.body["attempt"]
            if not any(
                e.type == "StepStarted"
                and e.body["step_id"] == step_id
                and e.body["attempt"] > attempt
                for e in events[i + 1 :]
            ):
                result.violate(
                    "retry-fired", f"{run_id} {step_id} after attempt {attempt}", run_id=run_id
                )


def _check_expectations(
    histories: dict[str, list[Event]], expected: Expectations, result: Audit
) -> None:
    """Every started run and child terminal; every signal and hook received exactly once."""
    children = {
        e.body["child_run_id"]
        for events in histories.values()
        for e in events
        if e.type == "ChildWorkflowRequested"
    }
    for run_id in sorted({*expected.runs, *children}):
        events = histories.get(run_id)
        if not events:
            result.violate("started-terminal", f"{run_id} has no committed event", run_id=run_id)
        elif not any(e.type in TERMINAL for e in events):
            result.violate(
                "started-terminal", f"{run_id} is not terminal: {_history(events)}", run_id=run_id
            )
    known = set(expected.runs) | children
    unknown = sorted(set(histories) - known)
    result.figures["runs_unknown"] = len(unknown)
    for run_id, signal_ids in expected.signals.items():
        events = histories.get(run_id, [])
        received = Counter(e.body["signal_id"] for e in events if e.type == "SignalReceived")
        for signal_id in signal_ids:
            if received[signal_id] != 1:
                result.violate(
                    "signal-once",
                    f"{run_id} signal {signal_id} received {received[signal_id]} times",
                    run_id=run_id,
                )
        for signal_id in set(received) - set(signal_ids):
            result.violate(
                "signal-once", f"{run_id} received signal {signal_id}, never sent", run_id=run_id
            )
    for run_id, hook_id in expected.hooks.items():
        events = histories.get(run_id, [])
        created = sum(e.type == "HookCreated" and e.body["hook_id"] == hook_id for e in events)
        received = sum(e.type == "HookReceived" and e.body["hook_id"] == hook_id for e in events)
        if created != 1 or received != 1:
            result.violate(
                "hook-once",
                f"{run_id} hook {hook_id}: created {created}, received {received}",
                run_id=run_id,
            )
    result.figures["runs_started"] = len(expected.runs)
    result.figures["children"] = len(children)
    result.figures["runs_terminal"] = sum(
        any(e.type in TERMINAL for e in histories.get(r, [])) for r in known
    )


def _compare_views(
    committed: dict[tuple[int, int], Record],
    uncommitted: dict[tuple[int, int], Record],
    committed_ids: set[str],
    decoder: Decoder,
    committed_heads: set[tuple[str, int]],
    result: Audit,
) -> None:
    """Committed records are a subset of the uncommitted view; the rest, aborted, stays unseen."""
    for at, record in committed.items():
        other = uncommitted.get(at)
        if other is None or other.value != record.value:
            result.violate("views-agree", f"committed record {at} differs read_uncommitted")
    aborted = [record for at, record in uncommitted.items() if at not in committed]
    kinds = Counter(record.kind for record in aborted)
    redecided = 0
    for record in aborted:
        if record.kind != "event":
            continue
        try:
            event = decoder.event(record)
        except ValueError:
            continue  # an aborted record that does not decode harms no reader
        if event.event_id in committed_ids:
            result.violate(
                "aborted-invisible", f"aborted event {event.brief()} {event.run_id} is committed"
            )
        redecided += (event.run_id, event.sequence) in committed_heads
    result.figures["aborted_records"] = len(aborted)
    result.figures["aborted_by_kind"] = dict(kinds)
    result.figures["aborted_events_decided_again"] = redecided


def _check_effects(
    effects_dir: Path | None, histories: dict[str, list[Event]], result: Audit
) -> None:
    """Every completed step ran; count the steps (and attempts) that ran more than once."""
    if effects_dir is None:
        return
    by_key: Counter[str] = Counter()
    by_attempt: Counter[tuple[str, str]] = Counter()
    started: dict[tuple[str, str], list[float]] = {}
    malformed = 0
    for path in sorted(effects_dir.glob("effects-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) != 6:
                malformed += 1
                continue
            key, run_id, step_id, attempt, _, when = parts
            by_key[key] += 1
            by_attempt[(key, attempt)] += 1
            started.setdefault((run_id, step_id), []).append(float(when))
    late = 0
    completed_steps = 0
    for run_id, events in histories.items():
        for event in events:
            if event.type != "StepCompleted":
                continue
            completed_steps += 1
            runs = started.get((run_id, event.body["step_id"]))
            if not runs:
                result.violate(
                    "step-ran",
                    f"{run_id} step {event.body['step_id']} completed, never ran",
                    run_id=run_id,
                )
                continue
            late += sum(t > event.timestamp.timestamp() for t in runs)
    repeats = [n for n in by_attempt.values() if n > 1]
    result.figures.update(
        {
            "step_executions": sum(by_key.values()),
            "steps_completed": completed_steps,
            "keys_run_more_than_once": sum(n > 1 for n in by_key.values()),
            "attempts_run_more_than_once": len(repeats),
            "most_runs_of_one_attempt": max(repeats, default=1),
            "executions_begun_after_completion_recorded": late,
            "effect_lines_malformed": malformed,
        }
    )


# -- the audit --------------------------------------------------------------------------------


def audit(
    bootstrap: str,
    prefix: str,
    expected: Expectations,
    effects_dir: Path | None = None,
    *,
    stable_timeout: float = 60,
) -> Audit:
    """Read ``<prefix>.events`` both ways and run every check."""
    result = Audit()
    decoder = Decoder()
    topic = f"{prefix}.events"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = topic_partitions(admin, topic)
    began = time.monotonic()
    ends, still_open = stable_ends(admin, topic, partitions, stable_timeout)
    for partition in still_open:
        result.violate(
            "no-open-transaction",
            f"partition {partition}: a transaction is open {stable_timeout:.0f} s after the end",
        )
    committed = read_view(bootstrap, topic, ends, "read_committed")
    uncommitted = read_view(bootstrap, topic, ends, "read_uncommitted")
    histories: dict[str, list[Event]] = {}
    event_ids: Counter[str] = Counter()
    undecodable = 0
    for at in sorted(committed):
        record = committed[at]
        if record.kind != "event":
            continue
        try:
            event = decoder.event(record)
        except (ValueError, KeyError, TypeError) as exc:
            undecodable += 1
            result.violate("decodes", f"committed record {at}: {exc}")
            continue
        event_ids[event.event_id] += 1
        histories.setdefault(event.run_id, []).append(event)
    for event_id, count in event_ids.items():
        if count > 1:
            result.violate("event-id-once", f"event id {event_id} committed {count} times")
    for run_id, events in histories.items():
        _check_history(run_id, events, result)
    _check_expectations(histories, expected, result)
    heads = {(e.run_id, e.sequence) for events in histories.values() for e in events}
    _compare_views(committed, uncommitted, set(event_ids), decoder, heads, result)
    _check_effects(effects_dir, histories, result)
    result.figures.update(
        {
            "partitions": partitions,
            "committed_records": len(committed),
            "committed_events": sum(event_ids.values()),
            "bookkeeping_records": Counter(r.kind for r in committed.values() if r.kind != "event"),
            "positions_in_headers": sum(1 for r in committed.values() if r.positions),
            "dead_letters": dict(read_dead_letters(bootstrap, f"{prefix}.deadletter", decoder)),
            "audit_s": round(time.monotonic() - began, 1),
        }
    )
    result.figures["bookkeeping_records"] = dict(result.figures["bookkeeping_records"])
    result.figures["violations"] = result.violation_count
    result.figures["violations_by_check"] = dict(result.by_check)
    return result


def format_audit(result: Audit) -> Iterator[str]:
    """The audit's figures and violations as lines to print."""
    f = result.figures
    yield (
        f"audit: {f.get('runs_started', 0)} runs started + {f.get('children', 0)} children, "
        f"{f.get('runs_terminal', 0)} terminal; {f.get('committed_events', 0)} committed events "
        f"in {f.get('committed_records', 0)} records over {f.get('partitions', 0)} partitions "
        f"(read in {f.get('audit_s', 0)} s)"
    )
    yield (
        f"audit: {f.get('aborted_records', 0)} records only read_uncommitted (aborted: "
        f"{f.get('aborted_by_kind', {})}), {f.get('aborted_events_decided_again', 0)} of their "
        f"events decided again and committed; bookkeeping {f.get('bookkeeping_records', {})}, "
        f"positions carried by other records {f.get('positions_in_headers', 0)}"
    )
    yield (
        f"audit: {f.get('step_executions', 0)} step executions for "
        f"{f.get('steps_completed', 0)} completed steps; keys run more than once "
        f"{f.get('keys_run_more_than_once', 0)} (the flaky step's retry is one each), attempts "
        f"run more than once {f.get('attempts_run_more_than_once', 0)} (most "
        f"{f.get('most_runs_of_one_attempt', 1)}), executions begun after the completion was "
        f"recorded {f.get('executions_begun_after_completion_recorded', 0)}"
    )
    yield f"audit: dead letters {f.get('dead_letters', {})}"
    yield f"audit: violations {result.violation_count} {dict(result.by_check)}"
    for line in result.violations:
        yield f"  {line}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--expect", type=Path, required=True, help="the driver's manifest")
    parser.add_argument("--effects", type=Path, default=None, help="the side-effect logs")
    args = parser.parse_args(argv)
    result = audit(args.bootstrap, args.prefix, Expectations.load(args.expect), args.effects)
    for line in format_audit(result):
        print(line)
    raise SystemExit(1 if result.violation_count else 0)


if __name__ == "__main__":
    main()

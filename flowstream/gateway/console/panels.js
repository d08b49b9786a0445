// The parts of a run's page drawn from its snapshot (WorkflowRunSnapshot) and its history:
// steps with their attempts, open waits, hooks, signals, children.

import {
  ago,
  el,
  empty,
  jsonBlock,
  runLink,
  section,
  statusBadge,
  table,
  timeCell,
} from "./dom.js";

const values = (object) => Object.values(object || {});

export function eventBody(envelope) {
  return envelope.event && typeof envelope.event === "object" ? envelope.event : envelope;
}

// step_id -> [{attempt, started, outcome, error, at, retry_after}] from the step events.
export function attemptsByStep(events) {
  const steps = new Map();
  const attemptOf = (id, n) => {
    if (!steps.has(id)) steps.set(id, []);
    const list = steps.get(id);
    let found = list.find((a) => a.attempt === n);
    if (!found) {
      found = { attempt: n, outcome: "running" };
      list.push(found);
    }
    return found;
  };
  for (const envelope of events) {
    const e = eventBody(envelope);
    const at = envelope.at || envelope.timestamp;
    if (!e.step_id || !e.type || !e.type.startsWith("step_")) continue;
    if (e.type === "step_started") attemptOf(e.step_id, e.attempt).started = at;
    else if (e.type === "step_completed") {
      const list = steps.get(e.step_id) || [];
      const last = list[list.length - 1] || attemptOf(e.step_id, 1);
      Object.assign(last, { outcome: "completed", at });
    } else if (e.type !== "step_created") {
      const outcome = e.type.slice("step_".length);
      Object.assign(attemptOf(e.step_id, e.attempt), {
        outcome,
        error: e.error || e.reason,
        at,
        retry_after: e.retry_after,
      });
    }
  }
  return steps;
}

export function stepsPanel(snapshot, events) {
  const attempts = attemptsByStep(events);
  const steps = values(snapshot.steps);
  if (!steps.length) return section("Steps", "steps", empty("No steps."));
  const rows = steps.map((step) => {
    const tries = attempts.get(step.step_id) || [];
    const limit = step.retry ? step.retry.max_attempts : "?";
    return el(
      "tr",
      { "data-step": step.step_id, "data-status": step.status },
      el(
        "td",
        {},
        el("strong", { text: step.step_id }),
        step.step_name !== step.step_id && el("div", { class: "muted", text: step.step_name }),
      ),
      el("td", {}, statusBadge(step.status)),
      el("td", { class: "num", text: `${step.attempt} / ${limit}` }),
      el("td", {}, attemptList(tries)),
      el("td", { class: "error", text: step.error || "" }),
      el("td", {}, step.retry_after ? timeCell(step.retry_after) : ""),
      el("td", {}, jsonBlock(step.input), " → ", jsonBlock(step.output)),
    );
  });
  return section(
    "Steps",
    "steps",
    table(["Step", "Status", "Attempt", "Attempts", "Error", "Retry at", "Input → output"], rows),
  );
}

function attemptList(tries) {
  if (!tries.length) return el("span", { class: "muted", text: "—" });
  return el(
    "ol",
    { class: "attempts" },
    tries.map((a) =>
      el(
        "li",
        { class: `attempt outcome-${a.outcome}`, "data-attempt": a.attempt },
        el("span", { text: `#${a.attempt} ${a.outcome}` }),
        a.error && el("span", { class: "error", text: `: ${a.error}` }),
      ),
    ),
  );
}

// Open waits: timers, delayed retries, hooks, signal waits and children still open, as the
// gateway's "pending" list names them, completed by the snapshot's own records.
export function waitsPanel(snapshot, pending) {
  const rows = [];
  for (const wait of values(snapshot.waits)) {
    if (wait.status !== "waiting") continue;
    rows.push(
      waitRow("timer", wait.wait_id, [timeCell(wait.resume_at), ` (${ago(wait.resume_at)})`]),
    );
  }
  for (const step of values(snapshot.steps)) {
    if (step.retry_after && step.status === "pending") {
      rows.push(
        waitRow("retry", step.step_id, [
          timeCell(step.retry_after),
          ` attempt ${step.attempt + 1}`,
        ]),
      );
    }
  }
  for (const wait of values(snapshot.signal_waits)) {
    if (wait.status === "waiting")
      rows.push(waitRow("signal", wait.wait_id, `signal "${wait.signal_name}"`));
  }
  for (const hook of values(snapshot.hooks)) {
    if (hook.status === "active")
      rows.push(waitRow("hook", hook.hook_id, "a call to its webhook URL"));
  }
  for (const child of values(snapshot.children)) {
    if (!child.outcome) rows.push(waitRow("child", child.child_id, [runLink(child.run_id)]));
  }
  const known = new Set(rows.map((row) => row.dataset.wait));
  for (const item of pending || []) {
    const key = `${item.kind}:${item.id}`;
    if (known.has(key)) continue;
    const detail = item.due
      ? timeCell(item.due)
      : item.attempt
        ? `attempt ${item.attempt} running`
        : "";
    rows.push(waitRow(item.kind, item.id, detail));
  }
  if (snapshot.task_failure) {
    const failure = snapshot.task_failure;
    rows.push(
      waitRow("task failure", `attempt ${failure.attempt}`, [
        `${failure.error_type}: ${failure.message}`,
        failure.retry_at ? [" — retried at ", timeCell(failure.retry_at)] : " — waits for a retry",
      ]),
    );
  }
  return section(
    "Open waits",
    "waits",
    rows.length ? table(["Kind", "Id", "Until"], rows) : empty("Nothing open."),
  );
}

function waitRow(kind, id, detail) {
  return el(
    "tr",
    { "data-wait": `${kind}:${id}` },
    el("td", { text: kind }),
    el("td", { text: id }),
    el("td", {}, detail),
  );
}

export function hooksPanel(snapshot) {
  const hooks = values(snapshot.hooks);
  if (!hooks.length) return section("Hooks", "hooks", empty("No hooks."));
  const rows = hooks.map((hook) =>
    el(
      "tr",
      { "data-hook": hook.hook_id, "data-status": hook.status },
      el("td", { text: hook.hook_id }),
      el("td", {}, statusBadge(hook.status)),
      el("td", {}, jsonBlock(hook.metadata)),
      el("td", {}, jsonBlock(hook.payload)),
    ),
  );
  return section("Hooks", "hooks", table(["Hook", "Status", "Metadata", "Payload"], rows));
}

export function signalsPanel(snapshot) {
  const received = snapshot.signals || [];
  const waits = values(snapshot.signal_waits);
  const parts = [];
  if (received.length) {
    parts.push(
      table(
        ["Signal", "Id", "Payload", "Received at", "Consumed by"],
        received.map((s) =>
          el(
            "tr",
            { "data-signal": s.signal_id },
            el("td", { text: s.name }),
            el("td", { class: "muted", text: s.signal_id }),
            el("td", {}, jsonBlock(s.payload)),
            el("td", { class: "num", text: `#${s.received_sequence}` }),
            el("td", { text: s.consumed_by || "" }),
          ),
        ),
      ),
    );
  }
  if (waits.length) {
    parts.push(
      el("h3", { text: "Signal waits" }),
      table(
        ["Wait", "Signal", "Status", "Created at", "Took"],
        waits.map((w) =>
          el(
            "tr",
            { "data-signal-wait": w.wait_id },
            el("td", { text: w.wait_id }),
            el("td", { text: w.signal_name }),
            el("td", {}, statusBadge(w.status)),
            el("td", { class: "num", text: `#${w.created_sequence}` }),
            el("td", { class: "muted", text: w.signal_id || "" }),
          ),
        ),
      ),
    );
  }
  return section("Signals", "signals", parts.length ? parts : empty("No signals."));
}

export function childrenPanel(snapshot) {
  const children = values(snapshot.children);
  if (!children.length) return section("Children", "children", empty("No child runs."));
  const rows = children.map((child) =>
    el(
      "tr",
      { "data-child": child.child_id },
      el("td", { text: child.child_id }),
      el("td", {}, runLink(child.run_id)),
      el("td", { text: child.spec ? child.spec.name : "" }),
      el("td", { class: "muted", text: child.cancellation_policy || "" }),
      el("td", {}, child.outcome ? statusBadge(child.outcome.type) : statusBadge("running")),
      el("td", {
        class: "error",
        text: child.outcome && child.outcome.error ? child.outcome.error : "",
      }),
    ),
  );
  return section(
    "Children",
    "children",
    table(["Child", "Run", "Workflow", "On cancel", "Outcome", "Error"], rows),
  );
}

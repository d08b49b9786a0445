// A run's history as a timeline: one entry per committed event, in sequence order, with its
// time, the time since the run was created, and what the event says in a line.

import { el, empty, formatTime, jsonBlock, runLink, section } from "./dom.js";
import { eventBody } from "./panels.js";

const CATEGORY = [
  [
    /^(run_failed|run_timed_out|run_retry_exhausted|step_failed|step_non_retryable|workflow_task_failed)$/,
    "failure",
  ],
  [/^(step_retrying|run_cancellation_requested|run_cancelled|step_cancelled)$/, "warning"],
  [/^run_/, "run"],
  [/^step_/, "step"],
  [/^(wait_)/, "timer"],
  [/^signal_/, "signal"],
  [/^hook_/, "hook"],
  [/^child_/, "child"],
];

function category(type) {
  for (const [pattern, name] of CATEGORY) if (pattern.test(type)) return name;
  return "other";
}

// What the event says, as a list of text and nodes (run ids become links).
function summary(e) {
  switch (e.type) {
    case "run_created":
      return [
        `workflow ${e.spec ? e.spec.name : "?"}`,
        e.parent ? [" from ", runLink(e.parent.run_id)] : "",
      ];
    case "run_completed":
      return ["output ", jsonBlock(e.output)];
    case "run_failed":
      return [e.error];
    case "run_cancellation_requested":
    case "run_cancelled":
      return [e.reason || ""];
    case "run_timed_out":
      return [`deadline ${formatTime(e.deadline)} `, e.reason || ""];
    case "run_retry_exhausted":
      return [`step ${e.step_id} attempt ${e.attempt}: ${e.error}`];
    case "run_continued_as_new":
      return ["successor ", runLink(e.successor_run_id)];
    case "run_progress_recorded": {
      const p = e.progress || {};
      return [`${p.progress_id}: ${p.completed}${p.total ? `/${p.total}` : ""} ${p.message || ""}`];
    }
    case "workflow_task_failed":
      return [`attempt ${e.attempt}, ${e.error_type}: ${e.message}`];
    case "step_created":
      return [`${e.step_id} (${e.step_name}) input `, jsonBlock(e.input)];
    case "step_started":
      return [`${e.step_id} attempt ${e.attempt}`];
    case "step_completed":
      return [`${e.step_id} output `, jsonBlock(e.output)];
    case "step_retrying":
    case "step_failed":
    case "step_non_retryable":
      return [`${e.step_id} attempt ${e.attempt}: ${e.error}`];
    case "step_cancelled":
      return [`${e.step_id} attempt ${e.attempt}: ${e.reason}`];
    case "wait_created":
      return [`${e.wait_id} until ${formatTime(e.resume_at)}`];
    case "wait_completed":
      return [e.wait_id];
    case "signal_received":
      return [`${e.name} (${e.signal_id}) `, jsonBlock(e.payload)];
    case "signal_wait_created":
      return [`${e.wait_id} for "${e.signal_name}"`];
    case "signal_wait_completed":
      return [`${e.wait_id} took ${e.signal_id}`];
    case "hook_created":
      return [e.hook_id, e.metadata ? [" metadata ", jsonBlock(e.metadata)] : ""];
    case "hook_received":
      return [`${e.hook_id} payload `, jsonBlock(e.payload)];
    case "hook_disposed":
      return [e.hook_id];
    case "child_workflow_requested":
      return [`${e.child_id}: `, runLink(e.child_run_id), ` (${e.spec ? e.spec.name : "?"})`];
    case "child_workflow_resolved":
      return [`${e.child_id}: ${e.outcome ? e.outcome.type : "?"}`];
    default:
      return [];
  }
}

function offset(at, start) {
  const ms = new Date(at).getTime() - start;
  if (!Number.isFinite(ms)) return "";
  if (ms < 1000) return `+${ms} ms`;
  if (ms < 120000) return `+${(ms / 1000).toFixed(1)} s`;
  return `+${Math.round(ms / 60000)} min`;
}

export function timelinePanel(events) {
  if (!events.length) return section("History", "timeline", empty("No events."));
  const first = new Date(events[0].at || events[0].timestamp).getTime();
  const items = events.map((envelope) => {
    const e = eventBody(envelope);
    const at = envelope.at || envelope.timestamp;
    return el(
      "li",
      {
        class: `event cat-${category(e.type)}`,
        "data-type": e.type,
        "data-sequence": envelope.sequence,
      },
      el("span", { class: "seq", text: `#${envelope.sequence}` }),
      el("time", { datetime: at, title: formatTime(at), text: offset(at, first) }),
      el("span", { class: "type", text: e.type }),
      el("span", { class: "detail" }, summary(e)),
    );
  });
  return section(
    "History",
    "timeline",
    el("p", {
      class: "muted",
      text: `${events.length} events from ${formatTime(events[0].at || events[0].timestamp)}`,
    }),
    el("ol", { class: "timeline" }, items),
  );
}

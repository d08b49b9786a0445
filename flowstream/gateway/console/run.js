// A run's page: what it is and where it stands, the continuation chain, the actions (signal,
// cancel, retry, resume a hook through its webhook URL), then the panels and the timeline.
// While the run is not terminal the page reads it again every POLL_MS and redraws the panels
// when its history moved; the action forms are drawn once, so typing is never lost.

import * as api from "./api.js";
import { clear, el, jsonBlock, put, runLink, section, statusBadge, timeCell } from "./dom.js";
import { waitingText } from "./list.js";
import { childrenPanel, hooksPanel, signalsPanel, stepsPanel, waitsPanel } from "./panels.js";
import { timelinePanel } from "./timeline.js";

const TERMINAL = new Set(["completed", "failed", "cancelled", "continued_as_new"]);
const POLL_MS = 1000;
const CHAIN_LIMIT = 20;

export async function renderRun(view, runId, page) {
  const head = el("div", { id: "run-head" });
  const actions = el("div", { id: "actions" });
  const chain = el("div", { id: "chain-slot" });
  const body = el("div", { id: "run-body" });
  view.append(
    el("p", {}, el("a", { href: "#/runs", text: "← runs" })),
    el("h1", {}, "Run ", el("code", { id: "run-id", text: runId })),
    head,
    chain,
    actions,
    body,
  );
  let shown = null;
  let chainFor = null;
  let terminal = false;
  const refresh = async () => {
    const [detail, log] = await Promise.all([api.getRun(runId), api.history(runId)]);
    const snapshot = detail.snapshot || {};
    const run = detail.run || {};
    const mark = `${snapshot.last_sequence}|${run.status}`;
    if (mark === shown) return;
    shown = mark;
    const events = log.events || [];
    clear(head).append(facts(run, snapshot, detail.condition));
    if (!actions.firstChild) actions.append(actionForms(runId, snapshot, page, refresh));
    actions.hidden = TERMINAL.has(run.status);
    const hooksOpen = Object.values(snapshot.hooks || {}).some((h) => h.status === "active");
    const hookForm = actions.querySelector("#hook-form");
    if (hookForm) hookForm.hidden = !hooksOpen;
    clear(body).append(
      waitsPanel(snapshot, detail.pending),
      stepsPanel(snapshot, events),
      hooksPanel(snapshot),
      signalsPanel(snapshot),
      childrenPanel(snapshot),
      timelinePanel(events),
    );
    const chainKey = `${snapshot.parent?.run_id || ""}|${successorOf(run, snapshot) || ""}`;
    if (chainKey !== chainFor) {
      chainFor = chainKey;
      put(clear(chain), await chainPanel(run, snapshot));
    }
    if (TERMINAL.has(run.status)) {
      terminal = true;
      page.stopPolling();
    }
  };
  await refresh();
  if (!terminal) page.poll(refresh, POLL_MS);
}

function facts(run, snapshot, condition) {
  const spec = snapshot.spec || {};
  const outcome = snapshot.outcome;
  const rows = [
    ["Status", statusBadge(run.status || snapshot.status)],
    ["Workflow", `${run.workflow || spec.name || ""} v${spec.version || "?"}`],
    ["Build", run.build || spec.runtime_build_id || "any"],
    [
      "Condition",
      el("span", {
        id: "run-condition",
        text: condition ? condition.text : waitingText(run.waiting_for) || "—",
      }),
    ],
    ["Created", timeCell(run.created_at)],
    ["Updated", timeCell(run.updated_at || snapshot.updated_at)],
    ["Events", String(snapshot.last_sequence ?? "?")],
    ["Input", jsonBlock(snapshot.input)],
  ];
  if (snapshot.parent && !snapshot.parent.continued) {
    rows.push([
      "Parent",
      [runLink(snapshot.parent.run_id), ` (child ${snapshot.parent.child_id || "?"})`],
    ]);
  }
  if (snapshot.cancellation) {
    rows.push([
      "Cancellation",
      [
        `requested `,
        timeCell(snapshot.cancellation.requested_at),
        ` ${snapshot.cancellation.reason || ""}`,
      ],
    ]);
  }
  if (outcome) rows.push(["Outcome", outcomeText(outcome)]);
  if (snapshot.output !== undefined && snapshot.output !== null)
    rows.push(["Output", jsonBlock(snapshot.output, { open: true })]);
  const error = snapshot.error || run.last_error;
  if (error) rows.push(["Error", el("span", { class: "error", id: "run-error", text: error })]);
  return el(
    "dl",
    { class: "facts", "data-status": run.status || snapshot.status },
    rows.map(([term, value]) => [el("dt", { text: term }), el("dd", {}, value)]),
  );
}

function outcomeText(outcome) {
  const parts = [statusBadge(outcome.type)];
  if (outcome.step_id) parts.push(` step ${outcome.step_id}`);
  if (outcome.successor_run_id) parts.push(" → ", runLink(outcome.successor_run_id));
  return parts;
}

// The continuation chain: predecessors through parent links marked continued, successors
// through continued_to, each read from the API (at most CHAIN_LIMIT either way).
function successorOf(run, snapshot) {
  return run.continued_to || snapshot.outcome?.successor_run_id || null;
}

async function chainPanel(run, snapshot) {
  const before = [];
  let link = snapshot.parent && snapshot.parent.continued ? snapshot.parent.run_id : null;
  while (link && before.length < CHAIN_LIMIT) {
    before.unshift(link);
    const previous = await api.getRun(link).catch(() => null);
    const parent = previous && previous.snapshot ? previous.snapshot.parent : null;
    link = parent && parent.continued ? parent.run_id : null;
  }
  const after = [];
  let next = successorOf(run, snapshot);
  while (next && after.length < CHAIN_LIMIT) {
    after.push(next);
    const following = await api.getRun(next).catch(() => null);
    next = following ? successorOf(following.run || {}, following.snapshot || {}) : null;
  }
  if (!before.length && !after.length) return null;
  const items = [
    ...before.map((id) => el("li", {}, runLink(id))),
    el("li", { class: "current", text: run.run_id }),
    ...after.map((id) => el("li", {}, runLink(id))),
  ];
  const hop = snapshot.parent && snapshot.parent.continued ? snapshot.parent.hop : 0;
  return section(
    "Continuation chain",
    "chain",
    el("p", {
      class: "muted",
      text: `${before.length + after.length + 1} runs; this one is hop ${hop} (the first is hop 0)`,
    }),
    el("ol", { class: "chain" }, items),
  );
}

function actionForms(runId, snapshot, page, refresh) {
  const spec = snapshot.spec || {};
  const names = new Set(spec.signal_names || []);
  for (const wait of Object.values(snapshot.signal_waits || {})) names.add(wait.signal_name);
  const after = async (label, promise) => {
    try {
      const answer = await promise;
      page.notify(`${label}: ${answerText(answer)}`);
      await refresh();
    } catch (error) {
      page.notify(`${label} refused — ${error.kind}: ${error.message}`, true);
    }
  };
  const signalName = el("input", {
    id: "signal-name",
    list: "signal-names",
    required: true,
    placeholder: "name",
    autocomplete: "off",
  });
  const signalPayload = el("textarea", { id: "signal-payload", rows: 2, text: "null" });
  const signalForm = el(
    "form",
    {
      class: "action",
      id: "signal-form",
      onsubmit: (event) => {
        event.preventDefault();
        let payload;
        try {
          payload = JSON.parse(signalPayload.value || "null");
        } catch (error) {
          page.notify(`the payload is not JSON: ${error.message}`, true);
          return;
        }
        after(`signal ${signalName.value}`, api.signal(runId, signalName.value, payload));
      },
    },
    el("h3", { text: "Signal" }),
    el(
      "datalist",
      { id: "signal-names" },
      [...names].map((n) => el("option", { value: n })),
    ),
    el("label", {}, "Name ", signalName),
    el("label", {}, "Payload (JSON) ", signalPayload),
    el("button", { type: "submit", id: "signal-send", text: "Send signal" }),
  );
  const reason = el("input", {
    id: "cancel-reason",
    placeholder: "reason (optional)",
    autocomplete: "off",
  });
  const cancelForm = el(
    "form",
    {
      class: "action",
      id: "cancel-form",
      onsubmit: (event) => {
        event.preventDefault();
        after("cancel", api.cancel(runId, reason.value.trim()));
      },
    },
    el("h3", { text: "Cancel" }),
    el("label", {}, "Reason ", reason),
    el("button", { type: "submit", id: "cancel-run", class: "danger", text: "Cancel run" }),
  );
  const retryForm = el(
    "form",
    {
      class: "action",
      id: "retry-form",
      onsubmit: (event) => {
        event.preventDefault();
        after("retry", api.retry(runId));
      },
    },
    el("h3", { text: "Retry" }),
    el("p", {
      class: "muted",
      text: "Drive the run again now (after its code or a dependency was fixed).",
    }),
    el("button", { type: "submit", id: "retry-run", text: "Retry run" }),
  );
  return el(
    "div",
    { class: "actions" },
    signalForm,
    cancelForm,
    retryForm,
    hookForm(page, refresh),
  );
}

// A command's answer: {"run_id", "outcome": applied | noop | accepted | parked, "reason"}.
function answerText(answer) {
  if (!answer || !answer.outcome) return "accepted";
  return answer.reason ? `${answer.outcome} (${answer.reason})` : answer.outcome;
}

// The token is not in the snapshot (the history keeps its digest only): whoever holds it
// pastes it here and the console calls the hook's webhook URL, as a provider would.
function hookForm(page, refresh) {
  const token = el("input", {
    type: "password",
    id: "hook-token",
    placeholder: "hook token",
    autocomplete: "off",
    required: true,
  });
  const payload = el("textarea", { id: "hook-payload", rows: 2, text: "{}" });
  return el(
    "form",
    {
      class: "action",
      id: "hook-form",
      onsubmit: async (event) => {
        event.preventDefault();
        let body;
        try {
          body = JSON.parse(payload.value || "null");
        } catch (error) {
          page.notify(`the payload is not JSON: ${error.message}`, true);
          return;
        }
        try {
          const answer = await api.resumeHook(token.value, body);
          token.value = "";
          page.notify(`webhook POST /hooks/…: ${answerText(answer)}`);
          await refresh();
        } catch (error) {
          page.notify(`webhook refused — ${error.kind}: ${error.message}`, true);
        }
      },
    },
    el("h3", { text: "Resume a hook" }),
    el("p", {
      class: "muted",
      text: "Calls the hook's webhook URL with its token, as its caller would.",
    }),
    el("label", {}, "Token ", token),
    el("label", {}, "Payload (JSON) ", payload),
    el("button", { type: "submit", id: "hook-resume", text: "Resume hook" }),
  );
}

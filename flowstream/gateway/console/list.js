// The runs page: counts by status, a filter by status and workflow, one row per run, paging.

import * as api from "./api.js";
import { el, empty, put, runLink, statusBadge, table, timeCell } from "./dom.js";

export const STATUSES = [
  "pending",
  "running",
  "suspended",
  "cancelling",
  "completed",
  "failed",
  "cancelled",
  "continued_as_new",
];

const PAGE = 50;

// params: URLSearchParams of the hash route (#/runs?status=…&workflow=…&cursor=…).
export async function renderList(view, params, go) {
  const status = params.get("status") || "";
  const workflow = params.get("workflow") || "";
  const cursor = params.get("cursor") || "";
  const [page, tally] = await Promise.all([
    api.listRuns({ status, workflow, limit: PAGE, cursor }),
    api.counts().catch(() => null),
  ]);
  const runs = page.runs || [];
  put(
    view,
    el("h1", { text: "Runs" }),
    countsBar(tally, status, go),
    filterForm(status, workflow, go),
    runs.length ? runsTable(runs) : empty(emptyText(status, workflow)),
    pager(page.next_cursor, status, workflow, cursor, go),
  );
}

function emptyText(status, workflow) {
  const parts = [status && `status ${status}`, workflow && `workflow ${workflow}`].filter(Boolean);
  return parts.length ? `No runs with ${parts.join(" and ")}.` : "No runs yet.";
}

function listRoute(status, workflow, cursor) {
  const query = new URLSearchParams();
  if (status) query.set("status", status);
  if (workflow) query.set("workflow", workflow);
  if (cursor) query.set("cursor", cursor);
  const suffix = query.toString();
  return `#/runs${suffix ? `?${suffix}` : ""}`;
}

// /api/counts: {"counts": {status: n}, "total": n}.
function countsBar(tally, current, go) {
  if (!tally) return null;
  const byStatus = tally.counts || tally.by_status || {};
  const numbers = Object.values(byStatus).filter((n) => typeof n === "number");
  const total = tally.total ?? tally.total_runs ?? numbers.reduce((a, b) => a + b, 0);
  const chips = [];
  if (typeof total === "number") {
    chips.push(chip("all", total, current === "", () => go(listRoute("", "", ""))));
  }
  for (const status of STATUSES) {
    const n = byStatus[status];
    if (typeof n !== "number") continue;
    chips.push(chip(status, n, current === status, () => go(listRoute(status, "", ""))));
  }
  return el("div", { class: "counts", id: "counts" }, chips);
}

function chip(label, n, active, onclick) {
  return el(
    "button",
    {
      type: "button",
      class: `chip status-${label}${active ? " active" : ""}`,
      "data-count": label,
      onclick,
    },
    el("span", { text: label }),
    el("strong", { text: String(n) }),
  );
}

function filterForm(status, workflow, go) {
  const statusSelect = el(
    "select",
    { name: "status", id: "filter-status" },
    el("option", { value: "", text: "any status" }),
    STATUSES.map((s) => el("option", { value: s, selected: s === status, text: s })),
  );
  const workflowInput = el("input", {
    name: "workflow",
    id: "filter-workflow",
    placeholder: "workflow name",
    value: workflow,
    autocomplete: "off",
  });
  return el(
    "form",
    {
      class: "filters",
      id: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        go(listRoute(statusSelect.value, workflowInput.value.trim(), ""));
      },
    },
    el("label", {}, "Status ", statusSelect),
    el("label", {}, "Workflow ", workflowInput),
    el("button", { type: "submit", id: "filter-apply", text: "Filter" }),
    (status || workflow) && el("a", { href: "#/runs", class: "reset", text: "clear" }),
  );
}

function runsTable(runs) {
  const rows = runs.map((run) =>
    el(
      "tr",
      { "data-run": run.run_id, "data-status": run.status },
      el("td", {}, runLink(run.run_id), lineage(run)),
      el("td", { text: run.workflow || "" }),
      el("td", {}, statusBadge(run.status)),
      el("td", { class: "muted", text: run.build || "" }),
      el("td", { class: "waiting", text: waitingText(run.waiting_for) }),
      el("td", { class: "error", text: run.last_error || "" }),
      el("td", {}, timeCell(run.created_at)),
      el("td", {}, timeCell(run.updated_at)),
    ),
  );
  return table(
    ["Run", "Workflow", "Status", "Build", "Waiting for", "Last error", "Created", "Updated"],
    rows,
    { class: "runs", id: "runs" },
  );
}

function lineage(run) {
  const notes = [];
  if (run.parent_run_id)
    notes.push(el("span", { class: "muted", text: ` ← ${run.parent_run_id}` }));
  if (run.continued_to) notes.push(el("span", { class: "muted", text: ` → ${run.continued_to}` }));
  return notes.length ? el("div", { class: "lineage" }, notes) : null;
}

// waiting_for is a line of text or a list of {kind, id, due}.
export function waitingText(waiting) {
  if (!waiting) return "";
  if (typeof waiting === "string") return waiting;
  const items = Array.isArray(waiting) ? waiting : [waiting];
  return items
    .map((item) =>
      typeof item === "string" ? item : [item.kind, item.id].filter(Boolean).join(" "),
    )
    .join(", ");
}

function pager(next, status, workflow, cursor, go) {
  if (!next && !cursor) return null;
  return el(
    "nav",
    { class: "pager" },
    cursor && el("a", { href: listRoute(status, workflow, ""), text: "first page" }),
    next &&
      el("button", {
        type: "button",
        id: "next-page",
        text: "next page",
        onclick: () => go(listRoute(status, workflow, next)),
      }),
  );
}

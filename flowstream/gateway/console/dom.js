// Small DOM helpers. Every value from the API goes into the page as text (textContent or an
// attribute), never as markup, so a payload or an error message cannot inject anything.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

// Appends children to node, skipping null, undefined and false (native append would print them).
export function put(node, ...children) {
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, "data-status": status, text: status });
}

// "2026-12-01T18:02:03.123456+00:00" -> "2026-12-01 18:02:03Z" (the API's times are UTC).
export function formatTime(value) {
  if (!value) return "";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date
    .toISOString()
    .replace("T", " ")
    .replace(/\.\d+Z$/, "Z");
}

export function ago(value, now = Date.now()) {
  const date = new Date(value);
  if (!value || Number.isNaN(date.getTime())) return "";
  const seconds = Math.round((now - date.getTime()) / 1000);
  const future = seconds < 0;
  const span = Math.abs(seconds);
  let text;
  if (span < 60) text = `${span} s`;
  else if (span < 3600) text = `${Math.floor(span / 60)} min`;
  else if (span < 86400) text = `${Math.floor(span / 3600)} h`;
  else text = `${Math.floor(span / 86400)} d`;
  return future ? `in ${text}` : `${text} ago`;
}

export function timeCell(value) {
  if (!value) return el("span", { class: "muted", text: "—" });
  return el("time", { datetime: value, title: ago(value), text: formatTime(value) });
}

// JSON shown as text, folded when long.
export function jsonBlock(value, { open = false } = {}) {
  if (value === undefined || value === null) return el("span", { class: "muted", text: "null" });
  const compact = JSON.stringify(value);
  if (compact.length <= 80) return el("code", { class: "json", text: compact });
  const text = JSON.stringify(value, null, 2);
  const details = el("details", { class: "json", open });
  details.append(el("summary", { text: preview(text) }), el("pre", { text }));
  return details;
}

function preview(text) {
  const flat = text.replace(/\s+/g, " ");
  return flat.length > 60 ? `${flat.slice(0, 57)}…` : flat;
}

export function runLink(runId) {
  return el("a", { href: `#/runs/${encodeURIComponent(runId)}`, class: "run-link", text: runId });
}

export function section(title, id, ...children) {
  return el("section", { class: "panel", id }, el("h2", { text: title }), ...children);
}

export function table(headers, rows, attrs = {}) {
  return el(
    "table",
    attrs,
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        headers.map((h) => el("th", { text: h })),
      ),
    ),
    el("tbody", {}, rows),
  );
}

export function empty(text) {
  return el("p", { class: "muted empty", text });
}

// The console's router: #/runs (the list, with ?status=&workflow=&cursor=) and #/runs/<id> (a
// run's page). It asks for the gateway's bearer token when the API answers 401, keeps it in
// sessionStorage (see api.js), and stops a page's polling when the route changes.

import * as api from "./api.js";
import { clear, el } from "./dom.js";
import { renderList } from "./list.js";
import { renderRun } from "./run.js";

const view = document.getElementById("view");
const notice = document.getElementById("notice");
const session = document.getElementById("session");
let timer = null;
let generation = 0;

function stopPolling() {
  if (timer !== null) clearInterval(timer);
  timer = null;
}

function notify(text, isError = false) {
  notice.textContent = text;
  notice.className = `notice${isError ? " error" : ""}`;
  notice.hidden = !text;
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function pageFor(mine) {
  return {
    notify,
    stopPolling,
    poll(refresh, ms) {
      stopPolling();
      let busy = false;
      timer = setInterval(async () => {
        if (busy || mine !== generation) return;
        busy = true;
        try {
          await refresh();
        } catch (error) {
          if (mine === generation) failed(error);
        } finally {
          busy = false;
        }
      }, ms);
    },
  };
}

function drawSession() {
  clear(session);
  if (api.token()) {
    session.append(
      el("span", { class: "muted", text: "token set " }),
      el("button", {
        type: "button",
        id: "sign-out",
        text: "forget token",
        onclick: () => {
          api.setToken("");
          route();
        },
      }),
    );
  }
}

function tokenForm(message) {
  const input = el("input", {
    type: "password",
    id: "api-token",
    name: "token",
    autocomplete: "off",
    required: true,
  });
  return el(
    "form",
    {
      class: "panel login",
      id: "token-form",
      onsubmit: (event) => {
        event.preventDefault();
        api.setToken(input.value.trim());
        route();
      },
    },
    el("h1", { text: "Gateway token" }),
    el("p", { text: message }),
    el("p", {
      class: "muted",
      text: "It is kept in this tab only (sessionStorage) and sent as Authorization: Bearer.",
    }),
    el("label", {}, "Token ", input),
    el("button", { type: "submit", id: "token-save", text: "Use token" }),
  );
}

function failed(error) {
  if (error instanceof api.ApiError && error.status === 401) {
    stopPolling();
    const message = api.token()
      ? "The gateway refused this token. Enter the gateway's token again."
      : "The gateway's API needs its bearer token.";
    api.setToken("");
    drawSession();
    clear(view).append(tokenForm(message));
    document.getElementById("api-token").focus();
    return;
  }
  notify(error instanceof api.ApiError ? `${error.kind}: ${error.message}` : String(error), true);
}

async function route() {
  stopPolling();
  generation += 1;
  const mine = generation;
  notify("");
  drawSession();
  const hash = location.hash.replace(/^#/, "") || "/runs";
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean);
  clear(view);
  document
    .querySelectorAll("[data-nav]")
    .forEach((a) => a.classList.toggle("active", parts[0] === a.dataset.nav));
  try {
    if (parts[0] === "runs" && parts.length >= 2) {
      const runId = decodeURIComponent(parts.slice(1).join("/"));
      document.title = `${runId} · flowstream`;
      await renderRun(view, runId, pageFor(mine));
    } else {
      document.title = "Runs · flowstream";
      await renderList(view, new URLSearchParams(query), go);
    }
  } catch (error) {
    if (mine === generation) failed(error);
  }
}

window.addEventListener("hashchange", route);
route();

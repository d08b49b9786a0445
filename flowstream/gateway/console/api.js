// The gateway's JSON API. The bearer token lives in this tab's sessionStorage only: it is gone
// when the tab closes, and it is never put in a URL, a cookie or localStorage.

const TOKEN_KEY = "flowstream.token";

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

async function request(method, path, { body, bearer = true } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (bearer && token()) headers.Authorization = `Bearer ${token()}`;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (error) {
    throw new ApiError(0, "unreachable", `the gateway does not answer (${error.message})`);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const detail = data && data.error ? data.error : {};
    throw new ApiError(
      response.status,
      detail.kind || `http_${response.status}`,
      detail.message || `${method} ${path}: HTTP ${response.status}`,
    );
  }
  return data;
}

function runPath(runId) {
  return `/api/runs/${encodeURIComponent(runId)}`;
}

export function listRuns({ status, workflow, limit, cursor } = {}) {
  const query = new URLSearchParams();
  if (status) query.set("status", status);
  if (workflow) query.set("workflow", workflow);
  if (limit) query.set("limit", String(limit));
  if (cursor) query.set("cursor", cursor);
  const suffix = query.toString();
  return request("GET", `/api/runs${suffix ? `?${suffix}` : ""}`);
}

export const counts = () => request("GET", "/api/counts");
export const getRun = (runId) => request("GET", runPath(runId));
export const history = (runId) => request("GET", `${runPath(runId)}/history`);
export const cancel = (runId, reason) =>
  request("POST", `${runPath(runId)}/cancel`, { body: reason ? { reason } : {} });
export const retry = (runId) => request("POST", `${runPath(runId)}/retry`, { body: {} });

export function signal(runId, name, payload) {
  return request("POST", `${runPath(runId)}/signals/${encodeURIComponent(name)}`, {
    body: { payload },
  });
}

// A hook's webhook URL: the token is the whole credential, so no bearer token goes with it.
export function webhookPath(hookToken) {
  return `/hooks/${encodeURIComponent(hookToken)}`;
}

export function resumeHook(hookToken, payload) {
  return request("POST", webhookPath(hookToken), { body: payload, bearer: false });
}

// api.js — same-origin JSON fetches, error objects, and the per-view lifecycle (timers, polling).

/** An HTTP answer that was not 2xx; `code`/`message`/`details` come from the server's error body. */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** GET `path` and parse it as JSON. A 401 sends the browser to the login page. */
export async function getJSON(path) {
  let resp;
  try {
    resp = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  } catch (err) {
    throw new ApiError(0, "network", `network error: ${err.message || err}`, null);
  }
  if (resp.status === 401) {
    window.location.assign("/ui/login");
    throw new ApiError(401, "unauthorized", "not signed in", null);
  }
  let body = null;
  const text = await resp.text();
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!resp.ok) {
    const e = (body && body.error) || {};
    const message = e.message || (body && body.detail && JSON.stringify(body.detail)) || `HTTP ${resp.status}`;
    throw new ApiError(resp.status, e.code || `http_${resp.status}`, message, e.details || null);
  }
  return body;
}

/**
 * Everything a mounted view owns that must stop when the route changes: timers and polls.
 * Views check `ctx.alive` after every await so that late answers never touch a dead page.
 */
export class ViewContext {
  constructor() {
    this.alive = true;
    this.timers = new Set();
  }

  /** setTimeout that is cancelled when the view goes away. */
  later(fn, ms) {
    const id = setTimeout(() => {
      this.timers.delete(id);
      if (this.alive) fn();
    }, ms);
    this.timers.add(id);
    return id;
  }

  cancel(id) {
    clearTimeout(id);
    this.timers.delete(id);
  }

  /**
   * Run async `fn` now and then `ms` after each run finishes (never overlapping), until the view
   * goes away or `fn` returns false. Skips work while the tab is hidden.
   */
  poll(fn, ms) {
    const tick = async () => {
      if (!this.alive) return;
      let again = true;
      if (!document.hidden) {
        try {
          again = (await fn()) !== false;
        } catch (err) {
          console.warn("poll failed", err);
        }
      }
      if (again && this.alive) this.later(tick, ms);
    };
    tick();
  }

  /** A debounced wrapper of `fn` (trailing call after `ms` of quiet). */
  debounce(fn, ms) {
    let id = null;
    return (...args) => {
      if (id !== null) this.cancel(id);
      id = this.later(() => {
        id = null;
        fn(...args);
      }, ms);
    };
  }

  dispose() {
    this.alive = false;
    for (const id of this.timers) clearTimeout(id);
    this.timers.clear();
  }
}

/** Put the service name (or "offline: <file>") in the nav bar from a /v1/status answer. */
export function noteStatus(status) {
  const el = document.getElementById("service");
  if (!el || !status) return;
  if (status.offline) {
    const src = String(status.source || "");
    el.textContent = `offline: ${src.split("/").pop() || src}`;
    el.title = src;
    el.classList.add("offline");
  } else {
    el.textContent = status.node || "rollserve";
    el.title = status.node_id ? `node ${status.node_id}` : "";
    el.classList.remove("offline");
  }
}

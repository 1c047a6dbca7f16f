// raftq console: a client of the REST API under /v1 on the same origin. The token lives in sessionStorage
// only and travels in the Authorization header, never in a URL; every change is a POST (or DELETE) with it.
// Claims are decoded here only to choose which buttons to show: the server checks every call.
"use strict";

const TOKEN_KEY = "raftq.token";
const PAGE_SIZE = 50;
const POLL_MS = 5000;
const HISTORY_MS = 15 * 60 * 1000;
const STATES = ["PENDING", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "DEAD_LETTERED"];
const COUNTS = ["pending", "delayed", "in_progress", "completed", "failed", "cancelled", "dead_lettered"];

let session = null; // {token, tenant, scopes: Set, open: bool}
let timer = null;
const history = []; // {t, totals: {queue: {created, completed}}}

// ---- DOM helpers: text only through textContent, never innerHTML.
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat(Infinity)) if (k !== null && k !== undefined && k !== false) e.append(k instanceof Node ? k : String(k));
  return e;
}
const main = () => document.getElementById("main");
function show(...nodes) { main().replaceChildren(...nodes.flat(Infinity).filter(n => n !== null && n !== undefined && n !== false)); }
function say(msg, kind) {
  const s = document.getElementById("status");
  s.textContent = msg || "";
  s.className = "status" + (kind ? " " + kind : "");
}
function when(ms) { return ms ? new Date(ms).toLocaleString() : "—"; }
function ago(ms) {
  if (!ms) return "—";
  const s = Math.round((Date.now() - ms) / 1000);
  return s < 0 ? "in " + -s + " s" : s < 120 ? s + " s ago" : Math.round(s / 60) + " min ago";
}
function table(head, rows, numeric) {
  numeric = numeric || [];
  return h("div", { class: "table" }, h("table", {},
    h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, t)))),
    h("tbody", {}, rows.length ? rows.map(r => h("tr", {}, r.map((c, i) => h("td", { class: numeric.includes(i) ? "num" : null }, c))))
      : h("tr", {}, h("td", { colspan: head.length, class: "muted" }, "Nothing here.")))));
}
function button(label, action, opts) {
  opts = opts || {};
  // `data-action` marks the buttons that change something (a read-only token must see none); `nav` ones only move.
  return h("button", { type: "button", class: opts.danger ? "danger" : null, id: opts.nav ? opts.id : null,
    "data-action": opts.nav ? null : opts.id || "change", onclick: async (ev) => {
    if (opts.confirm && !window.confirm(opts.confirm)) return;
    ev.target.disabled = true;
    try { await action(); } catch (e) { say(e.message, "error"); } finally { ev.target.disabled = false; }
  } }, label);
}
function link(href, text) { return h("a", { href }, text); }
function enc(s) { return encodeURIComponent(s); }

// ---- Session and API.
function b64urlJson(part) {
  const s = part.replace(/-/g, "+").replace(/_/g, "/");
  const bin = atob(s + "===".slice((s.length + 3) % 4));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, c => c.charCodeAt(0))));
}
function sessionOf(token) {
  if (!token) return { token: "", tenant: "default", scopes: new Set(["enqueue", "work", "read", "admin"]), open: true };
  let claims = {};
  try { claims = b64urlJson(token.split(".")[1] || ""); } catch (e) { claims = {}; }
  const scopes = Array.isArray(claims.scopes) ? claims.scopes : String(claims.scope || "").split(/\s+/).filter(Boolean);
  return { token, tenant: claims.tid || "?", scopes: new Set(scopes), open: false, exp: claims.exp };
}
function can(scope) { return session && session.scopes.has(scope); }

class ApiError extends Error {
  constructor(status, code, message) { super(code + ": " + message); this.status = status; this.code = code; }
}
async function api(method, path, body) {
  const headers = { "accept": "application/json" };
  if (session && session.token) headers["authorization"] = "Bearer " + session.token;
  if (body !== undefined) headers["content-type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: "omit", cache: "no-store" });
  let v = null;
  try { v = await r.json(); } catch (e) { v = null; }
  if (!r.ok) {
    const err = (v && v.error) || { code: "HTTP_" + r.status, message: r.statusText };
    if (r.status === 401 && session && !session.open) { signOut(err.code + ": " + err.message); }
    throw new ApiError(r.status, err.code, err.message);
  }
  return v;
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  session = null;
  history.length = 0;
  location.hash = "#/";
  render();
  if (why) say(why, "error");
}

function signInPage() {
  const area = h("textarea", { id: "token", name: "token", autocomplete: "off", spellcheck: "false", "aria-describedby": "token-help" });
  const form = h("form", { id: "signin", onsubmit: async (ev) => {
    ev.preventDefault();
    await tryToken(area.value.trim());
  } },
  h("h1", {}, "Sign in"),
  h("label", { for: "token" }, "Token (a JWT, e.g. from raftq token issue)"), area,
  h("p", { id: "token-help", class: "muted" }, "The token stays in this browser tab (session storage) and is sent only to this server."),
  h("div", { class: "actions" },
    h("button", { type: "submit", id: "signin-submit" }, "Sign in"),
    button("Continue without a token", () => tryToken(""), { id: "open", nav: true })));
  show(form);
  area.focus();
}
async function tryToken(token) {
  const before = session;
  session = sessionOf(token);
  try {
    await api("GET", "/v1/queues");
  } catch (e) {
    session = before;
    say(token ? "Sign-in refused: " + e.message : "This node needs a token: " + e.message, "error");
    return;
  }
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.setItem(TOKEN_KEY, "");
  say("");
  render();
}

// ---- Routing: #/path?query (queue names and task ids only; never a token).
function route() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, q] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(q || "") };
}
async function render() {
  clearInterval(timer);
  timer = null;
  const stored = sessionStorage.getItem(TOKEN_KEY);
  if (!session && stored !== null) session = sessionOf(stored);
  const nav = document.getElementById("nav"), out = document.getElementById("signout"), who = document.getElementById("who");
  nav.hidden = !session; out.hidden = !session || session.open;
  who.textContent = session ? (session.open ? "no authentication" : "tenant " + session.tenant + " · " + ([...session.scopes].join(", ") || "no scopes")) : "";
  if (!session) return signInPage();
  const { parts, query } = route();
  for (const a of nav.querySelectorAll("a")) {
    const here = (a.getAttribute("href") === "#/" && (!parts.length || parts[0] === "queue" || parts[0] === "task" || parts[0] === "dead")) || a.getAttribute("href") === "#/" + parts[0];
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const pages = { queue: queuePage, task: taskPage, dead: deadPage, schedules: schedulesPage, cluster: clusterPage };
  const page = pages[parts[0]] || overviewPage;
  try {
    await page(parts.slice(1), query);
    // When the page first showed its data (ms since navigation): what bench/console.sh measures.
    if (!document.documentElement.dataset.renderedAt) document.documentElement.dataset.renderedAt = String(Math.round(performance.now()));
    main().focus({ preventScroll: true });
  } catch (e) {
    show(h("h1", {}, "Could not load this page"), h("p", {}, e.message));
  }
}
function poll(fn, ms) { timer = setInterval(() => fn().catch(e => say(e.message, "error")), ms || POLL_MS); }

// ---- Overview.
function sample(queues) {
  const now = Date.now();
  const totals = {};
  for (const q of queues) {
    totals[q.queue] = { created: COUNTS.reduce((a, k) => a + (q[k] || 0), 0), completed: q.completed };
  }
  history.push({ t: now, totals });
  while (history.length && history[0].t < now - HISTORY_MS) history.shift();
}
// Rates per second between consecutive samples, summed over queues (a purge can make a delta negative: 0).
function rates(queue) {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i], dt = (b.t - a.t) / 1000;
    let enq = 0, done = 0;
    for (const [name, tb] of Object.entries(b.totals)) {
      if (queue && name !== queue) continue;
      const ta = a.totals[name] || { created: 0, completed: 0 };
      enq += Math.max(0, tb.created - ta.created);
      done += Math.max(0, tb.completed - ta.completed);
    }
    out.push({ t: b.t, enq: enq / dt, done: done / dt });
  }
  return out;
}
function chart(points) {
  const W = 900, H = 220, P = 36, now = Date.now(), t0 = now - HISTORY_MS;
  const max = Math.max(1, ...points.map(p => Math.max(p.enq, p.done)));
  const x = t => P + (W - 2 * P) * (t - t0) / HISTORY_MS, y = v => H - P + (-(H - 2 * P) * v / max);
  const ns = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": "Enqueue and completion rates, last 15 minutes" });
  svg.append(el("line", { x1: P, y1: H - P, x2: W - P, y2: H - P, stroke: "#999" }), el("line", { x1: P, y1: P, x2: P, y2: H - P, stroke: "#999" }));
  svg.append(el("text", { x: 2, y: P + 4 }, max.toFixed(max < 10 ? 1 : 0) + "/s"), el("text", { x: 2, y: H - P + 4 }, "0"));
  for (const m of [15, 10, 5, 0]) svg.append(el("text", { x: x(now - m * 60000) - 12, y: H - P + 16 }, m ? "-" + m + "m" : "now"));
  for (const [key, cls] of [["enq", "enq"], ["done", "done"]]) {
    svg.append(el("polyline", { class: cls, points: points.map(p => x(p.t).toFixed(1) + "," + y(p[key]).toFixed(1)).join(" ") }));
  }
  return svg;
}
// Concurrency key overrides an operator set (`raftq queues concurrency-override set`, PUT /v1/concurrency-keys/KEY):
// the limit in force instead of the tasks' own, what runs and waits under the key, and when the override runs out.
function overrides(list) {
  if (!list.length) return [];
  const rows = list.map(o => [o.key, String(o.limit), String(o.running), String(o.pending), o.expires_at_ms ? when(o.expires_at_ms) : "never"]);
  return [h("h2", {}, "Concurrency key overrides"), h("div", { id: "overrides" }, table(["Key", "Limit", "Running", "Pending", "Expires"], rows, [1, 2, 3]))];
}
async function overviewPage() {
  const draw = async () => {
    const [qs, cap, ovr] = await Promise.all([api("GET", "/v1/queues"), api("GET", "/v1/capacity").catch(() => ({ queues: [] })),
      api("GET", "/v1/concurrency-keys").catch(() => ({ overrides: [] }))]);
    sample(qs.queues);
    const r = rates(null), last = r[r.length - 1] || { enq: 0, done: 0 };
    const per = {};
    for (const q of qs.queues) { const rq = rates(q.queue); per[q.queue] = rq[rq.length - 1] || { enq: 0, done: 0 }; }
    const rows = qs.queues.map(q => [
      h("span", {}, link("#/queue/" + enc(q.queue), q.queue), q.paused ? h("span", { class: "paused" }, "paused") : null),
      ...COUNTS.map(k => k === "dead_lettered" && q[k] ? link("#/dead/" + enc(q.queue), String(q[k])) : String(q[k])),
      per[q.queue].enq.toFixed(1), per[q.queue].done.toFixed(1)]);
    const capRows = cap.queues.map(c => [c.queue, String(c.ready), c.max_running ? c.running + " / " + c.max_running : String(c.running), String(c.active_workers), c.rate_5m.toFixed(2),
      c.drain_seconds === null ? "—" : Math.round(c.drain_seconds) + " s",
      ["1h", "4h", "8h"].map(k => c.workers_needed[k] === null ? "—" : c.workers_needed[k]).join(" / ")]);
    show(h("h1", {}, "Overview"),
      h("div", { class: "cards" },
        h("div", { class: "card" }, "Queues", h("b", { id: "queue-count" }, String(qs.queues.length))),
        h("div", { class: "card" }, "Enqueued / s", h("b", {}, last.enq.toFixed(1))),
        h("div", { class: "card" }, "Completed / s", h("b", {}, last.done.toFixed(1)))),
      h("h2", {}, "Queues"),
      h("div", { id: "queues" }, table(["Queue", "Pending", "Delayed", "Running", "Completed", "Failed", "Cancelled", "Dead", "Enq/s", "Done/s"], rows, [1, 2, 3, 4, 5, 6, 7, 8, 9])),
      h("h2", {}, "Last 15 minutes"),
      h("p", { class: "legend" }, h("span", { class: "enq" }, "enqueued / s"), h("span", { class: "done" }, "completed / s"),
        h("span", { class: "muted" }, "sampled by this page every " + POLL_MS / 1000 + " s while it is open")),
      chart(r),
      h("h2", {}, "Capacity"),
      table(["Queue", "Ready", "Running", "Workers", "Rate (5m)/s", "Drain", "Workers for 1h / 4h / 8h"], capRows, [1, 2, 3, 4]),
      ...overrides(ovr.overrides));
  };
  await draw();
  poll(draw);
}

// ---- Queue: tasks with filters and server-side paging.
async function queuePage([queue], query) {
  const state = query.get("state") || "", from = query.get("from") || "", to = query.get("to") || "";
  const tokens = (query.get("pages") || "").split(",").filter(Boolean); // page tokens of the pages before this one
  const params = new URLSearchParams({ queue, page_size: PAGE_SIZE });
  if (state) params.set("state", state);
  if (from) params.set("created_from_ms", String(Date.parse(from)));
  if (to) params.set("created_to_ms", String(Date.parse(to)));
  if (tokens.length) params.set("page_token", tokens[tokens.length - 1]);
  const [page, qs, fair] = await Promise.all([api("GET", "/v1/tasks?" + params), api("GET", "/v1/queues"),
    api("GET", `/v1/queues/${enc(queue)}/fairness`).catch(() => ({ keys: [] }))]);
  const q = qs.queues.find(x => x.queue === queue) || { paused: false };
  const go = (over) => {
    const p = new URLSearchParams({ state: over.state ?? state, from: over.from ?? from, to: over.to ?? to });
    if (over.pages) p.set("pages", over.pages.join(","));
    for (const [k, v] of [...p]) if (!v) p.delete(k);
    location.hash = "#/queue/" + enc(queue) + (p.toString() ? "?" + p : "");
  };
  const sel = h("select", { id: "f-state", name: "state" }, h("option", { value: "" }, "any"), STATES.map(s => h("option", { value: s, selected: s === state }, s)));
  const fromIn = h("input", { id: "f-from", type: "datetime-local", value: from }), toIn = h("input", { id: "f-to", type: "datetime-local", value: to });
  const filters = h("form", { class: "filters", onsubmit: (ev) => { ev.preventDefault(); go({ state: sel.value, from: fromIn.value, to: toIn.value, pages: [] }); } },
    h("label", { for: "f-state" }, "State", sel), h("label", { for: "f-from" }, "Created from", fromIn), h("label", { for: "f-to" }, "Created before", toIn),
    h("button", { type: "submit" }, "Filter"));
  const actions = h("div", { class: "actions" },
    can("admin") ? (q.paused ? button("Resume queue", async () => { await api("POST", `/v1/queues/${enc(queue)}/resume`); say("Resumed " + queue, "ok"); render(); }, { id: "resume" })
      : button("Pause queue", async () => { await api("POST", `/v1/queues/${enc(queue)}/pause`); say("Paused " + queue, "ok"); render(); }, { id: "pause" })) : null,
    can("admin") ? button("Purge all dead letters", async () => {
      const r = await api("POST", `/v1/queues/${enc(queue)}/dead-letters/purge`, { all: true });
      say("Purged " + r.purged.length + " dead letters", "ok"); render();
    }, { danger: true, id: "purge-all", confirm: "Delete every dead-lettered task of " + queue + "?" }) : null,
    link("#/dead/" + enc(queue), "Dead letters by error"));
  const rows = page.tasks.map(t => [link("#/task/" + enc(t.id), t.id), t.state, `${t.attempts}/${t.max_attempts}`, when(t.created_at_ms), when(t.updated_at_ms), (t.last_error || "").slice(0, 80)]);
  const pager = h("div", { class: "actions" },
    tokens.length ? button("Previous page", () => go({ pages: tokens.slice(0, -1) }), { id: "prev", nav: true }) : null,
    page.next_page_token ? button("Next page", () => go({ pages: [...tokens, page.next_page_token] }), { id: "next", nav: true }) : null);
  // Fairness keys: who waits, who runs, who is held back by a rate limit (weights and limits: admin calls).
  const keyRows = fair.keys.map(k => [k.key || "(no key)", String(k.weight), String(k.ready), String(k.running), k.throttled ? "throttled" : ""]);
  const keys = fair.keys.some(k => k.key || k.weight !== 1) ? [h("h2", {}, "Keys"), h("div", { id: "keys" }, table(["Key", "Weight", "Waiting", "Running", "Rate limit"], keyRows, [1, 2, 3]))] : [];
  show(h("h1", {}, "Queue ", queue, q.paused ? h("span", { class: "paused" }, "paused") : null), actions, filters,
    table(["Task", "State", "Attempts", "Created", "Updated", "Last error"], rows), pager, ...keys);
}

// ---- Task.
function hex(b64) {
  const bin = atob(b64 || "");
  const out = [];
  for (let i = 0; i < Math.min(bin.length, 4096); i++) out.push(bin.charCodeAt(i).toString(16).padStart(2, "0"));
  return out.join(" ").replace(/((?:\S\S ){16})/g, "$1\n") + (bin.length > 4096 ? "\n… (" + bin.length + " bytes)" : "");
}
function preview(text, b64) {
  return text !== null && text !== undefined ? h("pre", {}, text.length > 16384 ? text.slice(0, 16384) + "\n…" : text) : h("pre", { class: "hex" }, hex(b64));
}
async function taskPage([id]) {
  const t = await api("GET", "/v1/tasks/" + enc(id));
  const ended = ["COMPLETED", "FAILED", "CANCELLED"].includes(t.state);
  const res = ended ? await api("GET", "/v1/tasks/" + enc(id) + "/result").catch(() => null) : null;
  const ids = (list) => list && list.length ? h("span", {}, list.map((i, n) => [n ? ", " : "", link("#/task/" + enc(i), i)])) : "—";
  const facts = [["State", t.state], ["Queue", link("#/queue/" + enc(t.queue), t.queue)], ["Attempts", `${t.attempts} of ${t.max_attempts}`],
    ["Priority", t.priority], ["Created", when(t.created_at_ms)], ["Updated", when(t.updated_at_ms)], ["Visible at", when(t.visible_at_ms)],
    ["Ended", when(t.ended_at_ms)], ["Dead-lettered", when(t.dead_lettered_at_ms)], ["Deadline", when(t.deadline_ms)],
    ["Lease", t.lease ? `${t.lease.worker_id} until ${when(t.lease.deadline_ms)}` : "—"],
    ["Progress", t.progress ? `${t.progress.percent}% ${t.progress.message || ""} (${ago(t.progress.at_ms)})` : "—"],
    ["Parent", t.parent_id ? link("#/task/" + enc(t.parent_id), t.parent_id) : "—"], ["Follow-ups", ids(t.follow_up_ids)],
    ["Depends on", ids(t.depends_on)], ["Waiting on", ids(t.waiting_on)], ["Idempotency key", t.idempotency_key || "—"],
    ["Last error", t.last_error || "—"]];
  const actions = h("div", { class: "actions" },
    can("enqueue") && !ended && t.state !== "DEAD_LETTERED" ? button("Cancel task", async () => { await api("POST", `/v1/tasks/${enc(id)}/cancel`); say("Cancelled", "ok"); render(); }, { id: "cancel", danger: true, confirm: "Cancel this task?" }) : null,
    can("enqueue") && t.state === "DEAD_LETTERED" ? button("Redrive task", async () => { await api("POST", `/v1/queues/${enc(t.queue)}/dead-letters/redrive`, { ids: [id] }); say("Redriven", "ok"); render(); }, { id: "redrive" }) : null,
    t.state === "DEAD_LETTERED" ? link("#/dead/" + enc(t.queue), "Its error group") : null);
  const runs = t.runs.map(r => [r.worker_id, when(r.started_at_ms), when(r.ended_at_ms), r.outcome || "running", r.reason || ""]);
  show(h("h1", {}, "Task ", h("span", { id: "task-id" }, t.id)), actions,
    h("dl", { id: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("h2", {}, "Payload"), preview(t.payload, t.payload_base64),
    res ? [h("h2", {}, res.error ? "Error" : "Result"), res.error ? h("pre", {}, res.error) : preview(res.result, res.result_base64)] : null,
    h("h2", {}, "Runs"), table(["Worker", "Started", "Ended", "Outcome", "Reason"], runs));
  if (!ended) poll(async () => { if (location.hash.startsWith("#/task/")) await render(); }, POLL_MS);
}

// ---- Dead letters grouped by last error.
async function deadPage([queue]) {
  const g = await api("GET", `/v1/queues/${enc(queue)}/dead-letters/groups`);
  const rows = g.groups.map(x => [h("span", { class: "error-text" }, x.error || "(no error text)"), String(x.count),
    h("span", {}, x.example_ids.map((i, n) => [n ? ", " : "", link("#/task/" + enc(i), i.slice(0, 8) + "…")])), ago(x.last_dead_lettered_at_ms),
    h("span", { class: "actions" },
      can("enqueue") ? button("Redrive group", async () => {
        const r = await api("POST", `/v1/queues/${enc(queue)}/dead-letters/groups/redrive`, { error: x.error });
        say("Redrove " + r.redriven.length + " tasks", "ok"); render();
      }, { id: "redrive-group" }) : null,
      can("admin") ? button("Purge group", async () => {
        const r = await api("POST", `/v1/queues/${enc(queue)}/dead-letters/groups/purge`, { error: x.error });
        say("Purged " + r.purged.length + " tasks", "ok"); render();
      }, { danger: true, id: "purge-group", confirm: "Delete every dead letter of this group?" }) : null)]);
  show(h("h1", {}, "Dead letters of ", link("#/queue/" + enc(queue), queue)),
    h("p", { class: "muted" }, `${g.scanned} dead letters${g.truncated ? " (the oldest; redrive or purge a group, then look again)" : ""}, grouped by last error.`),
    table(["Last error", "Count", "Examples", "Last died", ""], rows, [1]));
}

// ---- Schedules.
function nextOccurrences(s) {
  if (!s.next_occurrence_ms) return "—";
  if (s.interval_ms) return [0, 1, 2].map(k => when(s.next_occurrence_ms + k * s.interval_ms)).join(", ");
  return when(s.next_occurrence_ms);
}
async function schedulesPage() {
  const l = await api("GET", "/v1/schedules");
  const rows = l.schedules.map(s => [s.name, link("#/queue/" + enc(s.queue), s.queue),
    s.cron ? `${s.cron} (${s.time_zone || "UTC"})` : `every ${s.interval_ms / 1000} s`,
    s.paused ? h("span", { class: "paused" }, "paused") : nextOccurrences(s), String(s.fired), when(s.last_occurrence_ms),
    h("span", { class: "actions" }, can("enqueue") ? [
      s.paused ? button("Resume", async () => { await api("POST", `/v1/schedules/${enc(s.id)}/resume`); render(); }, { id: "resume-schedule" })
        : button("Pause", async () => { await api("POST", `/v1/schedules/${enc(s.id)}/pause`); render(); }, { id: "pause-schedule" }),
      button("Delete", async () => { await api("DELETE", `/v1/schedules/${enc(s.id)}`); say("Deleted " + s.name, "ok"); render(); }, { danger: true, id: "delete-schedule", confirm: "Delete schedule " + s.name + "?" })] : null)]);
  show(h("h1", {}, "Schedules"), table(["Name", "Queue", "When", "Next occurrences", "Fired", "Last", ""], rows, [4]));
}

// ---- Cluster.
async function clusterPage() {
  if (!can("admin")) { show(h("h1", {}, "Cluster"), h("p", {}, "The cluster view needs a token with the admin scope.")); return; }
  const draw = async () => {
    const c = await api("GET", "/v1/cluster/status");
    const leader = c.nodes.find(n => n.role === "LEADER");
    const lag = (leader && leader.replication_lag) || {};
    const rows = c.nodes.map(n => [String(n.node_id), n.reachable ? h("span", { class: "role-" + n.role }, n.role) : h("span", { class: "down" }, "unreachable"),
      n.reachable ? String(n.term) : "—", n.reachable ? String(n.last_log_index) : "—", n.reachable ? String(n.applied_index) : "—",
      lag[n.node_id] !== undefined ? String(lag[n.node_id]) : "—", n.reachable ? String(n.version || 0) : "—",
      n.api_addr, n.voter ? "voter" : "learner",
      n.reachable ? "" : (n.error ? n.error.message : ""),
      n.voter && n.role !== "LEADER" ? button("Make leader", async () => {
        say("Transferring leadership to node " + n.node_id + "…");
        const r = await api("POST", "/v1/cluster/transfer-leader", { to: n.node_id });
        say("Node " + r.leader_id + " leads (took " + r.took_ms + " ms)", "ok"); await draw();
      }, { id: "transfer-" + n.node_id }) : ""]);
    show(h("h1", {}, "Cluster"),
      h("p", {}, "Answered by node ", h("b", { id: "answered-by" }, String(c.node_id)), " (raftq " + c.release + "); cluster version ",
        h("b", { id: "cluster-version" }, String(c.cluster_version)), "; leader: ",
        h("b", { id: "leader-id" }, c.leader_id === null ? "none" : String(c.leader_id)), ", term " + c.term + "."),
      table(["Node", "Role", "Term", "Log index", "Applied", "Lag", "Version", "Address", "Kind", "Problem", ""], rows, [2, 3, 4, 5, 6]));
  };
  await draw();
  poll(draw, 2000);
}

window.addEventListener("hashchange", () => { say(""); render(); });
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signout").addEventListener("click", () => signOut());
  render();
});

// The Tidings web console: one module, no build step, no dependencies.
//
// Every datum comes from the server's REST API (docs/api.md), called with the token
// the user logged in with (kept in sessionStorage: gone when the tab closes). Pages
// are built with DOM calls, never from HTML strings, so nothing a message carries is
// ever interpreted as markup.

const TOKEN_KEY = "tidings.token";
// The principal a server at this address accepted the kept token for, in this tab: a
// server that then does not know the token is one whose auth file lacks it, not a sign
// that the token is worthless everywhere.
const PRINCIPAL_KEY = "tidings.principal";
const NAMESPACE_KEY = "tidings.namespace";
const PAGE_SIZES = [10, 20, 50, 100];
const RATES_EVERY_MS = 3000;
const RATES_SPAN_MS = 5 * 60 * 1000; // the chart shows the last five minutes
const RATES_WINDOW = RATES_SPAN_MS / RATES_EVERY_MS + 1; // points kept

const main = document.getElementById("main");
const state = {
  me: null, // the /v1/whoami answer
  refused: null, // the request a 401 refused, while start() checks the token again
  timers: [], // intervals of the page on screen, cleared when it changes
  rates: { key: "", points: [] },
};

// ---------------------------------------------------------------------------------
// DOM helpers

/** An element: h("td", {class: "num"}, "12"). Strings become text nodes. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  for (const child of children) {
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function show(...children) {
  main.replaceChildren();
  append(main, children);
}

function table(headers, rows, emptyText) {
  const head = h("tr", {}, headers.map((x) => {
    const [label, cls] = Array.isArray(x) ? x : [x, null];
    return h("th", { class: cls }, label);
  }));
  const body = rows.length
    ? rows
    : [h("tr", {}, h("td", { class: "empty", colspan: headers.length }, emptyText))];
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

function panel(title, note, ...children) {
  return h("section", { class: "panel" },
    h("h2", {}, title, note ? h("span", { class: "muted" }, note) : null), children);
}

function card(label, value, note) {
  return h("div", { class: "card" },
    h("div", { class: "label" }, label),
    h("div", { class: "value" }, value),
    note ? h("div", { class: "note" }, note) : null);
}

function notice(kind, ...text) {
  return h("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

function heading(title, crumbs, ...tools) {
  return h("div", {},
    crumbs ? h("div", { class: "crumbs" }, crumbs) : null,
    h("div", { class: "head" }, h("h1", {}, title), h("span", { class: "grow" }), tools));
}

function refreshButton() {
  return h("button", { class: "quiet", type: "button", onclick: () => route() }, "Refresh");
}

// ---------------------------------------------------------------------------------
// formatting

const numberFormat = new Intl.NumberFormat("en-US");

function count(n) {
  return n === null || n === undefined ? "–" : numberFormat.format(n);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}

function rate(r) {
  if (r === null || r === undefined) return "–";
  return `${r < 10 && r > 0 ? r.toFixed(2) : Math.round(r * 10) / 10}/s`;
}

function pad(n, width = 2) {
  return String(n).padStart(width, "0");
}

/** Local time with milliseconds: 2025-03-01 14:02:03.120 */
function when(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  const s = Math.abs(ms) / 1000;
  const one = (v) => v.toFixed(1).replace(/\.0$/, "");
  if (s < 1) return `${Math.round(Math.abs(ms))} ms`;
  if (s < 90) return `${s < 10 ? one(s) : Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${one(s / 3600)} h`;
  return `${one(s / 86400)} days`;
}

function timeZone() {
  const minutes = -new Date().getTimezoneOffset();
  const sign = minutes < 0 ? "-" : "+";
  const name = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
  return `${name}, UTC${sign}${pad(Math.floor(Math.abs(minutes) / 60))}:${pad(Math.abs(minutes) % 60)}`;
}

function ago(ms, now = Date.now()) {
  if (ms === null || ms === undefined) return "–";
  return `${duration(now - ms)} ago`;
}

// ---------------------------------------------------------------------------------
// ids and payloads

function b64ToBytes(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) out[i] = raw.charCodeAt(i);
  return out;
}

function bytesToB64(data) {
  let raw = "";
  for (const b of data) raw += String.fromCharCode(b);
  return btoa(raw);
}

function bytesToHex(data) {
  return Array.from(data, (b) => pad(b.toString(16))).join("");
}

function hexToBytes(hex) {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i += 1) out[i] = parseInt(hex.substr(i * 2, 2), 16);
  return out;
}

/** A message id the user typed: 40 hex digits, or 28 characters of base64. */
function parseId(text) {
  const t = text.trim();
  if (/^[0-9a-fA-F]{40}$/.test(t)) return t.toLowerCase();
  if (/^[A-Za-z0-9+/]{26}[AEIMQUYcgkosw048]=$/.test(t)) return bytesToHex(b64ToBytes(t));
  return null;
}

/** The publish time (ms) in a message id: its first 8 bytes, big-endian. */
function idTime(hex) {
  return Number(new DataView(hexToBytes(hex).buffer).getBigUint64(0));
}

/** A date-time the user typed: "2025-03-01 14:02:03" (local), ISO 8601, or ms. */
function parseTime(text) {
  let t = text.trim();
  if (/^\d{10,16}$/.test(t)) return Number(t);
  // Date.parse takes a date alone as UTC midnight, unlike a date-time without an offset
  // (local): a date alone is the start of that day here, as the page promises.
  if (/^\d{4}-\d{2}$/.test(t)) t += "-01";
  if (/^\d{4}-\d{2}-\d{2}$/.test(t)) t += "T00:00";
  const ms = Date.parse(t.replace(" ", "T"));
  return Number.isNaN(ms) ? null : ms;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** How a payload is shown: pretty JSON if it parses, text if it is printable UTF-8, else hex. */
function render(data) {
  let text = null;
  try {
    text = utf8.decode(data);
  } catch {
    text = null;
  }
  if (text !== null && text.trim() !== "") {
    try {
      const value = JSON.parse(text);
      if (typeof value === "object" && value !== null) {
        return { kind: "json", text: indentJson(text) };
      }
    } catch {
      // not JSON: shown as text below
    }
  }
  // eslint-disable-next-line no-control-regex
  if (text !== null && !/[\u0000-\u0008\u000e-\u001f\u007f]/.test(text)) {
    return { kind: "text", text };
  }
  return { kind: "binary", text: hexDump(data) };
}

/**
 * Valid JSON text indented by two spaces per level, its tokens kept as written:
 * JSON.stringify(JSON.parse(text)) would round numbers a double cannot hold (64-bit
 * ids, amounts with many digits), and the page must show what the message holds.
 */
function indentJson(text) {
  const out = [];
  let depth = 0;
  const blank = (c) => c === " " || c === "\n" || c === "\r" || c === "\t"; // JSON's only
  const newline = () => `\n${"  ".repeat(depth)}`;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out.push(text.slice(i, j + 1));
      i = j;
    } else if (c === "{" || c === "[") {
      const close = c === "{" ? "}" : "]";
      let j = i + 1;
      while (blank(text[j])) j += 1;
      if (text[j] === close) {
        out.push(c + close); // an empty object or array stays on its line
        i = j;
      } else {
        depth += 1;
        out.push(c, newline());
      }
    } else if (c === "}" || c === "]") {
      depth -= 1;
      out.push(newline(), c);
    } else if (c === ",") {
      out.push(",", newline());
    } else if (c === ":") {
      out.push(": ");
    } else if (!blank(c)) {
      out.push(c);
    }
  }
  return out.join("");
}

function hexDump(data) {
  const lines = [];
  for (let at = 0; at < data.length; at += 16) {
    const row = data.slice(at, at + 16);
    const hex = Array.from(row, (b) => pad(b.toString(16))).join(" ");
    const chars = Array.from(row, (b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${chars}`);
  }
  return lines.join("\n") || "(empty)";
}

function shortText(data) {
  const shown = render(data);
  return shown.kind === "binary" ? `0x${bytesToHex(data.slice(0, 24))}${data.length > 24 ? "…" : ""}` : shown.text;
}

// ---------------------------------------------------------------------------------
// the API

class ApiError extends Error {
  constructor(status, message, type) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

function namespace() {
  return localStorage.getItem(NAMESPACE_KEY) || "default";
}

function nsPath(rest = "") {
  return `/v1/namespaces/${encodeURIComponent(namespace())}${rest}`;
}

function topicPath(topic, rest = "") {
  return nsPath(`/topics/${encodeURIComponent(topic)}${rest}`);
}

/**
 * JSON.parse, except that integers a JavaScript number would round (write pointers are
 * 64-bit) are read as strings: they are only shown and compared, never computed with.
 */
function parseJson(text) {
  if (!/\d{16}/.test(text)) return JSON.parse(text);
  let out = "";
  let last = 0;
  let inString = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i += 1;
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
    } else if (c === "-" || (c >= "0" && c <= "9")) {
      let j = i + 1;
      while (j < text.length && /[0-9.eE+-]/.test(text[j])) j += 1;
      const token = text.slice(i, j);
      if (/^-?\d+$/.test(token) && !Number.isSafeInteger(Number(token))) {
        out += `${text.slice(last, i)}"${token}"`;
        last = j;
      }
      i = j - 1;
    }
  }
  return JSON.parse(out + text.slice(last));
}

async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let answer;
  try {
    answer = await fetch(path, init);
  } catch (err) {
    // No answer at all (the server stopped, the network cut): fetch's own TypeError
    // ("Failed to fetch") would reach the page as a script error.
    throw new ApiError(0, `The server did not answer (${err.message}).`, null);
  }
  const text = await answer.text();
  let data = null;
  if (text) {
    try {
      data = parseJson(text);
    } catch {
      data = text;
    }
  }
  const message = answer.ok ? null : data && data.error ? data.error : `${answer.status} ${answer.statusText}`;
  if (answer.status === 401 && path !== "/v1/whoami" && state.me) {
    // The token was withdrawn (the auth file reloaded) while the page was open. It is
    // kept for start(), whose whoami finds no principal for it, drops it and says
    // so on the login page: dropped here, the login page came up with no reason.
    // The first refusal of a page is the one start() reports; the others wait for it.
    state.me = null;
    state.refused = { method, path, message };
    setTimeout(start, 0);
  }
  if (!answer.ok) {
    throw new ApiError(answer.status, message, data && data.type);
  }
  return { data, headers: answer.headers };
}

async function get(path) {
  return (await call("GET", path)).data;
}

// What the principal may do, from its patterns (fnmatch-style, as the server matches
// them), so the pages ask only for what they may read and hide what would be refused.
function globToRegExp(pattern) {
  let out = "";
  for (let i = 0; i < pattern.length; i += 1) {
    const c = pattern[i];
    if (c === "*") out += ".*";
    else if (c === "?") out += ".";
    else if (c === "[") {
      const close = pattern.indexOf("]", i + 2);
      if (close < 0) {
        out += "\\[";
      } else {
        let set = pattern.slice(i + 1, close).replace(/\\/g, "\\\\");
        if (set.startsWith("!")) set = `^${set.slice(1)}`;
        out += `[${set}]`;
        i = close;
      }
    } else out += c.replace(/[.+^${}()|\\\]]/g, "\\$&");
  }
  return new RegExp(`^${out}$`);
}

function matches(name, patterns) {
  return patterns.some((p) => globToRegExp(p).test(name));
}

const may = {
  admin: () => Boolean(state.me && state.me.admin),
  consume: (topic) => may.admin() || matches(topic, state.me.consume),
  read: (topic) => may.consume(topic) || matches(topic, state.me.publish),
};

// ---------------------------------------------------------------------------------
// confirmation

function confirmAction(title, text, action) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = action;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

async function deleteTopic(topic, after) {
  const sure = await confirmAction(
    `Delete topic ${topic}?`,
    `Its messages, consumer groups and queues are deleted with it. This cannot be undone.`,
    "Delete topic",
  );
  if (!sure) return;
  try {
    await call("DELETE", topicPath(topic));
    after();
  } catch (err) {
    main.prepend(notice("error", `Could not delete ${topic}: ${errorText(err)}`));
  }
}

// ---------------------------------------------------------------------------------
// pages

async function topicRows(names) {
  // In parallel, but a few at a time: a namespace may hold many topics.
  const out = new Array(names.length);
  let next = 0;
  async function worker() {
    while (next < names.length) {
      const i = next;
      next += 1;
      const name = names[i];
      if (!may.read(name)) {
        out[i] = { name, hidden: true };
        continue;
      }
      try {
        const [meta, stats] = await Promise.all([get(topicPath(name)), get(topicPath(name, "/stats"))]);
        out[i] = { name, meta, stats };
      } catch (err) {
        // As settle(): a 401 fails the page (start() takes over); a topic deleted
        // meanwhile is left out; any other refusal is this row's, with its status.
        if (err instanceof ApiError && err.status === 401) throw err;
        out[i] = err instanceof ApiError && err.status === 404 ? null : { name, error: errorText(err) };
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(6, names.length) }, worker));
  return out.filter(Boolean);
}

async function topicsPage() {
  const names = await get(nsPath("/topics"));
  const rows = await topicRows(names);
  const now = Date.now();
  const body = rows.map((row) => {
    const link = h("a", { href: `#/topic/${encodeURIComponent(row.name)}` }, row.name);
    if (row.hidden) {
      return h("tr", { "data-topic": row.name },
        h("td", {}, row.name),
        h("td", { colspan: 7, class: "muted" }, "no publish or consume rights"),
        h("td", {}));
    }
    if (row.error) {
      return h("tr", { "data-topic": row.name },
        h("td", {}, link),
        h("td", { colspan: 7 }, notice("error", row.error)),
        h("td", {}));
    }
    const s = row.stats;
    return h("tr", { "data-topic": row.name },
      h("td", {}, link),
      h("td", { class: "num" }, count(s.messageCount)),
      h("td", { class: "num" }, bytes(s.bytes)),
      h("td", { class: "num" }, duration(Number(row.meta.properties.ttl) * 1000)),
      h("td", { class: "num" }, rate(s.publishRate)),
      h("td", { class: "num" }, rate(s.fetchRate)),
      h("td", { title: when(s.newestTime) }, s.newestTime ? ago(s.newestTime, now) : "–"),
      h("td", {}, s.lastStableId ? h("span", { class: "badge warn" }, "transaction open") : null),
      h("td", { class: "actions" },
        // Reading messages takes consume rights: publish alone shows the figures only.
        may.consume(row.name) ? h("a", { href: `#/topic/${encodeURIComponent(row.name)}/messages` }, "Browse") : null,
        may.admin()
          ? h("button", {
            class: "link danger-link", type: "button", "data-action": "delete",
            onclick: () => deleteTopic(row.name, () => route()),
          }, "Delete")
          : null));
  });
  const create = may.admin() ? createTopicForm() : null;
  show(
    heading("Topics", `Namespace ${namespace()}`, refreshButton()),
    create,
    panel("Topics", `${rows.length} in ${namespace()}`, table(
      ["Name", ["Messages", "num"], ["Size", "num"], ["TTL", "num"], ["Publish rate", "num"],
        ["Fetch rate", "num"], "Last message", "", ""],
      body,
      "No topics in this namespace yet.",
    )),
  );
}

function createTopicForm() {
  const name = h("input", { type: "text", id: "new-topic", placeholder: "name", required: true, pattern: "[A-Za-z0-9_\\-]{1,128}", spellcheck: "false" });
  const ttl = h("input", { type: "number", id: "new-ttl", min: 1, placeholder: "7 days", title: "seconds" });
  const result = h("span", { class: "small" });
  const form = h("form", {
    class: "inline",
    onsubmit: async (event) => {
      event.preventDefault();
      const body = ttl.value ? { ttl: Number(ttl.value) } : {};
      try {
        await call("PUT", topicPath(name.value.trim()), body);
        route();
      } catch (err) {
        result.replaceChildren(h("span", { class: "badge bad" }, errorText(err)));
      }
    },
  }, h("label", {}, "New topic "), name, h("label", {}, "TTL (seconds) "), ttl,
  h("button", { type: "submit", id: "create-topic" }, "Create"), result);
  return panel("Create a topic", null, form);
}

/** The text an error shows: the server's message and its status. */
function errorText(err) {
  if (err instanceof ApiError) return err.status ? `${err.message} (${err.status})` : err.message;
  return String(err);
}

/**
 * ``{value}`` or ``{error}`` (its text) of a part of a page that may be refused on its
 * own (a 403 for one topic's groups, a passing 503): the rest of the page still shows.
 * A 401 fails the page: start() takes over.
 */
async function settle(promise) {
  try {
    return { value: await promise };
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) throw err;
    return { error: errorText(err) };
  }
}

async function topicPage(topic) {
  const [meta, stats] = await Promise.all([get(topicPath(topic)), get(topicPath(topic, "/stats"))]);
  let groups = { error: "Groups and queues need consume rights on this topic." };
  let queues = groups;
  if (may.consume(topic)) {
    [groups, queues] = await Promise.all([settle(topicGroups(topic)), settle(topicQueues(topic))]);
  }
  const failed = (part) => (may.consume(topic)
    ? notice("error", part.error)
    : h("p", { class: "muted" }, part.error));
  const props = Object.entries(meta.properties).sort();
  const lso = stats.lastStableId
    ? [h("code", {}, stats.lastStableId), h("div", { class: "small muted" },
      `the first message of the oldest transaction still open on the topic, published ${when(idTime(stats.lastStableId))}; ` +
      "read-committed readers stop here until it ends")]
    : h("span", {}, "none: no transaction is open on this topic, read-committed readers see every message");
  show(
    heading(topic, h("span", {}, h("a", { href: "#/topics" }, "Topics"), ` / ${namespace()}`),
      may.consume(topic) ? h("a", { class: "button", href: `#/topic/${encodeURIComponent(topic)}/messages` }, "Browse messages") : null,
      refreshButton(),
      may.admin()
        ? h("button", { class: "danger", type: "button", "data-action": "delete", onclick: () => deleteTopic(topic, () => { location.hash = "#/topics"; }) }, "Delete topic")
        : null),
    h("div", { class: "cards" },
      card("Messages", count(stats.messageCount), "live, until the cleaner drops them"),
      card("Size", bytes(stats.bytes), "payload bytes"),
      card("Publish rate", rate(stats.publishRate), "messages per second, last minute"),
      card("Fetch rate", rate(stats.fetchRate), "fetches per second, last minute"),
      card("Published", count(stats.messagesPublished), `${bytes(stats.bytesPublished)} since the server started`),
      card("Last message", stats.newestTime ? ago(stats.newestTime) : "–", when(stats.newestTime))),
    h("div", { class: "panel-gap" }),
    panel("Position", null, h("dl", { class: "props" },
      h("dt", {}, "Oldest message"), h("dd", {}, stats.oldestId ? [h("code", {}, stats.oldestId), ` · ${when(stats.oldestTime)}`] : "–"),
      h("dt", {}, "Newest message"), h("dd", {}, stats.newestId ? [h("code", {}, stats.newestId), ` · ${when(stats.newestTime)}`] : "–"),
      h("dt", {}, "Last stable offset"), h("dd", {}, lso),
      h("dt", {}, "Fetches"), h("dd", {}, count(stats.fetches)))),
    panel("Properties", `generation ${meta.generation}`, table(
      ["Property", "Value"],
      props.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, k === "ttl" ? `${v} s (${duration(Number(v) * 1000)})` : v))),
      "No properties.",
    )),
    h("div", { id: "groups-panel" },
      panel("Consumer groups", null, groups.error ? failed(groups) : groupsTable(groups.value, false))),
    h("div", { id: "queues-panel" },
      panel("Queues", null, queues.error ? failed(queues) : queuesTable(queues.value))),
  );
}

/**
 * get(), but null for a 404: a topic, group or queue deleted between the list that
 * named it and this request is gone, not a failure of the whole page.
 */
async function getUnlessGone(path) {
  try {
    return await get(path);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return null;
    throw err;
  }
}

/** Each of a topic's groups or queues (kind: "groups" or "queues"), described. */
async function describeAll(topic, kind) {
  const names = (await getUnlessGone(topicPath(topic, `/${kind}`))) || [];
  const found = await Promise.all(names.map((name) => getUnlessGone(topicPath(topic, `/${kind}/${encodeURIComponent(name)}`))));
  return found.filter(Boolean).map((x) => ({ topic, ...x }));
}

async function topicGroups(topic) {
  return describeAll(topic, "groups");
}

async function topicQueues(topic) {
  return describeAll(topic, "queues");
}

function groupsTable(groups, withTopic) {
  return table(
    [...(withTopic ? ["Topic"] : []), "Group", ["Members", "num"], ["Partitions", "num"], ["Generation", "num"], ["Lag", "num"]],
    groups.map((g) => h("tr", {},
      withTopic ? h("td", {}, h("a", { href: `#/topic/${encodeURIComponent(g.topic)}` }, g.topic)) : null,
      h("td", {}, h("a", { href: `#/groups?focus=${encodeURIComponent(`${g.topic}/${g.group}`)}` }, g.group)),
      h("td", { class: "num" }, count(g.members.length)),
      h("td", { class: "num" }, count(g.partitionCount)),
      h("td", { class: "num" }, count(g.generation)),
      h("td", { class: "num" }, lagText(g.lag, g.partitions.every((p) => p.lagExact))))),
    "No consumer groups.",
  );
}

function plural(n, word) {
  return `${count(n)} ${n === 1 ? word : `${word}s`}`;
}

function lagText(lag, exact) {
  // null: no committed position to count from (a group starting at latest), Kafka's "-".
  return exact || lag === null ? count(lag) : `≥ ${count(lag)}`;
}

function queuesTable(queues, withTopic = false) {
  return table(
    [...(withTopic ? ["Topic"] : []), "Queue", ["Waiting", "num"], ["Pending", "num"], ["Consumers", "num"],
      ["Acked", "num"], ["Redelivered", "num"], ["Dead letters", "num"], "Dead-letter topic",
      ["Pop rate", "num"], ["Ack rate", "num"]],
    queues.map((q) => h("tr", { "data-queue": q.queue },
      withTopic ? h("td", {}, h("a", { href: `#/topic/${encodeURIComponent(q.topic)}` }, q.topic)) : null,
      h("td", {}, q.queue),
      h("td", { class: "num", title: "messages available now" }, q.waitingExact ? count(q.waiting) : `≥ ${count(q.waiting)}`),
      h("td", { class: "num", title: "leased to workers now" }, count(q.pending)),
      h("td", { class: "num" }, count(q.consumers.length)),
      h("td", { class: "num" }, count(q.acked)),
      h("td", { class: "num" }, count(q.redelivered)),
      h("td", { class: "num" }, q.deadLettered ? h("span", { class: "badge bad" }, count(q.deadLettered)) : "0"),
      h("td", {}, q.deadLetterDepth === undefined
        ? q.deadLetterTopic
        : [h("a", { href: `#/topic/${encodeURIComponent(q.deadLetterTopic)}` }, q.deadLetterTopic),
          h("span", { class: "muted small" }, ` (${plural(q.deadLetterDepth, "message")})`)]),
      h("td", { class: "num" }, rate(q.popRate)),
      h("td", { class: "num" }, rate(q.ackRate)))),
    "No queues.",
  );
}

async function readableTopics() {
  return (await get(nsPath("/topics"))).filter((t) => may.consume(t));
}

async function groupsPage() {
  const topics = await readableTopics();
  const found = await Promise.all(topics.map((t) => settle(topicGroups(t))));
  const groups = found.flatMap((f) => f.value || []);
  const refused = topics.map((t, i) => [t, found[i].error]).filter(([, error]) => error)
    .map(([t, error]) => {
      const shown = notice("error", `Groups of ${t}: ${error}`);
      shown.dataset.topic = t;
      return shown;
    });
  const sections = groups.map((g) => panel(
    h("span", {}, h("a", { href: `#/topic/${encodeURIComponent(g.topic)}` }, g.topic), " / ", g.group),
    `generation ${g.generation} · ${g.partitionCount} partitions · lag ${lagText(g.lag, g.partitions.every((p) => p.lagExact))} · starts at ${g.start}`,
    h("div", { id: `${g.topic}/${g.group}`, "data-group": g.group },
      h("h3", { class: "small muted" }, "MEMBERS"),
      table(["Member", "Partitions"], g.members.map((m) => h("tr", {},
        h("td", {}, h("code", {}, m.memberId)),
        h("td", {}, m.partitions.join(", ") || "none"))), "No members: nobody is consuming."),
      h("h3", { class: "small muted" }, "PARTITIONS"),
      table(["Partition", "Owner", "Position", "Position published", ["Lag", "num"]], g.partitions.map((p) => h("tr", {},
        h("td", {}, String(p.partition)),
        h("td", {}, p.owner ? h("code", {}, p.owner) : h("span", { class: "muted" }, "unassigned")),
        h("td", {}, p.position ? h("code", {}, p.position) : h("span", { class: "muted" }, "nothing committed")),
        h("td", {}, p.position ? when(idTime(p.position)) : "–"),
        h("td", { class: "num" }, lagText(p.lag, p.lagExact)))), "No partitions."))));
  show(
    heading("Consumer groups", `Namespace ${namespace()}`, refreshButton()),
    refused,
    panel("All groups", `${groups.length} on ${topics.length} topics you may consume`, groupsTable(groups, true)),
    sections,
  );
  const focus = new URLSearchParams(location.hash.split("?")[1] || "").get("focus");
  const target = focus ? document.getElementById(focus) : null;
  if (target) target.scrollIntoView();
}

async function queuesPage() {
  const all = (await get(nsPath("/queues"))).filter((q) => may.consume(q.topic));
  const names = new Set(await get(nsPath("/topics")));
  const found = await Promise.all(all.map(({ topic, queue }) => settle((async () => {
    const described = await getUnlessGone(topicPath(topic, `/queues/${encodeURIComponent(queue)}`));
    if (described === null) return null;
    const q = { topic, ...described };
    if (names.has(q.deadLetterTopic) && may.read(q.deadLetterTopic)) {
      // Only a figure of the row: refused or unavailable, the row shows without it.
      const dead = await settle(getUnlessGone(topicPath(q.deadLetterTopic, "/stats")));
      if (dead.value) q.deadLetterDepth = dead.value.messageCount;
    }
    return q;
  })())));
  const queues = found.map((f) => f.value).filter(Boolean);
  const refused = all.map((q, i) => [q, found[i].error]).filter(([, error]) => error)
    .map(([q, error]) => {
      const shown = notice("error", `Queue ${q.queue} of ${q.topic}: ${error}`);
      shown.dataset.topic = q.topic;
      shown.dataset.queue = q.queue;
      return shown;
    });
  show(
    heading("Queues", `Namespace ${namespace()}`, refreshButton()),
    refused,
    panel("Queues", `${queues.length} in ${namespace()}`, queuesTable(queues, true)),
    h("p", { class: "hint" },
      "Waiting: messages available to workers now. Pending: leased to a worker and not yet acked. ",
      "Redelivered and dead letters count since the server started; a message delivered its queue's maximum number of times goes to the dead-letter topic."),
  );
}

async function transactionsPage() {
  if (!may.admin()) {
    show(heading("Transactions"), notice("info", "Only an admin may see the transaction service's state."));
    return;
  }
  const d = await get("/v1/transactions/details");
  const open = d.inProgress.map((t) => h("tr", { "data-wp": t.writePointer },
    h("td", {}, h("code", {}, String(t.writePointer))),
    h("td", {}, t.transactionalId ?? h("span", { class: "muted" }, "none")),
    h("td", { class: "num" }, t.epoch ?? "–"),
    h("td", {}, t.beganAt === null ? h("span", { class: "muted" }, "before the last restart") : when(t.beganAt)),
    h("td", { class: "num" }, t.beganAt === null ? "–" : duration(d.now - t.beganAt)),
    h("td", { class: "num" }, duration(t.timeoutMs)),
    h("td", { class: "num" }, t.expiresAt > d.now
      ? `in ${duration(t.expiresAt - d.now)}`
      : h("span", { class: "badge bad" }, "timed out"))));
  const invalidShown = d.invalid.slice(-200).reverse();
  show(
    heading("Transactions", "The transaction service", refreshButton()),
    h("div", { class: "cards" },
      card("Open", count(d.inProgress.length), "transactions in progress"),
      card("Invalid", count(d.invalid.length), "never visible to readers"),
      card("Producers", count(d.producers.length), "registered transactional ids"),
      card("Read pointer", h("span", { class: "mono" }, String(d.readPointer)), "newest committed"),
      card("Default timeout", duration(d.defaultTimeoutMs), "for a begin without one")),
    h("div", { class: "panel-gap" }),
    panel("In progress", "oldest first", table(
      ["Write pointer", "Transactional id", ["Epoch", "num"], "Began", ["Age", "num"], ["Timeout", "num"], ["Expires", "num"]],
      open, "No transaction is open.")),
    panel("Invalid", d.invalid.length > 200 ? `newest 200 of ${count(d.invalid.length)}` : "newest first",
      invalidShown.length
        ? h("div", { class: "mono small", id: "invalid-list" }, invalidShown.join("  "))
        : h("p", { class: "muted" }, "The invalid list is empty."),
      h("p", { class: "hint" }, "A transaction that timed out, was fenced or invalidated; its messages stay invisible to read-committed readers until it is pruned.")),
    panel("Producers", "transactional ids and their current epochs", table(
      ["Transactional id", ["Producer id", "num"], ["Epoch", "num"]],
      d.producers.map((p) => h("tr", {}, h("td", {}, p.transactionalId), h("td", { class: "num" }, String(p.producerId)), h("td", { class: "num" }, String(p.epoch)))),
      "No transactional id is registered.")),
  );
}

// ---------------------------------------------------------------------------------
// message browser

function browserParams() {
  const query = new URLSearchParams(location.hash.split("?")[1] || "");
  return {
    from: query.get("from") || "earliest",
    value: query.get("value") || "",
    size: Number(query.get("size")) || 20,
    committed: query.get("isolation") === "committed",
  };
}

function browserHash(topic, params) {
  const query = new URLSearchParams({ from: params.from, size: String(params.size) });
  if (params.value) query.set("value", params.value);
  if (params.committed) query.set("isolation", "committed");
  return `#/topic/${encodeURIComponent(topic)}/messages?${query}`;
}

async function fetchPage(topic, p) {
  const isolation = p.committed ? "read_committed" : "read_uncommitted";
  if (p.from === "latest" || p.from === "before") {
    const query = new URLSearchParams({ limit: String(p.size), isolation });
    if (p.from === "before") query.set("before", p.value);
    return get(`${topicPath(topic, "/messages")}?${query}`);
  }
  let body = { limit: p.size };
  if (p.from === "id") body = { ...body, startFrom: bytesToB64(hexToBytes(p.value)), inclusive: true };
  else if (p.from === "after") body = { ...body, startFrom: bytesToB64(hexToBytes(p.value)), inclusive: false };
  else if (p.from === "time") {
    // The address may have been edited by hand: NaN would go out as null, a poll from
    // the earliest message under the heading "from NaN-NaN-NaN".
    const ms = Number(p.value);
    if (p.value === "" || !Number.isSafeInteger(ms) || ms < 0) throw new Error(`not a date-time: ${p.value}`);
    body = { ...body, startFrom: ms };
  }
  return (await call("POST", `${topicPath(topic, "/poll")}?isolation=${isolation}`, body)).data;
}

async function browserPage(topic) {
  const p = browserParams();
  const stats = await get(topicPath(topic, "/stats"));
  // A page reached by paging is shown in the form as the id it was paged from.
  const kind = p.from === "after" || p.from === "before" ? "id" : p.from;
  const startKind = h("select", { id: "start-kind" },
    [["earliest", "Earliest"], ["latest", "Latest"], ["id", "Message id"], ["time", "Date-time"]]
      .map(([v, label]) => h("option", { value: v, selected: v === kind }, label)));
  const startValue = h("input", {
    type: "text", id: "start-value", class: "wide", spellcheck: "false", autocomplete: "off",
    value: kind === "time" && Number.isSafeInteger(Number(p.value)) && p.value !== "" ? when(Number(p.value)) : kind === "time" || kind === "id" ? p.value : "",
  });
  const size = h("select", { id: "page-size" }, PAGE_SIZES.map((n) => h("option", { value: n, selected: n === p.size }, `${n} per page`)));
  const committed = h("input", { type: "checkbox", id: "read-committed", checked: p.committed });
  const problem = h("span", { class: "small" });
  const syncValue = () => {
    const kind = startKind.value;
    startValue.hidden = kind === "earliest" || kind === "latest";
    startValue.placeholder = kind === "id" ? "40 hex digits (or base64)" : "2025-03-01 14:02:03 (local), ISO 8601 or ms";
  };
  startKind.addEventListener("change", syncValue);
  syncValue();
  const form = h("form", {
    class: "toolbar", id: "browse-form",
    onsubmit: (event) => {
      event.preventDefault();
      const next = { from: startKind.value, value: "", size: Number(size.value), committed: committed.checked };
      if (next.from === "id") {
        next.value = parseId(startValue.value);
        if (!next.value) {
          problem.replaceChildren(h("span", { class: "badge bad" }, "a message id is 40 hex digits or 28 base64 characters"));
          return;
        }
      } else if (next.from === "time") {
        const ms = parseTime(startValue.value);
        if (ms === null) {
          problem.replaceChildren(h("span", { class: "badge bad" }, "not a date-time"));
          return;
        }
        next.value = String(ms);
      }
      location.hash = browserHash(topic, next);
    },
  },
  h("label", {}, "Start from", startKind), startValue, size,
  h("label", { title: "Read committed: only messages of committed transactions, stopping at the first open one" }, committed, "Read committed"),
  h("button", { type: "submit", id: "browse-go" }, "Show"), problem);

  let messages = [];
  let failure = null;
  try {
    messages = await fetchPage(topic, p);
  } catch (err) {
    failure = errorText(err);
  }
  const first = messages.length ? bytesToHex(b64ToBytes(messages[0].id)) : null;
  const last = messages.length ? bytesToHex(b64ToBytes(messages[messages.length - 1].id)) : null;
  const base = { size: p.size, committed: p.committed };
  // An empty page has no message to page from: past the end (Newer up to an open
  // transaction, a time after the newest message), Older is the latest page; before
  // the start, Newer is the earliest. Without these both buttons were dead.
  const empty = !messages.length && !failure;
  let olderTo = first ? { from: "before", value: first } : null;
  let newerTo = last ? { from: "after", value: last } : null;
  if (empty && stats.newestId && p.from !== "before" && p.from !== "earliest" && p.from !== "latest") {
    olderTo = { from: "latest" };
  }
  if (empty && stats.oldestId && p.from === "before") newerTo = { from: "earliest" };
  const older = h("button", {
    class: "quiet", type: "button", id: "page-older",
    disabled: !olderTo || first === stats.oldestId,
    onclick: () => { location.hash = browserHash(topic, { ...base, ...olderTo }); },
  }, "← Older");
  const newer = h("button", {
    class: "quiet", type: "button", id: "page-newer",
    disabled: !newerTo || last === stats.newestId,
    onclick: () => { location.hash = browserHash(topic, { ...base, ...newerTo }); },
  }, "Newer →");
  const where = {
    earliest: "from the earliest message",
    latest: "the latest messages",
    id: `from message ${p.value}`,
    after: "newer messages",
    before: "older messages",
    time: `from ${when(Number(p.value))}`,
  }[p.from] || "";
  let note = null;
  if (p.from === "id" && messages.length && first !== p.value) {
    note = notice("info", `No message has the id ${p.value}; showing the messages after where it would be.`);
  }
  if (p.committed && stats.lastStableId && messages.length < p.size && !failure) {
    note = notice("info", `Read committed stops before message ${stats.lastStableId}, the first of a transaction still open on ${topic}.`);
  }
  const list = messages.map((m, i) => messageCard(m, i, p.from === "id" && i === 0 && first === p.value));
  show(
    heading("Messages", h("span", {}, h("a", { href: "#/topics" }, "Topics"), " / ", h("a", { href: `#/topic/${encodeURIComponent(topic)}` }, topic)), refreshButton()),
    panel("Find", `${plural(stats.messageCount, "message")} in ${topic}`, form,
      h("div", { class: "hint" }, `Times are in this browser's time zone (${timeZone()}). `,
        "Read committed shows only messages of committed transactions and stops at the first open one.")),
    failure ? notice("error", failure) : null,
    note,
    h("div", { class: "pager" }, older, h("span", { class: "grow muted", id: "page-where" },
      messages.length ? `${messages.length} ${messages.length === 1 ? "message" : "messages"}, ${where}${p.committed ? " (read committed)" : ""}` : "No messages here."), newer),
    h("div", { class: "messages", id: "messages" }, list),
    messages.length > 5 ? h("div", { class: "pager" }, older.cloneNode(true), h("span", { class: "grow" }), newer.cloneNode(true)) : null,
  );
  // The clones at the bottom need their own handlers.
  for (const [id, twin] of [["page-older", older], ["page-newer", newer]]) {
    const copies = main.querySelectorAll(`#${id}`);
    if (copies.length > 1) copies[1].addEventListener("click", () => twin.click());
  }
}

function messageCard(m, i, found) {
  const idHex = bytesToHex(b64ToBytes(m.id));
  const payload = b64ToBytes(m.payload);
  const shown = render(payload);
  const headers = Object.entries(m.headers || {});
  return h("article", { class: found ? "message found" : "message", "data-id": idHex },
    h("div", { class: "meta" },
      h("span", { class: "pos" }, `#${i + 1}`),
      h("span", { title: "publish time (local)" }, when(idTime(idHex))),
      h("code", { class: "id", title: "message id" }, idHex),
      h("span", { class: `badge ${shown.kind}` }, shown.kind === "binary" ? "binary (hex)" : shown.kind.toUpperCase()),
      h("span", { class: "muted small" }, bytes(payload.length))),
    m.key || headers.length
      ? h("div", { class: "extras" },
        m.key ? h("span", {}, h("span", { class: "muted" }, "key "), h("code", { class: "key" }, shortText(b64ToBytes(m.key)))) : null,
        headers.length ? h("span", {}, h("span", { class: "muted" }, "headers "),
          headers.map(([k, v]) => [h("span", { class: "header" }, `${k}: ${shortText(b64ToBytes(v))}`), " "])) : null)
      : null,
    h("pre", { class: "payload" }, shown.text));
}

// ---------------------------------------------------------------------------------
// live rates

async function sampleRates() {
  const topics = (await get(nsPath("/topics"))).filter((t) => may.read(t));
  const stats = await Promise.all(topics.map((t) => get(topicPath(t, "/stats")).catch(() => null)));
  const rows = stats.filter(Boolean);
  return {
    at: Date.now(),
    publish: rows.reduce((sum, s) => sum + s.publishRate, 0),
    fetch: rows.reduce((sum, s) => sum + s.fetchRate, 0),
    topics: rows,
  };
}

function niceMax(v) {
  if (v <= 0) return 1;
  const step = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
  return 10 * step;
}

function chart(points) {
  const W = 920;
  const H = 280;
  const left = 56;
  const right = 16;
  const top = 14;
  const bottom = 30;
  const plotW = W - left - right;
  const plotH = H - top - bottom;
  const now = points.length ? points[points.length - 1].at : Date.now();
  const span = RATES_SPAN_MS;
  const start = now - span;
  const max = niceMax(Math.max(0, ...points.map((p) => Math.max(p.publish, p.fetch))));
  const x = (t) => left + ((t - start) / span) * plotW;
  const y = (v) => top + plotH - (v / max) * plotH;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "publish and fetch rates over the last five minutes" });
  for (let i = 0; i <= 4; i += 1) {
    const v = (max * i) / 4;
    root.append(svg("line", { class: i ? "grid" : "axis", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
    // Three significant digits: a quarter of a small maximum (0.005 of 0.02) rounded
    // to two decimals labelled two lines alike, and the scale wrong.
    root.append(svg("text", { class: "tick", x: left - 8, y: y(v) + 4, "text-anchor": "end" }, Number(v.toPrecision(3))));
  }
  for (let s = 0; s <= 5; s += 1) {
    const t = start + (span * s) / 5;
    const label = s === 5 ? "now" : `${5 - s} min ago`;
    root.append(svg("line", { class: "grid", x1: x(t), x2: x(t), y1: top, y2: top + plotH }));
    root.append(svg("text", { class: "tick", x: x(t), y: H - 8, "text-anchor": s === 0 ? "start" : s === 5 ? "end" : "middle" }, label));
  }
  root.append(svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: top + plotH }));
  ["publish", "fetch"].forEach((key, i) => {
    const coords = points.map((p) => `${x(p.at).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ");
    if (!points.length) return;
    root.append(svg("polyline", { class: `series s${i}`, points: coords, "data-series": key }));
    const newest = points[points.length - 1];
    root.append(svg("circle", { class: `dot s${i}`, cx: x(newest.at), cy: y(newest[key]), r: 3.5 }));
  });
  return root;
}

async function ratesPage() {
  const key = namespace();
  if (state.rates.key !== key) state.rates = { key, points: [] };
  const chartBox = h("div", { class: "chart", id: "rates-chart" });
  const current = h("div", { class: "cards", id: "rates-now" });
  const perTopic = h("div", {});
  const stamp = h("span", { class: "muted small", id: "rates-stamp" });
  show(
    heading("Live rates", `Namespace ${namespace()}`, stamp),
    current,
    h("div", { class: "panel-gap" }),
    panel("Messages published and fetches per second", `refreshed every ${RATES_EVERY_MS / 1000} s; each figure is the rate over the last minute`,
      chartBox,
      h("div", { class: "legend" },
        h("span", {}, h("span", { class: "swatch s0" }), "published messages/s"),
        h("span", {}, h("span", { class: "swatch s1" }), "fetches/s"))),
    panel("By topic", null, perTopic),
  );
  const tick = async () => {
    let sample;
    try {
      sample = await sampleRates();
    } catch (err) {
      stamp.replaceChildren(h("span", { class: "badge bad" }, errorText(err)));
      return;
    }
    const points = state.rates.points;
    points.push(sample);
    if (points.length > RATES_WINDOW) points.splice(0, points.length - RATES_WINDOW);
    chartBox.replaceChildren(chart(points));
    current.replaceChildren(
      card("Publishing", rate(sample.publish), "messages per second"),
      card("Fetching", rate(sample.fetch), "fetches per second"),
      card("Topics", count(sample.topics.length), "you may read"));
    const busiest = [...sample.topics].sort((a, b) => (b.publishRate + b.fetchRate) - (a.publishRate + a.fetchRate));
    perTopic.replaceChildren(table(
      ["Topic", ["Publish rate", "num"], ["Fetch rate", "num"], ["Messages", "num"], "Last message"],
      busiest.map((s) => h("tr", {},
        h("td", {}, h("a", { href: `#/topic/${encodeURIComponent(s.topic)}` }, s.topic)),
        h("td", { class: "num" }, rate(s.publishRate)),
        h("td", { class: "num" }, rate(s.fetchRate)),
        h("td", { class: "num" }, count(s.messageCount)),
        h("td", {}, s.newestTime ? ago(s.newestTime) : "–"))),
      "No topics."));
    stamp.textContent = `updated ${when(sample.at).slice(11, 19)}`;
  };
  await tick();
  state.timers.push(setInterval(tick, RATES_EVERY_MS));
}

// ---------------------------------------------------------------------------------
// login, navigation

const UNSENDABLE = "This is no token: a token is one line of letters, digits and punctuation.";

/**
 * Whether a browser can send the token in a header: fetch() refuses a header with a
 * control character or one past U+00FF (a pasted zero-width space, a typographic
 * quote), and a token kept that way would fail every request until the tab closes.
 */
function sendable(token) {
  return /^[\x20-\x7e\xa0-\xff]+$/.test(token);
}

function loginPage(message, retry = null) {
  const token = h("input", { type: "password", id: "token", autocomplete: "current-password", required: true });
  show(h("div", { class: "login panel" },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" }, "This server needs a token: the one ", h("code", {}, "tidings auth token"),
      " printed for your principal. It is kept in this tab only."),
    message ? notice("error", message) : null,
    retry ? h("p", {}, h("button", { type: "button", id: "retry-token", onclick: retry }, "Try again")) : null,
    h("form", {
      id: "login-form",
      onsubmit: (event) => {
        event.preventDefault();
        const value = token.value.trim();
        if (!sendable(value)) {
          loginPage(UNSENDABLE);
          return;
        }
        sessionStorage.setItem(TOKEN_KEY, value);
        sessionStorage.removeItem(PRINCIPAL_KEY);
        start();
      },
    }, h("label", { for: "token" }, "Token"), token, h("button", { type: "submit", id: "login" }, "Log in"))));
  token.focus();
}

function renderSession() {
  const who = document.getElementById("who");
  const logout = document.getElementById("logout");
  const me = state.me;
  who.replaceChildren();
  if (me && me.auth && me.name) {
    append(who, ["Signed in as ", h("b", {}, me.name), me.admin ? " (admin)" : ""]);
  } else if (me && !me.auth) {
    append(who, ["No auth file: open to all"]);
  } else if (me && sessionStorage.getItem(PRINCIPAL_KEY) && sessionStorage.getItem(TOKEN_KEY)) {
    append(who, ["Token of ", h("b", {}, sessionStorage.getItem(PRINCIPAL_KEY)), " kept (refused here)"]);
  }
  // A token kept while the server that answered refuses it can be dropped too.
  logout.hidden = !((me && me.auth && me.name) || (sessionStorage.getItem(PRINCIPAL_KEY) && sessionStorage.getItem(TOKEN_KEY)));
  document.getElementById("nav-transactions").hidden = !may.admin();
}

const PAGES = [
  [/^#\/topics$/, "topics", () => topicsPage()],
  [/^#\/topic\/([^/?]+)\/messages(\?.*)?$/, "topics", (m) => browserPage(decodeURIComponent(m[1]))],
  [/^#\/topic\/([^/?]+)$/, "topics", (m) => topicPage(decodeURIComponent(m[1]))],
  [/^#\/groups(\?.*)?$/, "groups", () => groupsPage()],
  [/^#\/queues$/, "queues", () => queuesPage()],
  [/^#\/transactions$/, "transactions", () => transactionsPage()],
  [/^#\/rates$/, "rates", () => ratesPage()],
];

let generation = 0;

function stopTimers() {
  for (const timer of state.timers) clearInterval(timer);
  state.timers = [];
}

async function route() {
  stopTimers();
  if (!state.me || (state.me.auth && !state.me.name)) return;
  const hash = location.hash || "#/topics";
  const found = PAGES.find(([re]) => re.test(hash));
  if (!found) {
    location.hash = "#/topics";
    return;
  }
  const [re, nav, page] = found;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === nav);
  const mine = ++generation;
  main.setAttribute("aria-busy", "true");
  try {
    await page(hash.match(re));
  } catch (err) {
    if (mine === generation && !(err instanceof ApiError && err.status === 401)) {
      show(notice("error", errorText(err)));
    }
  } finally {
    if (mine === generation) {
      main.removeAttribute("aria-busy");
      document.body.dataset.page = nav;
      document.body.dataset.ready = String(mine);
    }
  }
}

async function start() {
  // The page on screen goes (for the login page, say): its refreshes must stop too,
  // or the live rates' next tick, refused, put up the login page again over what the
  // user was typing, every few seconds.
  stopTimers();
  const kept = sessionStorage.getItem(TOKEN_KEY);
  if (kept && !sendable(kept)) {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(PRINCIPAL_KEY);
    state.me = null;
    loginPage(UNSENDABLE);
    return;
  }
  const refused = state.refused;
  state.refused = null;
  try {
    state.me = await get("/v1/whoami");
  } catch (err) {
    show(notice("error", err.status ? `The server did not answer: ${err.message}` : err.message));
    return;
  }
  renderSession();
  if (refused && (!state.me.auth || state.me.name)) {
    // A request was refused for want of a valid token, yet whoami accepts it: more
    // than one server answers at this address, with different auth files (or one
    // not reloaded yet). Loading the page again was refused again, for ever.
    generation += 1; // a page still loading must not cover this
    main.removeAttribute("aria-busy");
    document.body.dataset.ready = String(generation);
    const accepted = state.me.auth
      ? `accepts it for ${state.me.name}`
      : "says it needs no token (it has no auth file)";
    show(
      heading("Token refused", null, refreshButton()),
      notice("error",
        `${refused.method} ${refused.path} was refused: ${refused.message} (401). Yet the server ` +
        `${accepted} when asked who the token belongs to. More than one server seems to ` +
        "answer at this address, with different auth files (one changed and not reloaded, " +
        "or not yet everywhere): have them all use the same auth file, and reload it " +
        "(SIGHUP). Refresh tries again."));
    return;
  }
  const acceptedFor = kept ? sessionStorage.getItem(PRINCIPAL_KEY) : null;
  if (state.me.auth && !state.me.name && acceptedFor) {
    // A server at this address accepted this token earlier in this tab, and the one
    // that answered now does not know it: several servers answer here and their auth
    // files differ (or the principal was removed). Dropping the token logged the user
    // out of the others too: it is kept, to try again or replace.
    loginPage(
      "No principal has this token. That is what the server that answered says, yet a " +
      `server at this address accepted it for ${acceptedFor} earlier in this tab: if ` +
      "several servers answer here, this one's auth file lacks that principal (changed " +
      "and not reloaded, or not yet everywhere). The token is kept for the others: try " +
      "again, log in with another token, or log out.",
      () => start());
    return;
  }
  if (state.me.auth && !state.me.name) {
    // The token this call sent (read before the await): several refused requests of
    // one page each call start(), and the first to get here drops the token.
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(PRINCIPAL_KEY);
    renderSession();
    loginPage(kept ? "No principal has this token." : null);
    return;
  }
  if (state.me.auth) sessionStorage.setItem(PRINCIPAL_KEY, state.me.name);
  route();
}

function setUp() {
  const ns = document.getElementById("namespace");
  ns.value = namespace();
  ns.addEventListener("change", () => {
    const value = ns.value.trim();
    if (!/^[A-Za-z0-9_-]{1,128}$/.test(value)) {
      ns.value = namespace();
      return;
    }
    localStorage.setItem(NAMESPACE_KEY, value);
    if (location.hash.startsWith("#/topic/")) location.hash = "#/topics";
    else route();
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(PRINCIPAL_KEY);
    state.me = null;
    start();
  });
  window.addEventListener("hashchange", () => route());
  start();
}

setUp();

// The padres monitor: the overlay's topology and brokers (those that stopped, too), rates,
// alarms, the chosen broker's connections, durable subscriptions and routing tables, traces and
// history, read from the brokers' REST API (docs/web.md). Cytoscape lays the graph out.
import cytoscape from "./cytoscape.esm.min.mjs";

const POLL_MS = 1000;
// The chosen broker's connections and durable subscriptions cost that broker a journal read
// per durable subscription: asked for every fifth poll (and when the choice changes).
const PANELS_EVERY = 5;
const POINTS = 60;
const ALARMS = 100;
const $ = (id) => document.getElementById(id);
// A broker with accounts: the browser sends the Basic credentials it was asked for to this
// broker only; a token given in the page's address (?access_token=...) goes to every broker.
const TOKEN = new URLSearchParams(location.search).get("access_token");
function api(url, options) {
  if (!TOKEN) return fetch(url, options);
  const address = new URL(url, location.href);
  address.searchParams.set("access_token", TOKEN);
  return fetch(address, options);
}

const cy = cytoscape({
  container: $("topology"),
  style: [
    { selector: "node", style: { label: "data(label)", "font-size": 10, "text-valign": "bottom" } },
    { selector: 'node[kind="broker"]',
      style: { "background-color": "#1f77b4", width: 34, height: 34, "font-size": 12,
               "font-weight": "bold", "text-valign": "center", color: "#fff" } },
    { selector: 'node[kind="client"]', style: { "background-color": "#8c8c8c", width: 12, height: 12 } },
    { selector: 'node[kind="database"]',
      style: { shape: "barrel", "background-color": "#2ca02c", width: 22, height: 22 } },
    { selector: 'edge[kind="link"]', style: { width: 3, "line-color": "#1f77b4" } },
    { selector: 'edge[kind="attach"]', style: { width: 1, "line-color": "#bbb", "line-style": "dashed" } },
    { selector: "node.traced", style: { "background-color": "#d62728" } },
    { selector: "node.down", style: { "background-color": "#bbb", color: "#555" } },
    { selector: "edge.traced", style: { "line-color": "#d62728", width: 5 } },
  ],
  layout: { name: "cose", animate: false },
});

const state = { overlay: null, last: null, signature: "", trace: null, alarms: [], sent: null,
                polls: 0 };
window.monitor = { cy, state };

function elementsOf(overlay) {
  const els = [];
  for (const b of overlay.brokers) els.push({ data: { id: `b:${b.id}`, label: b.id, kind: "broker" } });
  for (const b of overlay.down) {
    els.push({ data: { id: `b:${b.id}`, label: `${b.id} (down)`, kind: "broker" }, classes: "down" });
  }
  for (const l of overlay.links) {
    els.push({ data: { id: `l:${l.source}|${l.target}`, source: `b:${l.source}`,
                       target: `b:${l.target}`, kind: "link" } });
  }
  for (const c of overlay.clients) {
    const kind = c.database ? "database" : "client";
    els.push({ data: { id: `c:${c.name}`, label: c.name.split("@")[0], kind } });
    els.push({ data: { id: `a:${c.name}`, source: `c:${c.name}`, target: `b:${c.broker}`, kind: "attach" } });
  }
  return els;
}

function drawTopology(overlay) {
  const els = elementsOf(overlay);
  const ids = new Set(els.map((e) => e.data.id));
  const down = overlay.down.map((b) => b.id);
  const signature = [...ids].sort().join(",") + "|" + down.join(",");
  if (signature === state.signature) return;
  state.signature = signature;
  for (const e of els.filter((x) => x.data.kind === "broker")) {  // up or down now
    cy.getElementById(e.data.id).data("label", e.data.label).toggleClass("down", e.classes === "down");
  }
  cy.elements().filter((e) => !ids.has(e.id())).remove();
  const nodes = els.filter((e) => !e.data.source && cy.getElementById(e.data.id).empty());
  const edges = els.filter((e) => e.data.source && cy.getElementById(e.data.id).empty());
  cy.add(nodes);
  cy.add(edges);
  cy.layout({ name: "cose", animate: false, randomize: false, nodeRepulsion: () => 8000 }).run();
}

function chart(id, title) {
  return new Chart($(id), {
    type: "line",
    data: { labels: [], datasets: [] },
    options: { animation: false, responsive: true, plugins: { title: { display: true, text: title } },
               scales: { y: { beginAtZero: true } }, elements: { point: { radius: 0 } } },
  });
}
const brokerChart = chart("broker-rates", "per broker (in)");
const linkChart = chart("link-rates", "per link (out, one way)");

function push(chartObj, label, values) {
  const data = chartObj.data;
  data.labels.push(label);
  if (data.labels.length > POINTS) data.labels.shift();
  for (const [name, value] of Object.entries(values)) {
    let set = data.datasets.find((d) => d.label === name);
    if (!set) {
      set = { label: name, data: new Array(data.labels.length - 1).fill(null), borderWidth: 1.5 };
      data.datasets.push(set);
    }
    set.data.push(value);
  }
  for (const set of data.datasets) {
    if (set.data.length < data.labels.length) set.data.push(null);
    while (set.data.length > data.labels.length) set.data.shift();
  }
  chartObj.update();
}

function sum(counts) {
  return Object.values(counts).reduce((total, n) => total + n, 0);
}

function drawRates(overlay) {
  const now = Date.now() / 1000;
  const previous = state.last;
  state.last = { at: now, brokers: Object.fromEntries(overlay.brokers.map((b) => [b.id, b])),
                 down: new Set(overlay.down.map((b) => b.id)) };
  raiseAlarms(overlay, previous);
  if (!previous) return;
  const dt = Math.max(now - previous.at, 0.001);
  const perBroker = {};
  const perLink = {};
  for (const b of overlay.brokers) {
    const before = previous.brokers[b.id];
    if (!before) continue;
    perBroker[b.id] = Math.max(0, (sum(b.publications.in) - sum(before.publications.in)) / dt);
    for (const n of b.neighbours) {
      const was = before.publications.out[n] || 0;
      perLink[`${b.id}→${n}`] = Math.max(0, ((b.publications.out[n] || 0) - was) / dt);
    }
  }
  const label = new Date().toLocaleTimeString();
  push(brokerChart, label, perBroker);
  push(linkChart, label, perLink);
}

function drawSummary(overlay) {
  $("broker-count").textContent = overlay.brokers.length;
  $("down-summary").textContent = overlay.down.length ? ` (${overlay.down.length} down)` : "";
  $("link-count").textContent = overlay.links.length;
  $("client-count").textContent = overlay.clients.filter((c) => !c.database).length;
  $("database-count").textContent = overlay.databases.length;
  const select = $("broker-choice");
  const chosen = select.value || state.servedBy;
  const names = overlay.brokers.map((b) => b.id);
  if ([...select.options].map((o) => o.value).join() !== names.join()) {
    select.replaceChildren(...names.map((n) => new Option(n, n)));
    if (names.includes(chosen)) select.value = chosen;
  }
  for (const span of document.querySelectorAll(".chosen")) span.textContent = select.value;
}

const time = (seconds) => (seconds ? new Date(seconds * 1000).toLocaleTimeString() : "");

function duration(seconds) {
  const s = Math.round(seconds);
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1 << 20)).toFixed(1)} MiB`;
}

function drawBrokers(overlay) {
  const rows = overlay.brokers.map((b) => row([b.id, "up", b.version || "", duration(b.uptime),
    b.clients.length, bytes(b.queued_bytes), b.dropped, b.evicted ?? "", b.rejected ?? ""]));
  for (const b of overlay.down) {
    const tr = row([b.id, `down, last seen ${time(b.last_seen)}`, "", "", "", "", "", "", ""]);
    tr.className = "down";
    rows.push(tr);
  }
  $("broker-rows").querySelector("tbody").replaceChildren(...rows);
}

// Alarms: what got worse since the previous poll (drops, evictions, refusals, brokers down).
function alarm(text, level = "warning") {
  state.alarms.unshift({ at: new Date().toLocaleTimeString(), text, level });
  state.alarms.length = Math.min(state.alarms.length, ALARMS);
  $("alarms").replaceChildren(...state.alarms.map((a) => {
    const li = document.createElement("li");
    li.className = a.level;
    li.textContent = `${a.at} ${a.text}`;
    return li;
  }));
}

function raiseAlarms(overlay, previous) {
  if (!previous) return;
  const COUNTS = [["dropped", "messages dropped for slow clients"], ["evicted", "clients evicted"],
                  ["rejected", "messages refused"]];
  for (const b of overlay.brokers) {
    const before = previous.brokers[b.id];
    if (!before) {
      if (previous.down.has(b.id)) alarm(`${b.id} is up again`, "info");
      continue;
    }
    for (const [key, what] of COUNTS) {
      const more = (b[key] || 0) - (before[key] || 0);
      if (more > 0) alarm(`${b.id}: ${more} ${what}`);
    }
  }
  for (const b of overlay.down) {
    if (!previous.down.has(b.id)) alarm(`${b.id} is down (last seen ${time(b.last_seen)})`);
  }
}

function chosenBase() {
  const id = $("broker-choice").value;
  const broker = state.overlay?.brokers.find((b) => b.id === id);
  return broker && broker.url ? broker.url : "";
}

async function act(button, url, done) {
  button.disabled = true;
  const response = await api(url, { method: "DELETE" });
  if (!response.ok) alarm(await problemText(response));
  await done();
}

async function drawConnections() {
  const base = chosenBase();
  const response = await api(`${base}/api/v1/broker`);
  if (!response.ok) {
    $("connections-summary").textContent = await problemText(response);
    return;
  }
  const info = await response.json();
  const settings = { version: info.version, ...info.settings };
  $("settings").querySelector("tbody").replaceChildren(
    ...Object.entries(settings).map(([k, v]) => row([k, v])));
  const now = Date.now() / 1000;
  const before = state.sent && state.sent.broker === info.id ? state.sent : null;
  state.sent = { broker: info.id, at: now, counts: {} };
  const clients = info.clients.filter((c) => !c.name.startsWith("monitor@"));
  $("connections-summary").textContent =
    `${clients.length} clients, ${info.neighbours.length} neighbours`;
  $("connection-rows").querySelector("tbody").replaceChildren(...clients.map((c) => {
    state.sent.counts[c.hop] = c.sent;
    const was = before ? before.counts[c.hop] : undefined;
    const rate = was === undefined ? "" : ((c.sent - was) / Math.max(now - before.at, 0.001)).toFixed(1);
    const tr = row([c.name, c.address || "in process", time(c.since), rate, bytes(c.queued_bytes),
                    c.dropped, ""]);
    const close = document.createElement("button");
    close.textContent = "Close";
    close.className = "danger";
    close.addEventListener("click", () => {
      if (confirm(`Close the connection of ${c.name}?`)) {
        act(close, `${base}/api/v1/clients/${encodeURIComponent(c.name)}`, drawConnections);
      }
    });
    tr.lastChild.append(close);
    return tr;
  }));
}

async function drawDurables() {
  const base = chosenBase();
  const response = await api(`${base}/api/v1/durables`);
  if (!response.ok) {
    $("durables-summary").textContent = await problemText(response);
    return;
  }
  const durables = await response.json();
  const lag = (d) => Math.max(0, d.next - 1 - d.acked);  // matched, not yet acknowledged
  const waiting = durables.reduce((n, d) => n + lag(d), 0);
  $("durables-summary").textContent = `${durables.length} durable subscriptions, ${waiting} deliveries waiting`;
  $("durable-rows").querySelector("tbody").replaceChildren(...durables.map((d) => {
    const away = d.connected ? "connected" : `away ${duration(d.away || 0)}`;
    const oldest = d.oldest ? duration(Date.now() / 1000 - Date.parse(d.oldest) / 1000) + " ago" : "";
    const tr = row([d.owner, d.name, away, lag(d), bytes(d.queued_bytes), d.acked, oldest, ""]);
    tr.dataset.durable = `${d.owner}/${d.name}`;
    if (!d.connected) tr.children[2].className = "away";
    const drop = document.createElement("button");
    drop.textContent = "Delete";
    drop.className = "danger";
    drop.addEventListener("click", () => {
      if (confirm(`Delete durable subscription ${d.name} of ${d.owner} and what it queued?`)) {
        const path = `${encodeURIComponent(d.owner)}/${encodeURIComponent(d.name)}`;
        act(drop, `${base}/api/v1/durables/${path}`, drawDurables);
      }
    });
    tr.lastChild.append(drop);
    return tr;
  }));
}

async function poll() {
  try {
    const overlay = await (await api("/api/v1/overlay")).json();
    state.overlay = overlay;
    drawTopology(overlay);
    drawSummary(overlay);
    drawBrokers(overlay);
    drawRates(overlay);
    if (state.polls++ % PANELS_EVERY === 0) await Promise.all([drawConnections(), drawDurables()]);
    $("status").textContent = "live";
    $("status").className = "";
  } catch (err) {
    $("status").textContent = `broker unreachable: ${err}`;
    $("status").className = "error";
  }
}

async function problemText(response) {
  try {
    const problem = await response.json();
    return `${problem.title}: ${problem.detail}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

function row(cells, tag = "td", classes = []) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement(tag);
    td.textContent = cell;
    if (classes[tr.children.length]) td.className = classes[tr.children.length];
    tr.append(td);
  }
  return tr;
}

$("routing-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const base = chosenBase();
  const query = new URLSearchParams({ table: $("routing-table").value,
                                      search: $("routing-search").value, page_size: "500" });
  const response = await api(`${base}/api/v1/routing?${query}`);
  const body = $("routing-rows").querySelector("tbody");
  if (!response.ok) {
    $("routing-summary").textContent = await problemText(response);
    body.replaceChildren();
    return;
  }
  const table = await response.json();
  $("routing-summary").textContent = `${table.broker} ${table.table.toUpperCase()}: ${table.total} rows`;
  body.replaceChildren(...table.rows.map((r) => row(routingCells(r), "td", ["nowrap", "filter"])));
});

// A routing row, "ID FILTER from=... to=..." (or "tree=... from=..."), as id, filter, where.
function routingCells(text) {
  const space = text.indexOf(" ");
  const rest = text.slice(space + 1);
  const where = rest.search(/ (tree|from)=/);
  return where < 0 ? [text.slice(0, space), rest, ""]
    : [text.slice(0, space), rest.slice(0, where), rest.slice(where + 1).replaceAll("=", ": ")];
}

async function startTrace(body) {
  $("trace-hops").replaceChildren();
  const response = await api("/api/v1/traces", {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  if (!response.ok) {
    $("trace-summary").textContent = await problemText(response);
    return;
  }
  const trace = await response.json();
  $("trace-summary").textContent = trace.filter
    ? `waiting for a publication matching ${trace.filter}` : "published: following it";
  cy.elements().removeClass("traced");
  state.trace = trace.id;  // a newer trace stops this one's polling
  const deadline = Date.now() + trace.expires_in * 1000;
  while (Date.now() < deadline && state.trace === trace.id) {
    await new Promise((resolve) => setTimeout(resolve, 300));
    const seen = await (await api(`/api/v1/traces/${trace.id}`)).json();
    if (state.trace === trace.id) drawTrace(seen);
  }
}

$("trace-form").addEventListener("submit", (event) => {
  event.preventDefault();
  startTrace({ filter: $("trace-filter").value });
});

$("trace-publish-form").addEventListener("submit", (event) => {
  event.preventDefault();
  startTrace({ publication: $("trace-publication").value, client: $("trace-client").value });
});

function drawTrace(trace) {
  if (!trace.publication) return;
  $("trace-summary").textContent =
    `publication ${trace.publication} from ${trace.publisher}: ${trace.hops.length} brokers`;
  $("trace-hops").replaceChildren(...trace.hops.map((h) => {
    const li = document.createElement("li");
    const matched = h.matched.length ? h.matched.map((m) => `${m.subscription} (${m.client})`).join(", ") : "none";
    li.textContent = `${h.broker}: from ${h.from} → ${h.to.length ? h.to.join(", ") : "no broker"}; matched ${matched}`;
    return li;
  }));
  for (const h of trace.hops) {
    cy.getElementById(`b:${h.broker}`).addClass("traced");
    for (const to of h.to) {
      cy.getElementById(`l:${h.broker}|${to}`).addClass("traced");
      cy.getElementById(`l:${to}|${h.broker}`).addClass("traced");
    }
  }
}

$("history-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const started = performance.now();
  const query = new URLSearchParams({ filter: $("history-filter").value,
                                      from: $("history-from").value, to: $("history-to").value });
  const head = $("history-rows").querySelector("thead");
  const body = $("history-rows").querySelector("tbody");
  body.replaceChildren();
  head.replaceChildren(row(["time", "publisher", "class", "attributes"], "th"));
  $("history-summary").textContent = "running…";
  const response = await api(`/api/v1/history/stream?${query}`);
  if (!response.ok) {
    $("history-summary").textContent = await problemText(response);
    return;
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let count = 0;
  const show = (line) => {
    const item = JSON.parse(line);
    if (item.done) {
      const took = ((performance.now() - started) / 1000).toFixed(3);
      const failed = item.done.failed.length ? `; failed: ${item.done.failed.join("; ")}` : "";
      $("history-summary").textContent =
        `${count} rows in ${took} s from ${item.done.databases.join(", ") || "no database"}${failed}`;
    } else if (item.error) {
      $("history-summary").textContent = item.error;
    } else {
      count += 1;
      const { class: kind, ...rest } = item.attributes;
      const shown = Object.entries(rest).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join("  ");
      const when = item.timestamp.replace("T", " ").replace(/(\.\d{3})\d*/, "$1").replace("+00:00", "Z");
      body.append(row([when, item.publisher, kind, shown], "td", ["nowrap", "nowrap"]));
      $("history-summary").textContent = `${count} rows…`;
    }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const lines = buffer.split("\n");
    buffer = lines.pop();
    lines.filter((l) => l.trim()).forEach(show);
  }
  if (buffer.trim()) show(buffer);
});

api("/api/v1/broker").then((r) => r.json()).then((b) => {
  $("served-by").textContent = `served by ${b.id}`;
  state.servedBy = b.id;
});
$("broker-choice").addEventListener("change", () => {
  for (const span of document.querySelectorAll(".chosen")) span.textContent = $("broker-choice").value;
  drawConnections();
  drawDurables();
});
poll();
setInterval(poll, POLL_MS);

// cnimesh dashboard: hash-routed pages drawn from /api/* (the CLI's own `-o json` values).
// Bundled with Cytoscape.js and its dagre layout at build time (cli/build.rs); nothing from elsewhere.
import cytoscape from "cytoscape";
import dagre from "cytoscape-dagre";

cytoscape.use(dagre);

const main = document.getElementById("main");
const freshness = document.getElementById("freshness");
const errors = document.getElementById("errors");
let meta = { interval_seconds: 5 };
let timer = null;
let observed = null; // unix seconds of the data on screen
let tapAbort = null;

// ---------- helpers ----------
function el(tag, attrs = {}, ...children) {
  const svg = ["svg", "g", "line", "rect", "text", "title", "polyline", "path", "marker", "defs", "a"].includes(tag) && attrs.svg !== false;
  const node = svg && (tag !== "a" || attrs.svgLink) ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "svg" || k === "svgLink" || v === undefined || v === null) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}
const h = (tag, attrs, ...c) => el(tag, { ...attrs, svg: false }, ...c);
const pct = (v, d = 2) => (v === null || v === undefined ? "-" : (v * 100).toFixed(d) + "%");
const ms = (v) => (v === null || v === undefined ? "-" : v < 10 ? v.toFixed(2) + "ms" : v.toFixed(0) + "ms");
const rps = (v) => (v === null || v === undefined ? "-" : v.toFixed(1) + "rps");
const us = (v) => (v >= 1000 ? (v / 1000).toFixed(1) + "ms" : v + "µs");
const q = (o) => Object.entries(o).filter(([, v]) => v !== undefined && v !== null && v !== "").map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");

class ApiError extends Error {
  constructor(body) { super(body.error); this.hint = body.hint; }
}

async function api(path, params = {}) {
  let response;
  try {
    response = await fetch(`/api/${path}${Object.keys(params).length ? "?" + q(params) : ""}`, { headers: { accept: "application/json" } });
  } catch (e) {
    throw new ApiError({ error: `the dashboard did not answer (${e.message})`, hint: "is `cnimesh dashboard` still running?" });
  }
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new ApiError(body);
  return body;
}

function showError(error, where = errors) {
  const box = h("div", { class: "error" }, h("strong", {}, "Error: "), error.message);
  if (error.hint) box.append(h("div", { class: "hint" }, "hint: ", error.hint));
  where.append(box);
}

// Marks what is on screen stale when it is older than two sampler periods (or the fetch failed).
function tickFreshness() {
  if (observed === null) { freshness.textContent = ""; freshness.className = ""; return; }
  const age = Date.now() / 1000 - observed;
  const stale = age > 2 * meta.interval_seconds;
  freshness.className = stale ? "stale" : "";
  freshness.textContent = `${stale ? "STALE: " : ""}observed ${new Date(observed * 1000).toLocaleTimeString()} (${Math.max(0, age).toFixed(0)}s ago; proxies read every ${meta.interval_seconds}s)`;
  main.classList.toggle("stale-data", stale);
  document.body.dataset.stale = stale;
}

function envelope(env) {
  observed = env.stale && env.observed_at_unix ? Math.min(env.observed_at_unix, Date.now() / 1000 - 3 * meta.interval_seconds) : env.observed_at_unix;
  if (env.error) showError(new ApiError(env.error));
  for (const p of env.problems || []) showError(new ApiError(p));
  tickFreshness();
  return env.value;
}

// Sort state per table, kept across the refreshes that redraw it.
const sortState = {};
function sortable(table, rows, columns, render) {
  const name = table.getAttribute("aria-label");
  const state = (sortState[name] ||= { key: null, dir: 1 });
  let key = state.key, dir = state.dir;
  const thead = h("thead");
  const tr = h("tr");
  for (const c of columns) {
    const th = h("th", { scope: "col", class: c.num ? "num" : "" });
    if (c.sort) {
      th.setAttribute("aria-sort", "none");
      th.append(h("button", { type: "button", "data-sort": c.key, onclick: () => {
        dir = key === c.key ? -dir : c.num ? -1 : 1; key = c.key;
        Object.assign(state, { key, dir });
        for (const other of tr.children) if (other.hasAttribute("aria-sort")) other.setAttribute("aria-sort", "none");
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        draw();
      } }, c.label));
      if (key === c.key) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    } else th.textContent = c.label;
    tr.append(th);
  }
  thead.append(tr);
  const tbody = h("tbody");
  table.append(thead, tbody);
  function draw() {
    const sorted = [...rows];
    if (key) { const c = columns.find((x) => x.key === key); sorted.sort((a, b) => { const x = c.sort(a), y = c.sort(b); return (x > y ? 1 : x < y ? -1 : 0) * dir; }); }
    tbody.replaceChildren(...sorted.map(render));
  }
  draw();
}

function spark(points, pick) {
  const values = (points || []).map(pick).filter((v) => v !== null && v !== undefined);
  const svg = el("svg", { class: "spark", width: 100, height: 22, viewBox: "0 0 100 22", role: "img", "aria-label": values.length ? `last ${values.length} readings, ${values[values.length - 1].toFixed(1)} now` : "no history yet" });
  if (values.length > 1) {
    const max = Math.max(...values, 1e-9);
    svg.append(el("polyline", { points: values.map((v, i) => `${(i * 100) / (values.length - 1)},${21 - (v / max) * 20}`).join(" ") }));
  }
  return svg;
}

// A padlock drawn in SVG (emoji fonts are not everywhere): `x, y` is its top-left corner.
const lockPath = (x, y) => `M${x + 2} ${y + 6}v-2a3 3 0 0 1 6 0v2 M${x} ${y + 6}h10v7h-10z`;
function lockIcon() {
  return el("svg", { class: "lock", width: 12, height: 14, viewBox: "-1 0 12 14", "aria-hidden": "true" }, el("path", { d: lockPath(0, 0) }));
}

const workloadHref = (ns, kindName) => `#/workload/${encodeURIComponent(ns)}/${kindName.split("/").map(encodeURIComponent).join("/")}`;

// ---------- pages ----------
async function topology() {
  const nsParam = meta.namespace ? { namespace: meta.namespace } : {};
  const edges = envelope(await api("edges", { resource: "deploy", ...nsParam }));
  const nodes = new Map();
  const node = (ns, name) => { const id = `${ns}/${name}`; if (!nodes.has(id)) nodes.set(id, { id, ns, name, in: 0, out: [] }); return nodes.get(id); };
  for (const e of edges) { const s = node(e.src_namespace, e.src), d = node(e.dst_namespace, e.dst); s.out.push(d); d.in++; }
  // Columns: a node sits one right of its furthest caller (cycles stop at the node count).
  const col = new Map([...nodes.values()].map((n) => [n.id, 0]));
  for (let i = 0; i < nodes.size; i++) for (const n of nodes.values()) for (const d of n.out) if (d !== n) col.set(d.id, Math.max(col.get(d.id), Math.min(col.get(n.id) + 1, nodes.size)));
  const columns = [];
  for (const n of nodes.values()) (columns[col.get(n.id)] ||= []).push(n);
  const W = 190, H = 36, GX = 430, GY = 110;
  const pos = new Map();
  columns.forEach((list, c) => list.forEach((n, r) => pos.set(n.id, { x: 20 + c * GX, y: 30 + r * GY })));
  const width = 40 + (columns.length - 1) * GX + W, height = 40 + Math.max(1, ...columns.map((l) => l.length)) * GY;
  const labels = [];
  const svg = el("svg", { class: "topology", width, height, viewBox: `0 0 ${width} ${height}`, role: "group", "aria-label": "Topology: workloads and who calls whom" },
    el("defs", {}, el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, el("path", { d: "M 0 0 L 10 5 L 0 10 z" }))));
  // Egress edges carry their own counts: there is no workload to `stat --to`.
  const rates = await Promise.all(edges.map((e) => e.egress ? null : api("stat", { resource: e.src, namespace: e.src_namespace, to: e.dst, to_namespace: e.dst_namespace || e.src_namespace }).then((r) => r.value[0], () => null)));
  edges.forEach((e, i) => {
    const a = pos.get(`${e.src_namespace}/${e.src}`), b = pos.get(`${e.dst_namespace}/${e.dst}`);
    const r = rates[i];
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    const label = e.egress ? `egress · ${Math.round(e.requests)} req · ${Math.round(e.connections)} conn · ${Math.round(e.egress.denied)} denied`
      : `${e.mtls ? "mTLS" : "⚠ plaintext"} · ${r ? rps(r.rps) : "-"} · ${r ? pct(r.success_rate, 1) : "-"}`;
    // Labels sit a third of the way along (crossing edges meet in the middle), above the lines.
    const t = y1 === y2 ? 0.5 : 0.3, lx = x1 + (x2 - x1) * t, ly = y1 + (y2 - y1) * t - 8;
    const kind = e.egress ? `egress${e.egress.denied ? " denied" : ""}` : e.mtls ? "mtls" : "plaintext";
    const title = e.egress ? `${e.src} → ${e.dst}: egress through EgressNetwork ${e.egress.network}, ${Math.round(e.egress.denied)} refused`
      : `${e.src} → ${e.dst}: ${e.mtls ? "mTLS" : "plaintext (not encrypted)"}, client ${e.client_ids.join(",") || "-"}, server ${e.server_ids.join(",") || "-"}`;
    const g = el("g", { class: `edge ${kind}`, "data-src": e.src, "data-dst": e.dst, "data-mtls": e.mtls, "data-rps": r ? r.rps : "", "data-denied": e.egress ? e.egress.denied : undefined },
      el("title", { text: title }),
      el("line", { x1, y1, x2, y2, "marker-end": "url(#arrow)" }));
    const text = el("text", { x: lx, y: ly, "text-anchor": "middle", text: label });
    labels.push([g, text, e.mtls ? el("path", { class: "lock", d: lockPath(lx - label.length * 3.4 - 16, ly - 11) }) : null]);
    svg.append(g);
  });
  for (const n of nodes.values()) {
    const p = pos.get(n.id);
    const egress = edges.find((e) => e.egress && e.dst === n.name && e.dst_namespace === n.ns);
    if (egress) {
      // A hostname outside the mesh, not a workload: no page of its own.
      svg.append(el("g", { class: "node egress", "data-node": n.name, "data-egress-network": egress.egress.network },
        el("title", { text: `${n.name} (outside the mesh, EgressNetwork ${egress.egress.network})` }),
        el("rect", { x: p.x, y: p.y, width: W, height: H }),
        el("text", { x: p.x + 10, y: p.y + 23, text: n.name })));
      continue;
    }
    const meshed = edges.some((e) => (e.src === n.name && e.src_namespace === n.ns) || (e.dst === n.name && e.server_ids.length));
    const link = el("a", { svgLink: true, href: workloadHref(n.ns || "default", n.name), class: `node ${meshed ? "meshed" : "unmeshed"}`, "data-node": n.name },
      el("title", { text: `${n.ns}/${n.name}${meshed ? "" : " (not meshed)"}` }),
      el("rect", { x: p.x, y: p.y, width: W, height: H }),
      el("text", { x: p.x + 10, y: p.y + 23, text: n.name }));
    svg.append(link);
  }
  // Each edge's label and lock go last, over lines and boxes (they stay in the edge's group).
  for (const [g, text, lock] of labels) { g.append(text); if (lock) g.append(lock); svg.append(g); }
  main.replaceChildren(h("h1", {}, "Topology"),
    edges.length ? svg : h("p", {}, "No edges yet: no meshed proxy has seen traffic."),
    h("p", { class: "muted" }, "Solid green with a lock: mTLS. Dashed red: plaintext. Dotted grey to a rounded box: egress by hostname (outside the mesh). Click a workload for its details."));
}

async function workloads() {
  const nsParam = meta.namespace ? { namespace: meta.namespace } : {};
  const [stat, history] = await Promise.all([api("stat", { resource: "deploy", ...nsParam }), api("history")]);
  const rows = envelope(stat);
  const hist = history.value;
  const columns = [
    { key: "ns", label: "Namespace", sort: (r) => r.namespace },
    { key: "name", label: "Workload", sort: (r) => r.name },
    { key: "meshed", label: "Meshed", num: true, sort: (r) => r.meshed_pods / Math.max(1, r.pods) },
    { key: "success", label: "Success", num: true, sort: (r) => r.success_rate ?? -1 },
    { key: "rps", label: "RPS", num: true, sort: (r) => r.rps },
    { key: "p50", label: "P50", num: true, sort: (r) => r.latency_ms?.p50 ?? -1 },
    { key: "p95", label: "P95", num: true, sort: (r) => r.latency_ms?.p95 ?? -1 },
    { key: "p99", label: "P99", num: true, sort: (r) => r.latency_ms?.p99 ?? -1 },
    { key: "tcp", label: "TCP conns", num: true, sort: (r) => r.tcp_connections },
    { key: "mtls", label: "mTLS", num: true, sort: (r) => r.mtls_share ?? -1 },
    { key: "trend", label: "RPS, last 10 min" },
  ];
  const table = h("table", { "aria-label": "Workloads' golden metrics" });
  sortable(table, rows, columns, (r) => h("tr", { "data-workload": `${r.namespace}/${r.kind}/${r.name}` },
    h("td", {}, r.namespace),
    h("td", {}, h("a", { href: workloadHref(r.namespace, `${r.kind}/${r.name}`) }, `${r.kind}/${r.name}`)),
    h("td", { class: "num" }, `${r.meshed_pods}/${r.pods}`),
    h("td", { class: "num", "data-col": "success" }, pct(r.success_rate)),
    h("td", { class: "num", "data-col": "rps" }, rps(r.rps)),
    h("td", { class: "num" }, ms(r.latency_ms?.p50)),
    h("td", { class: "num" }, ms(r.latency_ms?.p95)),
    h("td", { class: "num" }, ms(r.latency_ms?.p99)),
    h("td", { class: "num" }, Math.round(r.tcp_connections)),
    h("td", { class: "num" }, pct(r.mtls_share, 0)),
    h("td", {}, spark(hist[`${r.namespace}/${r.kind}/${r.name}`], (p) => p.rps))));
  main.replaceChildren(h("h1", {}, "Workloads"), rows.length ? table : h("p", {}, "No workloads found."));
}

const sum = (samples, name, pred = () => true) => samples.filter((s) => s.name === name && pred(s.labels)).reduce((a, s) => a + s.value, 0);
function groupBy(samples, names, keyOf) {
  const out = new Map();
  for (const s of samples) if (names.includes(s.name)) { const k = keyOf(s.labels); const e = out.get(k) || {}; e[s.name] = (e[s.name] || 0) + s.value; out.set(k, e); }
  return out;
}

async function workload(ns, kind, name) {
  const resource = `${kind}/${name}`;
  const [stat, edges, pods] = await Promise.all([
    api("stat", { resource, namespace: ns }),
    api("edges", { resource: "deploy" }),
    api("pods", { resource, namespace: ns }),
  ]);
  const row = envelope(stat)[0];
  const page = [h("h1", {}, `${ns}/${resource}`)];
  if (row) page.push(h("div", { class: "cards" }, ...[["Success", pct(row.success_rate)], ["RPS", rps(row.rps)], ["P50", ms(row.latency_ms?.p50)], ["P99", ms(row.latency_ms?.p99)], ["TCP connections", Math.round(row.tcp_connections)], ["Meshed pods", `${row.meshed_pods}/${row.pods}`], ["mTLS", pct(row.mtls_share, 0)]]
    .map(([l, v]) => h("div", { class: "card" }, h("div", { class: "label" }, l), h("div", { class: "value" }, v)))));
  const edgeTable = (list, other) => list.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["Workload", "Client identity", "Server identity", "Security", "Requests"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...list.map((e) => h("tr", { "data-edge": `${e.src}>${e.dst}` }, h("td", {}, h("a", { href: workloadHref(other(e)[0] || ns, other(e)[1]) }, other(e)[1])), h("td", {}, e.client_ids.join(", ") || "-"), h("td", {}, e.server_ids.join(", ") || "-"),
      h("td", { class: e.mtls ? "ok" : "bad" }, e.mtls ? [lockIcon(), " mTLS"] : "⚠ plaintext"), h("td", { class: "num" }, Math.round(e.requests)))))) : h("p", { class: "muted" }, "None seen.");
  const all = edges.value;
  page.push(h("h2", {}, "Inbound"), edgeTable(all.filter((e) => e.dst === resource && (e.dst_namespace || ns) === ns), (e) => [e.src_namespace, e.src]));
  page.push(h("h2", {}, "Outbound"), edgeTable(all.filter((e) => e.src === resource && e.src_namespace === ns && !e.egress), (e) => [e.dst_namespace, e.dst]));
  // Egress by hostname (the same edges: requests, connections and refusals since the proxies started).
  const egress = all.filter((e) => e.src === resource && e.src_namespace === ns && e.egress);
  page.push(h("section", { "aria-label": "Egress" }, h("h2", {}, "Egress"), egress.length ? h("table", { "aria-label": "Egress by hostname" },
    h("thead", {}, h("tr", {}, ...["Hostname", "EgressNetwork", "Requests", "Connections", "Denied"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...egress.map((e) => h("tr", { "data-egress": e.dst.replace(/^egress\//, ""), "data-denied": e.egress.denied },
      h("td", {}, e.dst.replace(/^egress\//, "")), h("td", {}, e.egress.network), h("td", { class: "num" }, Math.round(e.requests)),
      h("td", { class: "num" }, Math.round(e.connections)), h("td", { class: e.egress.denied ? "num bad" : "num" }, Math.round(e.egress.denied)))))) : h("p", { class: "muted" }, "No egress seen by hostname (an EgressNetwork makes the proxies see it).")));
  const routes = h("section", { "aria-label": "Routes" }, h("h2", {}, "Routes"));
  const authz = h("section", { id: "authorization", "aria-label": "Authorization" }, h("h2", {}, "Authorization"));
  const podsSection = h("section", { "aria-label": "Pods" }, h("h2", {}, "Pods and proxies"));
  page.push(routes, authz, podsSection);

  const meshed = pods.value.filter((p) => p.meshed);
  const metrics = await Promise.all(meshed.map((p) => api("diagnostics/metrics", { pod: p.name, namespace: p.namespace }).then((r) => r.value, (e) => e)));
  const identities = await Promise.all(meshed.map((p) => api("diagnostics/identity", { pod: p.name, namespace: p.namespace }).then((r) => r.value, (e) => e)));
  const samples = metrics.filter((m) => Array.isArray(m)).flat();

  // Routes: per route and backend, the requests sent and the share of the route's traffic.
  const byBackend = groupBy(samples, ["outbound_http_route_backend_requests_total"], (l) => `${l.parent_name || "-"}|${l.route_name || "default"}|${l.backend_name || "-"}`);
  const retries = groupBy(samples, ["outbound_http_route_retry_requests_total", "outbound_http_route_retry_overflow_total"], (l) => `${l.parent_name || "-"}|${l.route_name || "default"}`);
  if (byBackend.size) {
    const routeTotals = new Map();
    for (const [k, v] of byBackend) { const r = k.split("|").slice(0, 2).join("|"); routeTotals.set(r, (routeTotals.get(r) || 0) + v.outbound_http_route_backend_requests_total); }
    routes.append(h("table", { "aria-label": "Routes by backend" }, h("thead", {}, h("tr", {}, ...["Service", "Route", "Backend", "Requests", "Share", "Retries", "Retry budget overflows"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, ...[...byBackend].map(([k, v]) => { const [parent, route, backend] = k.split("|"); const rk = `${parent}|${route}`; const n = v.outbound_http_route_backend_requests_total; const r = retries.get(rk) || {};
        return h("tr", {}, h("td", {}, parent), h("td", {}, route), h("td", {}, backend), h("td", { class: "num" }, n), h("td", { class: "num" }, pct(n / Math.max(1, routeTotals.get(rk)), 1)),
          h("td", { class: "num" }, r.outbound_http_route_retry_requests_total || 0), h("td", { class: "num" }, r.outbound_http_route_retry_overflow_total || 0)); }))));
  } else routes.append(h("p", { class: "muted" }, "No route traffic sent by this workload's proxies."));

  // Authorization: the proxies' decisions by policy, and responses by client identity.
  // A row admitted only by audit mode is a would-be denial; rate-limited requests (429) per Server.
  const decisions = groupBy(samples, ["inbound_http_authz_allow_total", "inbound_http_authz_deny_total", "inbound_tcp_authz_allow_total", "inbound_tcp_authz_deny_total"], (l) => `${l.srv_kind || "-"}/${l.srv_name || "-"}|${l.authz_name || (l.authz_kind ? l.authz_kind : "-")}|${l.route_name || "-"}|${l.authz_kind === "audit" ? "audit" : ""}`);
  const limited = groupBy(samples, ["inbound_http_local_ratelimit_total"], (l) => `${l.srv_kind || "-"}/${l.srv_name || "-"}`);
  const byClient = groupBy(samples.filter((s) => s.labels.direction === "inbound"), ["response_total"], (l) => `${l.client_id || (l.tls === "true" ? "(no identity)" : "(plaintext)")}|${l.status_code === "403" ? "denied" : l.status_code === "429" ? "limited" : "allowed"}`);
  if (decisions.size) authz.append(h("table", { "aria-label": "Decisions by policy" }, h("thead", {}, h("tr", {}, ...["Server", "Authorization", "Route", "Allowed", "Would-be denials (audit)", "Denied", "Rate limited (429)"].map((t) => h("th", { scope: "col" }, t)))),
    // A Server's 429s are counted per Server, not per authorization: shown once, on its first row.
    h("tbody", {}, ...[...decisions].map(([k, v], i, all) => { const [srv, az, route, audit] = k.split("|"); const firstOfServer = all.findIndex(([o]) => o.split("|")[0] === srv) === i; const denied = (v.inbound_http_authz_deny_total || 0) + (v.inbound_tcp_authz_deny_total || 0);
      const allowed = (v.inbound_http_authz_allow_total || 0) + (v.inbound_tcp_authz_allow_total || 0); const wouldBe = audit ? allowed : 0; const rl = firstOfServer ? (limited.get(srv) || {}).inbound_http_local_ratelimit_total || 0 : 0;
      return h("tr", { "data-denied": denied, "data-would-be-denied": wouldBe }, h("td", {}, srv), h("td", {}, az), h("td", {}, route), h("td", { class: "num" }, allowed - wouldBe), h("td", { class: wouldBe ? "num bad" : "num" }, wouldBe), h("td", { class: denied ? "num bad" : "num" }, denied), h("td", { class: rl ? "num bad" : "num" }, firstOfServer ? rl : "")); }))));
  const clients = new Map();
  for (const [k, v] of byClient) { const [id, verdict] = k.split("|"); const c = clients.get(id) || { allowed: 0, denied: 0, limited: 0 }; c[verdict] += v.response_total; clients.set(id, c); }
  if (clients.size) authz.append(h("table", { "aria-label": "Requests by client identity" }, h("thead", {}, h("tr", {}, ...["Client identity", "Allowed", "Denied (403)", "Rate limited (429)"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...[...clients].map(([id, c]) => h("tr", { "data-client": id, "data-denied": c.denied }, h("td", {}, id), h("td", { class: "num" }, c.allowed), h("td", { class: c.denied ? "num bad" : "num" }, c.denied), h("td", { class: c.limited ? "num bad" : "num" }, c.limited))))));
  if (!decisions.size && !clients.size) authz.append(h("p", { class: "muted" }, "No inbound decisions recorded."));
  if (meta.mode === "cluster") {
    try {
      const report = (await api("authz", { resource, namespace: ns })).value;
      authz.append(h("details", {}, h("summary", {}, "Policies that apply (cnimesh authz)"), h("pre", {}, JSON.stringify(report, null, 2))));
    } catch (e) { showError(e, authz); }
  }

  // Pods: proxy health (its admin pages answer) and certificate expiry.
  const expiry = (id) => { const t = id?.certificate?.not_after_unix; if (!t) return "-"; const s = id.certificate.expires_in_seconds;
    return `${new Date(t * 1000).toISOString().replace(".000", "")}${s !== undefined ? ` (in ${s > 172800 ? Math.round(s / 86400) + "d" : s > 7200 ? Math.round(s / 3600) + "h" : Math.round(s / 60) + "m"})` : ""}`; };
  podsSection.append(h("table", { "aria-label": "Pods" }, h("thead", {}, h("tr", {}, ...["Pod", "IP", "Meshed", "Proxy", "Identity", "Certificate expires"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...pods.value.map((p) => { const i = meshed.indexOf(p); const m = i >= 0 ? metrics[i] : null, id = i >= 0 ? identities[i] : null; const healthy = i >= 0 && Array.isArray(m) && !(id instanceof Error);
      return h("tr", {}, h("td", {}, p.name), h("td", {}, p.ip || "-"), h("td", {}, p.meshed ? "yes" : "no"),
        h("td", { class: i < 0 ? "muted" : healthy ? "ok" : "bad", title: m instanceof Error ? `${m.message}${m.hint ? " — hint: " + m.hint : ""}` : "" }, i < 0 ? "-" : healthy ? "healthy" : `unreachable: ${(m instanceof Error ? m : id).message}`),
        h("td", {}, id && !(id instanceof Error) ? id.name || id.identity || "-" : "-"), h("td", {}, id && !(id instanceof Error) ? expiry(id) : "-")); }))));
  for (const m of [...metrics, ...identities]) if (m instanceof Error) showError(m, podsSection);
  // Drawn once complete: a refresh never shows the sections empty while the proxies are asked.
  main.replaceChildren(...page);
}

function tap() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const field = (name, label, value = "") => h("label", {}, label, h("input", { name, value: params.get(name) ?? value }));
  const form = h("form", { class: "tap", "aria-label": "Tap filters" },
    field("resource", "Resource", "deploy"), field("namespace", "Namespace", meta.namespace || ""), field("to", "To resource"), field("path", "Path prefix"), field("method", "Method"), field("authority", "Authority"), field("scheme", "Scheme"), field("max_rps", "Max RPS", "100"),
    h("button", { type: "submit", class: "primary", id: "tap-start" }, "Start"), h("button", { type: "button", id: "tap-stop", disabled: "" }, "Stop"));
  const status = h("p", { role: "status", id: "tap-status" }, "Not tapping.");
  const topBody = h("tbody"), linesBody = h("tbody");
  const topTable = h("table", { "aria-label": "Requests aggregated like cnimesh top" }, h("thead", {}, h("tr", {}, ...["Source", "Destination", "Method", "Path", "Count", "Best", "Worst", "Last", "Success"].map((t) => h("th", { scope: "col" }, t)))), topBody);
  const linesTable = h("table", { "aria-label": "Live requests", id: "tap-lines" }, h("thead", {}, h("tr", {}, ...["Time", "Pod", "Event", "Method / status", "Path", "Client identity"].map((t) => h("th", { scope: "col" }, t)))), linesBody);
  const local = h("div");
  main.replaceChildren(h("h1", {}, "Live tap"), form, status, local, h("h2", {}, "Top"), topTable, h("h2", {}, "Requests"), linesTable);
  const stop = () => { if (tapAbort) tapAbort.abort(); tapAbort = null; form.querySelector("#tap-start").disabled = false; form.querySelector("#tap-stop").disabled = true; };
  form.querySelector("#tap-stop").addEventListener("click", () => { stop(); status.textContent = "Stopped."; });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    stop(); local.replaceChildren(); linesBody.replaceChildren(); topBody.replaceChildren();
    const filters = Object.fromEntries(new FormData(form));
    tapAbort = new AbortController();
    form.querySelector("#tap-start").disabled = true; form.querySelector("#tap-stop").disabled = false;
    status.textContent = "Tapping…";
    let seen = 0;
    try {
      const response = await fetch(`/api/tap?${q(filters)}`, { signal: tapAbort.signal });
      if (!response.ok) throw new ApiError(await response.json());
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl); buffer = buffer.slice(nl + 1);
          if (!line.trim()) continue;
          const msg = JSON.parse(line);
          if (msg.tap) { seen++; status.textContent = `Tapping: ${seen} events.`; linesBody.prepend(tapRow(msg.tap)); while (linesBody.children.length > 200) linesBody.lastChild.remove(); }
          else if (msg.top) topBody.replaceChildren(...msg.top.rows.map((r) => h("tr", {}, h("td", {}, r.source), h("td", {}, r.destination), h("td", {}, r.method), h("td", {}, r.path), h("td", { class: "num" }, r.count), h("td", { class: "num" }, us(r.best_us)), h("td", { class: "num" }, us(r.worst_us)), h("td", { class: "num" }, us(r.last_us)), h("td", { class: "num" }, pct(r.successes / r.count)))));
          else if (msg.error) showError(new ApiError({ error: msg.error }), local);
          else if (msg.end) status.textContent = `The tap ended (${seen} events).`;
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") { showError(e, local); status.textContent = "The tap failed."; }
    }
    stop();
  });
}

function tapRow(t) {
  const at = new Date().toLocaleTimeString();
  const ev = t.type;
  const what = ev === "requestInit" ? t.method : ev === "responseInit" ? t.httpStatus : ev === "responseEnd" ? `${t.responseBytes ?? ""}B` : t.message || "";
  return h("tr", { "data-type": ev, class: ev === "error" ? "bad" : "" }, h("td", {}, at), h("td", {}, `${t.namespace}/${t.pod}`), h("td", {}, ev), h("td", {}, what), h("td", {}, t.path || ""), h("td", {}, t.sourceMeta?.client_id || "-"));
}

async function check() {
  const report = envelope(await api("check")).checks;
  const icon = { ok: "√", warn: "‼", fail: "×", skip: "-" };
  main.replaceChildren(h("h1", {}, "Check"), h("ul", { class: "checks" }, ...report.map((c) => h("li", { "data-status": c.status },
    h("span", { class: c.status === "skip" ? "skip-status" : c.status, "aria-label": c.status }, icon[c.status], " "), h("strong", {}, c.category), ": ", c.name, " — ", c.message,
    c.details?.length ? h("div", { class: "details" }, c.details.join("; ")) : null, c.hint ? h("div", { class: "hint" }, "hint: ", c.hint) : null))));
}

// ---------- routing ----------
const pages = { topology, workloads, tap, check };
async function route(refresh = false) {
  const hash = location.hash.replace(/^#\/?/, "").split("?")[0] || "topology";
  const parts = hash.split("/").map(decodeURIComponent);
  const name = parts[0];
  for (const a of document.querySelectorAll("header nav a")) a.toggleAttribute("aria-current", a.dataset.page === name) && a.setAttribute("aria-current", "page");
  if (!refresh) { if (tapAbort) tapAbort.abort(); tapAbort = null; observed = null; }
  clearTimeout(timer);
  errors.replaceChildren();
  // A refresh redraws the page: the keyboard's place is kept (same sort button, same node).
  const focused = document.activeElement?.dataset || {};
  const focusSelector = focused.sort ? `button[data-sort="${focused.sort}"]` : focused.node ? `a[data-node="${focused.node}"]` : null;
  try {
    if (name === "workload" && parts.length >= 4) await workload(parts[1], parts[2], parts.slice(3).join("/"));
    else if (pages[name]) await pages[name]();
    else main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/topology" }, "Back to the topology")));
  } catch (e) {
    showError(e);
    tickFreshness();
    if (!refresh) main.replaceChildren(h("h1", {}, name[0].toUpperCase() + name.slice(1)));
  }
  if (refresh && focusSelector) document.querySelector(focusSelector)?.focus();
  document.body.dataset.page = name;
  document.body.dataset.loaded = Date.now();
  // Pages refresh every sampler period; the tap streams instead, the check is run on demand.
  if (name !== "tap" && name !== "check") timer = setTimeout(() => route(true), meta.interval_seconds * 1000);
}

window.addEventListener("hashchange", () => { route(); main.focus(); });
setInterval(tickFreshness, 1000);
api("meta").then((m) => { meta = m; document.getElementById("mode").textContent = m.mode === "local" ? `local mode: ${m.local}` : `cluster${m.namespace ? ", namespace " + m.namespace : ""}`; }, () => {}).finally(() => route());

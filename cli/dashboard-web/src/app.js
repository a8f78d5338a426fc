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
// The page-wide filters: the namespace shown and the time range of the rates (the proxies'
// counters over the last 1, 5 or 15 minutes, or the sampler's last window).
const filters = { namespace: "", range: "" };
try { Object.assign(filters, JSON.parse(localStorage.getItem("cnimesh-dashboard-filters") || "{}")); } catch { /* defaults */ }
const nsParam = () => { const ns = meta.namespace || filters.namespace; return ns ? { namespace: ns } : {}; };
const rangeParam = () => (filters.range ? { range: filters.range } : {});
function setFilter(key, value) {
  filters[key] = value;
  try { localStorage.setItem("cnimesh-dashboard-filters", JSON.stringify(filters)); } catch { /* private mode */ }
  route(true);
}
function filterControls(namespaces) {
  const nsSelect = h("select", { id: "filter-namespace", "aria-label": "Namespace", onchange: (e) => setFilter("namespace", e.target.value) },
    h("option", { value: "" }, "All namespaces"), ...namespaces.map((n) => h("option", { value: n }, n)));
  nsSelect.value = meta.namespace || filters.namespace;
  if (meta.namespace) nsSelect.disabled = true;
  const rangeSelect = h("select", { id: "filter-range", "aria-label": "Time range", onchange: (e) => setFilter("range", e.target.value) },
    h("option", { value: "" }, `Last ${meta.interval_seconds}s`), h("option", { value: "1m" }, "Last 1 min"), h("option", { value: "5m" }, "Last 5 min"), h("option", { value: "15m" }, "Last 15 min"));
  rangeSelect.value = filters.range;
  return h("div", { class: "filters" }, h("label", {}, "Namespace ", nsSelect), h("label", {}, "Time range ", rangeSelect));
}
let namespacesSeen = [];

// ---------- topology (Cytoscape.js, laid out by dagre) ----------
let cy = null; // kept across refreshes: zoom and pan stay where the operator put them
let cyShape = ""; // the node and edge ids it was laid out for
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
const FONT = "13px system-ui, sans-serif";
let measure = null;
function textWidth(text) {
  measure ||= document.createElement("canvas").getContext("2d");
  measure.font = FONT;
  return Math.max(...String(text).split("\n").map((l) => measure.measureText(l).width));
}
function nodeLabel(n) {
  const rates = n.rps !== null && n.rps !== undefined && (n.kind === "workload" || n.kind === "pod") ? `\n${rps(n.rps)} · ${pct(n.success_rate, 1)}` : "";
  const prefix = n.kind === "address" ? "address " : n.kind === "egress" ? "egress " : "";
  return `${prefix}${n.label}${rates}`;
}
function edgeLabel(e) {
  const t = e.traffic;
  if (e.kind === "split") return `split ${e.split.parent} → ${pct(e.split.share, 0)} · ${rps(t.rps)}`;
  const parts = [e.kind === "egress" ? `egress ${e.egress.network}` : e.mtls ? "mTLS" : "plaintext", rps(t.rps), pct(t.success_rate, 1)];
  if (t.denied) parts.push(`${Math.round(t.denied)} denied`);
  if (t.rate_limited) parts.push(`${Math.round(t.rate_limited)} rate-limited`);
  if (e.egress?.denied) parts.push(`${Math.round(e.egress.denied)} refused (egress)`);
  return parts.join(" · ");
}
function cyStyle() {
  const fg = css("--fg"), bg = css("--bg"), muted = css("--muted"), ok = css("--ok"), bad = css("--bad"), warn = css("--warn"), accent = css("--accent");
  return [
    { selector: "node", style: { shape: "round-rectangle", width: "data(w)", height: "data(h)", label: "data(text)", "text-wrap": "wrap", "text-valign": "center", "text-halign": "center",
      "font-size": 13, "font-family": "system-ui, sans-serif", color: fg, "background-color": bg, "border-width": 2, "border-color": accent, "min-zoomed-font-size": 0 } },
    { selector: "node.unmeshed", style: { "border-style": "dashed", "border-color": muted } },
    { selector: "node.address", style: { shape: "cut-rectangle", "border-style": "dashed", "border-color": muted, "font-style": "italic" } },
    { selector: "node.egress, node.service", style: { shape: "round-tag", "border-style": "dotted", "border-color": muted, "font-style": "italic" } },
    { selector: "node:selected", style: { "border-width": 4, "border-color": css("--focus") } },
    { selector: "edge", style: { "curve-style": "bezier", width: 2, "line-color": ok, "target-arrow-color": ok, "target-arrow-shape": "triangle", "arrow-scale": 0.9,
      "font-size": 12, color: fg, "text-background-color": bg, "text-background-opacity": 0.9, "text-background-padding": 2, "text-rotation": "autorotate", label: "" } },
    { selector: "edge.plaintext", style: { "line-color": bad, "target-arrow-color": bad, "line-style": "dashed" } },
    { selector: "edge.egress", style: { "line-color": muted, "target-arrow-color": muted, "line-style": "dotted" } },
    { selector: "edge.split", style: { "line-color": accent, "target-arrow-color": accent, "line-style": "dashed" } },
    { selector: "edge.refused", style: { width: 4, "line-color": warn, "target-arrow-color": warn } },
    { selector: "edge:selected, edge.hover", style: { label: "data(text)" } },
    { selector: "edge.faded, node.faded", style: { opacity: 0.15 } },
  ];
}

async function topology() {
  const env = await api("topology", { ...nsParam(), ...rangeParam() });
  const graph = envelope(env);
  namespacesSeen = graph.namespaces;
  const elements = [];
  for (const n of graph.nodes) {
    const text = nodeLabel(n);
    const classes = [n.kind, n.kind === "workload" || n.kind === "pod" ? (n.meshed ? "meshed" : "unmeshed") : ""].join(" ");
    elements.push({ group: "nodes", classes, data: { ...n, text, w: Math.ceil(textWidth(text)) + 24, h: text.includes("\n") ? 44 : 30 } });
  }
  for (const e of graph.edges) {
    const refused = e.traffic.denied > 0 || e.traffic.rate_limited > 0 || (e.egress?.denied || 0) > 0;
    elements.push({ group: "edges", classes: `${e.kind}${refused ? " refused" : ""}`, data: { ...e, text: edgeLabel(e) } });
  }
  const shape = [...graph.nodes.map((n) => n.id), ...graph.edges.map((e) => e.id)].sort().join("\n");
  const legend = h("p", { class: "muted" }, "Green: mTLS. Dashed red: plaintext. Thick orange: requests denied (403) or rate-limited (429) in the range. Dashed blue: a route's split to another backend. Dotted grey to a tag: an egress hostname or a Service; a cut box: an address outside the mesh (no workload). Scroll or use the buttons to zoom, drag to pan; hover or select an edge for its numbers; click a workload for its page.");
  const table = edgeTable(graph.edges, graph.nodes);
  let container = document.getElementById("cy");
  if (!cy || !container || !main.contains(container)) {
    container = h("div", { id: "cy", role: "img", "aria-label": "Topology: workloads and who calls whom (the table below lists the same edges)" });
    const zoom = (f) => { if (cy) cy.zoom({ level: cy.zoom() * f, renderedPosition: { x: container.clientWidth / 2, y: container.clientHeight / 2 } }); };
    const tools = h("div", { class: "zoom", role: "group", "aria-label": "Zoom" },
      h("button", { type: "button", id: "zoom-in", "aria-label": "Zoom in", onclick: () => zoom(1.25) }, "+"),
      h("button", { type: "button", id: "zoom-out", "aria-label": "Zoom out", onclick: () => zoom(0.8) }, "−"),
      h("button", { type: "button", id: "zoom-fit", onclick: () => cy && cy.fit(undefined, 20) }, "Fit"));
    main.replaceChildren(h("h1", {}, "Topology"), filterControls(namespacesSeen), tools, container, legend, h("h2", {}, "Edges"), table);
    if (cy) cy.destroy();
    cy = cytoscape({ container, elements, style: cyStyle(), wheelSensitivity: 0.3, minZoom: 0.05, maxZoom: 4, boxSelectionEnabled: false });
    window.cnimeshTopology = cy;
    cy.on("tap", "node", (ev) => { const d = ev.target.data(); if (d.kind === "workload" || d.kind === "pod") location.hash = workloadHref(d.namespace, d.name); });
    cy.on("mouseover", "edge", (ev) => ev.target.addClass("hover"));
    cy.on("mouseout", "edge", (ev) => ev.target.removeClass("hover"));
    cy.on("mouseover", "node", (ev) => { cy.elements().not(ev.target.closedNeighborhood()).addClass("faded"); });
    cy.on("mouseout", "node", () => cy.elements().removeClass("faded"));
    cyShape = "";
  } else {
    main.querySelector("table.edges").replaceWith(table);
    main.querySelector(".filters").replaceWith(filterControls(namespacesSeen));
  }
  if (shape !== cyShape) {
    cy.elements().remove();
    cy.add(elements);
    cyShape = shape;
    layout();
  } else {
    for (const el of elements) { const c = cy.getElementById(el.data.id); c.data(el.data); c.classes(el.classes); }
  }
  // An edge's numbers show on hover or selection (written on every edge they would overlap),
  // and in the edges' table below.
  document.body.dataset.topologyShape = cyShape.length;
}

// Below this zoom the labels are too small to read: a large graph starts there, at its left
// (where the callers are), and "Fit" shows all of it.
const READABLE_ZOOM = 0.6;
function layout() {
  cy.layout({ name: "dagre", rankDir: "LR", nodeSep: 18, rankSep: 70, edgeSep: 10, nodeDimensionsIncludeLabels: true, fit: true, padding: 20, animate: false }).run();
  // A few nodes are not blown up to fill the box.
  if (cy.zoom() > 1.2) { cy.zoom(1.2); cy.center(); }
  if (cy.zoom() < READABLE_ZOOM) {
    const box = cy.elements().boundingBox();
    cy.zoom(READABLE_ZOOM);
    cy.pan({ x: 20 - box.x1 * READABLE_ZOOM, y: cy.height() / 2 - ((box.y1 + box.y2) / 2) * READABLE_ZOOM });
  }
}

function edgeTable(edges, nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const name = (id) => { const n = byId.get(id); return n ? (n.kind === "workload" || n.kind === "pod" ? `${n.namespace}/${n.name}` : n.kind === "service" ? `${n.namespace}/${n.name}` : `${n.kind} ${n.label}`) : id; };
  const link = (id) => { const n = byId.get(id); return n && (n.kind === "workload" || n.kind === "pod") ? h("a", { href: workloadHref(n.namespace, n.name) }, name(id)) : name(id); };
  const columns = [
    { key: "src", label: "From", sort: (e) => name(e.source) },
    { key: "dst", label: "To", sort: (e) => name(e.target) },
    { key: "kind", label: "Security", sort: (e) => e.kind },
    { key: "rps", label: "RPS", num: true, sort: (e) => e.traffic.rps },
    { key: "success", label: "Success", num: true, sort: (e) => e.traffic.success_rate ?? -1 },
    { key: "denied", label: "Denied (403)", num: true, sort: (e) => e.traffic.denied + (e.egress?.denied || 0) },
    { key: "limited", label: "Rate limited (429)", num: true, sort: (e) => e.traffic.rate_limited },
  ];
  const table = h("table", { class: "edges", "aria-label": "Edges" });
  sortable(table, edges, columns, (e) => {
    const denied = e.traffic.denied + (e.egress?.denied || 0);
    return h("tr", { "data-edge": e.id, "data-kind": e.kind, "data-denied": denied, "data-rate-limited": e.traffic.rate_limited },
      h("td", {}, link(e.source)), h("td", {}, link(e.target)),
      h("td", { class: e.kind === "mtls" ? "ok" : e.kind === "plaintext" ? "bad" : "" }, e.kind === "mtls" ? [lockIcon(), " mTLS"] : e.kind === "plaintext" ? "⚠ plaintext" : e.kind === "split" ? `split of ${e.split.parent} (${e.split.route}), ${pct(e.split.share, 0)}` : `egress (${e.egress.network})`),
      h("td", { class: "num" }, rps(e.traffic.rps)), h("td", { class: "num" }, pct(e.traffic.success_rate, 1)),
      h("td", { class: denied ? "num bad" : "num" }, Math.round(denied)), h("td", { class: e.traffic.rate_limited ? "num bad" : "num" }, Math.round(e.traffic.rate_limited)));
  });
  return table;
}

async function workloads() {
  const [stat, history] = await Promise.all([api("stat", { resource: "deploy", ...nsParam(), ...rangeParam() }), api("history")]);
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
  namespacesSeen = [...new Set([...namespacesSeen, ...rows.map((r) => r.namespace)])].sort();
  main.replaceChildren(h("h1", {}, "Workloads"), filterControls(namespacesSeen), rows.length ? table : h("p", {}, "No workloads found."));
}

const sum = (samples, name, pred = () => true) => samples.filter((s) => s.name === name && pred(s.labels)).reduce((a, s) => a + s.value, 0);
function groupBy(samples, names, keyOf) {
  const out = new Map();
  for (const s of samples) if (names.includes(s.name)) { const k = keyOf(s.labels); const e = out.get(k) || {}; e[s.name] = (e[s.name] || 0) + s.value; out.set(k, e); }
  return out;
}

async function workload(ns, kind, name) {
  const resource = `${kind}/${name}`;
  const [stat, routeStats, edges, pods] = await Promise.all([
    api("stat", { resource, namespace: ns, ...rangeParam() }),
    api("routes", { resource, namespace: ns, ...rangeParam() }).catch(() => null),
    api("edges", { resource: "deploy" }),
    api("pods", { resource, namespace: ns }),
  ]);
  const row = envelope(stat)[0];
  const page = [h("h1", {}, `${ns}/${resource}`), filterControls(namespacesSeen)];
  if (row) page.push(h("div", { class: "cards" }, ...[["Success", pct(row.success_rate)], ["RPS", rps(row.rps)], ["P50", ms(row.latency_ms?.p50)], ["P99", ms(row.latency_ms?.p99)], ["TCP connections", Math.round(row.tcp_connections)], ["Meshed pods", `${row.meshed_pods}/${row.pods}`], ["mTLS", pct(row.mtls_share, 0)]]
    .map(([l, v]) => h("div", { class: "card" }, h("div", { class: "label" }, l), h("div", { class: "value" }, v)))));
  const edgeTable = (list, other) => list.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["Workload", "Client identity", "Server identity", "Security", "Requests"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...list.map((e) => h("tr", { "data-edge": `${e.src}>${e.dst}` }, h("td", {}, other(e)[0] ? h("a", { href: workloadHref(other(e)[0], other(e)[1]) }, other(e)[1]) : `address ${other(e)[1]} (outside the mesh)`), h("td", {}, e.client_ids.join(", ") || "-"), h("td", {}, e.server_ids.join(", ") || "-"),
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

  // Routes: per route over the range, requests, success and latency; then each route's
  // requests per backend (a split's shares) and its retries since the proxies started.
  const retries = groupBy(samples, ["outbound_http_route_retry_requests_total", "outbound_http_route_retry_overflow_total"], (l) => `${l.parent_namespace ? l.parent_namespace + "/" : ""}${l.parent_name || "-"}|${l.route_name || "default"}`);
  const routeRows = routeStats?.value?.routes || [], backendRows = routeStats?.value?.backends || [];
  if (routeRows.length) {
    routes.append(h("table", { "aria-label": "Routes" }, h("thead", {}, h("tr", {}, ...["Service", "Route", "Requests", "RPS", "Success", "P50", "P95", "P99", "Retries", "Retry budget overflows"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, ...routeRows.map((r) => { const x = retries.get(`${r.parent}|${r.route}`) || {};
        return h("tr", { "data-route": `${r.parent}|${r.route}` }, h("td", {}, r.parent), h("td", {}, r.route), h("td", { class: "num" }, Math.round(r.requests)), h("td", { class: "num" }, rps(r.rps)),
          h("td", { class: "num", title: r.success_rate === null ? "the proxies write no per-route status" : "" }, pct(r.success_rate, 1)), h("td", { class: "num" }, ms(r.latency_ms?.p50)), h("td", { class: "num" }, ms(r.latency_ms?.p95)), h("td", { class: "num" }, ms(r.latency_ms?.p99)),
          h("td", { class: "num" }, x.outbound_http_route_retry_requests_total || 0), h("td", { class: "num" }, x.outbound_http_route_retry_overflow_total || 0)); }))));
  }
  if (backendRows.length) {
    const totals = new Map();
    for (const b of backendRows) totals.set(`${b.parent}|${b.route}`, (totals.get(`${b.parent}|${b.route}`) || 0) + b.requests);
    routes.append(h("table", { "aria-label": "Routes by backend" }, h("thead", {}, h("tr", {}, ...["Service", "Route", "Backend", "Requests", "Share"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, ...backendRows.map((b) => h("tr", { "data-backend": b.backend }, h("td", {}, b.parent), h("td", {}, b.route), h("td", {}, b.backend), h("td", { class: "num" }, Math.round(b.requests)),
        h("td", { class: "num" }, pct(b.requests / Math.max(1, totals.get(`${b.parent}|${b.route}`)), 1)))))));
  }
  if (!routeRows.length && !backendRows.length) routes.append(h("p", { class: "muted" }, "No route traffic sent by this workload's proxies in the range."));

  // Authorization: the proxies' decisions by policy, and responses by client identity.
  // A row admitted only by audit mode is a would-be denial; rate-limited requests (429) per Server.
  const decisions = groupBy(samples, ["inbound_http_authz_allow_total", "inbound_http_authz_deny_total", "inbound_tcp_authz_allow_total", "inbound_tcp_authz_deny_total"], (l) => `${l.srv_kind || "-"}/${l.srv_name || "-"}|${l.authz_name || (l.authz_kind ? l.authz_kind : "-")}|${l.route_name || "-"}|${l.authz_kind === "audit" ? "audit" : ""}`);
  const limited = groupBy(samples, ["inbound_http_local_ratelimit_total"], (l) => `${l.srv_kind || "-"}/${l.srv_name || "-"}`);
  const byClient = groupBy(samples.filter((s) => s.labels.direction === "inbound"), ["response_total"], (l) => `${l.client_id || (l.tls === "true" ? "(no identity)" : "(plaintext)")}|${l.status_code === "403" ? "denied" : l.status_code === "429" ? "limited" : "allowed"}`);
  // HTTP requests a Server authorized (audit's would-be denials too: audit lets them through).
  const served = (srv) => [...decisions].filter(([k]) => k.split("|")[0] === srv).reduce((n, [, v]) => n + (v.inbound_http_authz_allow_total || 0), 0);
  if (decisions.size) authz.append(h("table", { "aria-label": "Decisions by policy" }, h("thead", {}, h("tr", {}, ...["Server", "Authorization", "Route", "Authorized", "Would-be denials (audit)", "Denied", "Rate limited (429)", "Served (authorized − 429)"].map((t) => h("th", { scope: "col" }, t)))),
    // A Server's 429s are counted per Server, not per authorization: shown once, on its first row,
    // with what the Server served of what it authorized (a rate-limited request was authorized first).
    h("tbody", {}, ...[...decisions].map(([k, v], i, all) => { const [srv, az, route, audit] = k.split("|"); const firstOfServer = all.findIndex(([o]) => o.split("|")[0] === srv) === i; const denied = (v.inbound_http_authz_deny_total || 0) + (v.inbound_tcp_authz_deny_total || 0);
      const allowed = (v.inbound_http_authz_allow_total || 0) + (v.inbound_tcp_authz_allow_total || 0); const wouldBe = audit ? allowed : 0; const rl = firstOfServer ? (limited.get(srv) || {}).inbound_http_local_ratelimit_total || 0 : 0;
      return h("tr", { "data-denied": denied, "data-would-be-denied": wouldBe }, h("td", {}, srv), h("td", {}, az), h("td", {}, route), h("td", { class: "num" }, allowed - wouldBe), h("td", { class: wouldBe ? "num bad" : "num" }, wouldBe), h("td", { class: denied ? "num bad" : "num" }, denied), h("td", { class: rl ? "num bad" : "num" }, firstOfServer ? rl : ""), h("td", { class: "num", "data-served": firstOfServer ? served(srv) - rl : undefined }, firstOfServer ? Math.max(0, served(srv) - rl) : "")); }))));
  const clients = new Map();
  for (const [k, v] of byClient) { const [id, verdict] = k.split("|"); const c = clients.get(id) || { allowed: 0, denied: 0, limited: 0 }; c[verdict] += v.response_total; clients.set(id, c); }
  if (clients.size) authz.append(h("table", { "aria-label": "Requests by client identity" }, h("thead", {}, h("tr", {}, ...["Client identity", "Allowed", "Denied (403)", "Rate limited (429)"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...[...clients].map(([id, c]) => h("tr", { "data-client": id, "data-denied": c.denied }, h("td", {}, id), h("td", { class: "num" }, c.allowed), h("td", { class: c.denied ? "num bad" : "num" }, c.denied), h("td", { class: c.limited ? "num bad" : "num" }, c.limited))))));
  if (!decisions.size && !clients.size) authz.append(h("p", { class: "muted" }, "No inbound decisions recorded."));
  try {
    const report = (await api("authz", { resource, namespace: ns })).value;
    authz.append(h("details", {}, h("summary", {}, "Policies that apply (cnimesh authz)"), h("pre", {}, JSON.stringify(report, null, 2))));
  } catch (e) { showError(e, authz); }

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
  const topTable = h("table", { "aria-label": "Requests aggregated like cnimesh top" }, h("thead", {}, h("tr", {}, ...["Source", "Destination", "Method", "Path", "Count", "Best", "Worst", "Last", "Success", "Denied (403)", "Rate limited (429)"].map((t) => h("th", { scope: "col" }, t)))), topBody);
  const linesTable = h("table", { "aria-label": "Live requests", id: "tap-lines" }, h("thead", {}, h("tr", {}, ...["Time", "Pod", "Direction", "Method", "Path", "Status", "Latency", "Bytes", "Client identity"].map((t) => h("th", { scope: "col" }, t)))), linesBody);
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
    const requests = new Map(); // one row per request: its events fill it in
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
          if (msg.tap) {
            if (msg.tap.type === "requestInit") seen++;
            status.textContent = `Tapping: ${seen} requests.`;
            tapEvent(requests, linesBody, msg.tap);
          }
          else if (msg.top) topBody.replaceChildren(...msg.top.rows.map((r) => h("tr", { "data-denied": r.denied, "data-rate-limited": r.rate_limited }, h("td", {}, r.source), h("td", {}, r.destination), h("td", {}, r.method), h("td", {}, r.path), h("td", { class: "num" }, r.count), h("td", { class: "num" }, us(r.best_us)), h("td", { class: "num" }, us(r.worst_us)), h("td", { class: "num" }, us(r.last_us)), h("td", { class: "num" }, pct(r.successes / r.count)),
            h("td", { class: r.denied ? "num bad" : "num" }, r.denied), h("td", { class: r.rate_limited ? "num bad" : "num" }, r.rate_limited))));
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

// A request's row, created by its requestInit and completed by its responseInit (status,
// latency) and responseEnd (bytes, gRPC status, reset): one row per request, newest first.
function tapEvent(requests, body, t) {
  const key = `${t.namespace}/${t.pod}/${t.id ?? ""}`;
  if (t.type === "error") { body.prepend(h("tr", { class: "bad", "data-type": "error" }, h("td", {}, new Date().toLocaleTimeString()), h("td", {}, `${t.namespace}/${t.pod}`), h("td", { colspan: 7 }, t.message || "error"))); return; }
  let row = requests.get(key);
  if (!row) {
    if (t.type !== "requestInit") return; // its start came before the tap did
    const cells = ["time", "pod", "direction", "method", "path", "status", "latency", "bytes", "client"].map((c) => h("td", { "data-cell": c, class: ["status", "latency", "bytes"].includes(c) ? "num" : "" }));
    row = h("tr", { "data-request": key, "data-type": "request", "data-status": "" }, ...cells);
    const cell = (c) => row.querySelector(`[data-cell="${c}"]`);
    cell("time").textContent = new Date().toLocaleTimeString();
    cell("pod").textContent = `${t.namespace}/${t.pod}`;
    cell("direction").textContent = t.direction;
    cell("method").textContent = t.method;
    cell("path").textContent = t.path;
    cell("status").textContent = "…";
    cell("client").textContent = t.sourceMeta?.client_id || "-";
    requests.set(key, row);
    body.prepend(row);
    while (body.children.length > 200) { const last = body.lastChild; requests.delete(last.dataset.request); last.remove(); }
    return;
  }
  const cell = (c) => row.querySelector(`[data-cell="${c}"]`);
  if (t.type === "responseInit") {
    cell("status").textContent = t.httpStatus;
    cell("latency").textContent = us(t.sinceRequestInitUs);
    row.dataset.status = t.httpStatus;
    row.classList.toggle("bad", t.httpStatus >= 500);
  } else if (t.type === "responseEnd") {
    cell("bytes").textContent = `${t.responseBytes ?? 0}B`;
    const trouble = [t.grpcStatus ? `grpc ${t.grpcStatus}` : "", t.resetCode !== undefined && t.resetCode !== null ? `reset ${t.resetCode}` : ""].filter(Boolean).join(", ");
    if (trouble) { cell("status").textContent += ` (${trouble})`; row.classList.add("bad"); }
    row.dataset.done = "true";
    requests.delete(key);
  }
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

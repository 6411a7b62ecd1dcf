// testbed watch: the page. State comes from /api/events (server-sent events): a snapshot, then
// deltas (new metric rows, changed node rows). Charts are uPlot (bundled); the node table shows one
// page of the sorted, filtered rows, so a thousand nodes stay responsive.
"use strict";

const PAGE_SIZE = 50;
const state = { version: -1, run: {}, budgets: {}, metrics: [], nodes: new Map(), graph: null };
const view = { sortKey: "id", sortDir: 1, filter: "", page: 0 };
let charts = null;
let renderQueued = false;

// ---------------------------------------------------------------- formatting

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function num(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(2);
  return Number(x.toPrecision(digits)).toString();
}
function bytes(x) {
  if (x === null || x === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (x >= 1000 && i < units.length - 1) { x /= 1000; i++; }
  return `${Number(x.toPrecision(3))} ${units[i]}`;
}
function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60), h = Math.floor(m / 60);
  return h ? `${h} h ${m % 60} min` : `${m} min ${Math.round(s % 60)} s`;
}

// ---------------------------------------------------------------- state

function takeSnapshot(snap) {
  state.version = snap.version;
  state.run = snap.run;
  state.budgets = snap.budgets || {};
  state.metrics = snap.metrics;
  state.nodes = new Map(snap.nodes.map(n => [n.id, n]));
  state.graph = snap.graph ?? null;
  charts && charts.forEach(c => c.destroy());
  charts = null;
  queueRender();
}
function applyDelta(delta) {
  if (delta.reset) { fetch("/api/snapshot").then(r => r.json()).then(takeSnapshot); return; }
  if (delta.version <= state.version) return; // already in the snapshot
  state.version = delta.version;
  state.run = delta.run;
  if (delta.metrics.length) state.metrics = state.metrics.concat(delta.metrics);
  state.budgets = delta.budgets;
  for (const n of delta.nodes) state.nodes.set(n.id, n);
  if ("graph" in delta) state.graph = delta.graph; // sent only when the round enters another block
  queueRender();
}
function queueRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; render(); });
}

// ---------------------------------------------------------------- header and cards

const STATUS_TEXT = {
  waiting: "waiting for the run", running: "running", stalled: "stalled (no new round for a while)",
  killed: "killed (the coordinator is gone)", completed: "completed", stopped_budget: "stopped by a budget",
  failed: "failed",
};

function renderHeader() {
  const r = state.run;
  document.getElementById("run-name").textContent = r.name ? `${r.name}` : "testbed watch";
  const badge = document.getElementById("run-status");
  badge.textContent = STATUS_TEXT[r.status] || r.status || "connecting";
  badge.className = `badge ${r.status || ""}`;
  document.getElementById("run-meta").textContent = r.algorithm
    ? `${r.algorithm} · ${r.mode} · seed ${r.seed} · ${r.num_nodes} nodes · ${r.dataset} · profile ${r.profile} · ${r.run_dir}`
    : (r.run_dir || "");
  const planned = r.rounds_planned;
  const frac = planned ? Math.min(1, r.rounds_done / planned) : 0;
  document.getElementById("progress-bar").style.width = `${(100 * frac).toFixed(1)}%`;
  const perRound = r.rounds_done ? r.wall_s / r.rounds_done : null;
  const parts = [`round ${r.rounds_done}${planned ? " / " + planned : ""}`];
  if (perRound) parts.push(`${num(perRound, 3)} s per round`);
  if (r.status === "running" && r.eta_s !== null && r.eta_s !== undefined) parts.push(`about ${duration(r.eta_s)} left`);
  if (r.wall_s !== null && r.wall_s !== undefined) parts.push(`rounds ${duration(r.wall_s)}`);
  if (r.setup_s !== null && r.setup_s !== undefined) parts.push(`set-up before them ${duration(r.setup_s)}`);
  if (r.coordinator) parts.push(`coordinator ${r.coordinator} (MQTT status)`);
  const stopped = document.getElementById("stopped");
  if (r.stopped) {
    const s = r.stopped;
    stopped.textContent = `Stopped by a budget: node ${s.node} would spend ${s.budget} ${num(s.would_be)} > its budget ${num(s.limit)}.`;
    stopped.hidden = false;
  } else if (r.status === "failed" && r.failure) {
    stopped.textContent = `Failed: ${r.failure}`;
    stopped.hidden = false;
  } else stopped.hidden = true;
  if (r.status_dropped) parts.push(`${r.status_dropped} malformed status messages dropped (last: ${r.status_dropped_last})`);
  document.getElementById("progress-text").textContent = parts.join(" · ");
  // One line per damaged file: what was refused is not shown, what is shown may be incomplete.
  const error = document.getElementById("error");
  const errors = Object.entries(r.errors || {});
  error.replaceChildren(...errors.map(([file, text]) => {
    const line = document.createElement("div");
    line.dataset.file = file;
    line.textContent = `${file}: ${text}`;
    return line;
  }));
  error.hidden = !errors.length;
}

// The per-node quantities with a budget: [row key, budget key, label, formatter].
const SPENT = [
  ["epsilon", "epsilon", "ε", num], ["energy_j", "energy_j", "energy (J)", num],
  ["cost_units", "cost_units", "cost units", num], ["bytes", "bytes", "bytes", bytes],
];

function renderCards() {
  const nodes = [...state.nodes.values()];
  const count = s => nodes.filter(n => n.state === s).length;
  const cards = [
    ["nodes online", `${count("online")} / ${nodes.length}`,
     `${count("straggling")} straggling · ${count("offline") + count("missing")} offline · ` +
     `${nodes.filter(n => n.refused_round !== null && n.refused_round !== undefined).length} refused`],
  ];
  // The run's figure to quote (summary.json's privacy.headline) once the summary is written: the same
  // figure as the terminal's table, `testbed runs` and the report; while the run goes, the run's accountant's.
  const quote = state.run.quote;
  if (quote) cards.push(["ε to quote", quote.text,
    [quote.by, quote.observer ? `against the ${quote.observer}` : ""].filter(Boolean).join(" · ")]);
  for (const [key, bkey, label, fmt] of SPENT) {
    if (quote && key === "epsilon") continue;
    let worst = null;
    for (const n of nodes) if (n[key] !== null && (worst === null || n[key] > worst[key])) worst = n;
    const limit = state.budgets[bkey];
    const value = worst ? fmt(worst[key]) : "–";
    const sub = (limit ? `of ${fmt(limit)} budget (${Math.round(100 * worst[key] / limit)}%)` : "no budget")
      + (worst ? ` · node ${worst.id}` : "");
    cards.push([`most ${label} spent`, value, worst ? sub : ""]);
  }
  const last = state.metrics[state.metrics.length - 1];
  if (last) cards.push(["test accuracy", num(last.test_accuracy, 3), `training loss ${num(last.train_loss)}`]);
  // Against whom each ε holds: secret noise (node secrets) or noise derivable from the run seed.
  const secrecy = state.run.secrecy || [];
  if (secrecy.length) {
    const text = secrecy.join(" ");
    const value = text.includes("reproducible run") ? (text.includes("holds (noise") ? "mixed" : "run seed")
      : text.includes("holds (noise") ? "node secrets" : "–";
    cards.push(["whose noise", value, secrecy.join(" · ")]);
  }
  document.getElementById("cards").innerHTML = cards.map(([l, v, s]) =>
    `<div class="card"><div class="label">${esc(l)}</div><div class="value">${esc(v)}</div><div class="sub">${esc(s)}</div></div>`).join("");
}

// ---------------------------------------------------------------- charts

function chartWidth(id) { return Math.max(300, document.getElementById(id).clientWidth - 4); }

function accLoss(id, xLabel) {
  return new uPlot({
    width: chartWidth(id), height: 240, legend: { live: false }, scales: { x: { time: false }, acc: { range: [0, 1] }, loss: {} },
    // spanGaps: with output.eval_every > 1 the rounds between evaluations have no accuracy or loss.
    series: [{ label: xLabel }, { label: "test accuracy", scale: "acc", stroke: "#2f6fdb", width: 2, points: { size: 4 }, spanGaps: true },
             { label: "training loss", scale: "loss", stroke: "#c62828", width: 2, points: { size: 4 }, spanGaps: true }],
    axes: [{ label: xLabel }, { scale: "acc", label: "test accuracy" },
           { scale: "loss", side: 1, label: "training loss", grid: { show: false } }],
  }, [[], [], []], document.getElementById(id));
}

function makeCharts() {
  const bars = uPlot.paths.bars({ size: [0.8, 40] });
  charts = [
    accLoss("chart-round", "round"),
    null,  // against cost: made once the run says what its cost axis is (renderCostChart)
    new uPlot({ width: chartWidth("chart-stragglers"), height: 200, legend: { live: false }, scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
                series: [{ label: "round" }, { label: "stragglers", stroke: "#b35900", fill: "#b3590055", paths: bars, points: { show: false } }],
                axes: [{ label: "round" }, { label: "nodes" }] }, [[], []], document.getElementById("chart-stragglers")),
    new uPlot({ width: chartWidth("chart-epsilon"), height: 200, legend: { live: false }, scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(hi, state.budgets.epsilon || 0) * 1.05 || 1] } },
                series: [{ label: "round" }, { label: "ε spent", stroke: "#6a1b9a", width: 2, points: { size: 4 } },
                         { label: "ε budget", stroke: "#c62828", dash: [6, 4], points: { show: false } }],
                axes: [{ label: "round" }, { label: "ε" }] }, [[], [], []], document.getElementById("chart-epsilon")),
  ];
}

function renderCharts() {
  if (!charts) makeCharts();
  const m = state.metrics, col = k => m.map(r => r[k]);
  const rounds = col("round");
  charts[0].setData([rounds, col("test_accuracy"), col("train_loss")]);
  renderCostChart(col);
  charts[2].setData([rounds, col("stragglers")]);
  const budget = state.budgets.epsilon;
  charts[3].setData([rounds, col("epsilon"), rounds.map(() => budget ?? null)]);
}
// The x of "accuracy against cost": cost units, else bytes sent, else no panel (the feed's
// run.cost_axis, testbed.reports.cost_axis): an x that stays 0 would be a vertical line.
let costKey = null;
function renderCostChart(col) {
  const axis = state.run.cost_axis || null;
  const key = axis ? axis.key : null;
  document.getElementById("caption-cost").textContent = axis ? axis.caption : (state.run.cost_axis_none || "");
  document.getElementById("chart-cost").hidden = !axis;
  if (key !== costKey) {
    if (charts[1]) charts[1].destroy();
    charts[1] = null;
    document.getElementById("chart-cost").replaceChildren();
    if (axis) charts[1] = accLoss("chart-cost", axis.label);
    costKey = key;
  }
  if (charts[1]) charts[1].setData([col(key), col("test_accuracy"), col("train_loss")]);
}
window.addEventListener("resize", () => {
  if (!charts) return;
  for (const [c, id] of charts.map((c, i) => [c, ["chart-round", "chart-cost", "chart-stragglers", "chart-epsilon"][i]])) {
    if (c) c.setSize({ width: chartWidth(id), height: c.height });
  }
});

// ---------------------------------------------------------------- graph (decentralised runs)

const STATE_COLOUR = { online: "#1a7f37", straggling: "#b35900", offline: "#c62828", missing: "#c62828" };

// A node's colour: its ε spent (of the budget, or of the most any node spent) when the run's
// releases are (ε, δ)-DP and ε is known, else its state this round. Returns [colour function, legend].
function nodeColouring() {
  const nodes = [...state.nodes.values()];
  const known = nodes.filter(n => n.epsilon !== null && n.epsilon !== undefined);
  if (state.budgets.guarantee === "dp" && known.length) {
    const scale = state.budgets.epsilon || Math.max(...known.map(n => n.epsilon)) || 1;
    const colour = n => {
      if (n === undefined || n.epsilon === null || n.epsilon === undefined) return "#999";
      const t = Math.min(1, n.epsilon / scale);
      if (n.epsilon > scale) return "#c62828";
      return `rgb(${Math.round(198 - 92 * t)},${Math.round(219 - 192 * t)},${Math.round(239 - 85 * t)})`;
    };
    const of = state.budgets.epsilon ? `of the ε budget ${num(scale)} (red: over)` : `up to ${num(scale)}, the most spent`;
    return [colour, "epsilon", `nodes coloured by ε spent, light to dark ${of}`];
  }
  return [n => STATE_COLOUR[n?.state] || "#999", "state", "nodes coloured by state: green online, orange straggling, red offline, grey waiting"];
}

function renderGraph() {
  const g = state.graph, figure = document.getElementById("graph-figure");
  figure.hidden = !g;
  if (!g) return;
  const canvas = document.getElementById("graph"), note = document.getElementById("graph-note");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (g.note || !g.edges) {
    document.getElementById("graph-caption").textContent = "the graph";
    note.textContent = g.note ? `not drawn: ${g.note}` : "waiting for the first round";
    canvas.dataset.edges = canvas.dataset.nodes = "0";
    return;
  }
  const n = g.num_nodes, pad = 10, w = canvas.width - 2 * pad, h = canvas.height - 2 * pad;
  let xy;
  if (g.positions) { // metres, fitted to the canvas keeping the aspect ratio, y up (a map, as `testbed scene show`)
    const xs = g.positions.map(p => p[0]), ys = g.positions.map(p => p[1]);
    const x0 = Math.min(...xs), y1 = Math.max(...ys);
    const span = Math.max(Math.max(...xs) - x0, y1 - Math.min(...ys)) || 1;
    const s = Math.min(w, h) / span;
    xy = g.positions.map(([x, y]) => [pad + (x - x0) * s, pad + (y1 - y) * s]);
  } else { // no geometry: a circle
    const r = Math.min(w, h) / 2;
    xy = Array.from({ length: n }, (_, i) => [pad + w / 2 + r * Math.cos(2 * Math.PI * i / n),
                                             pad + h / 2 + r * Math.sin(2 * Math.PI * i / n)]);
  }
  ctx.strokeStyle = "rgba(80, 80, 80, 0.35)";
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (const [i, j] of g.edges) { ctx.moveTo(...xy[i]); ctx.lineTo(...xy[j]); }
  ctx.stroke();
  const [colour, by, legend] = nodeColouring();
  const radius = n > 100 ? 2.5 : 4.5;
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = colour(state.nodes.get(i));
    ctx.beginPath();
    ctx.arc(xy[i][0], xy[i][1], radius, 0, 2 * Math.PI);
    ctx.fill();
  }
  Object.assign(canvas.dataset, { edges: String(g.edges.length), nodes: String(n), colour: by });
  document.getElementById("graph-caption").textContent =
    `the graph of round ${g.round} (block ${g.block}): ${n} nodes, ${g.edges.length} edges`;
  note.textContent = `${legend}; ${g.positions ? "positions as placed (m)" : "nodes on a circle (no positions)"}`;
}

// ---------------------------------------------------------------- node table

function budgetBar(value, limit, fmt, label = "") {
  const text = fmt(value);
  const obs = label ? `<span class="obs">${esc(label)}</span>` : "";
  if (!limit || value === null) return `<div class="budget">${obs}<span>${esc(text)}</span></div>`;
  const frac = value / limit;
  const cls = frac > 1 ? "over" : frac > 0.8 ? "high" : "";
  return `<div class="budget" title="${esc(text)} of ${esc(fmt(limit))} (${Math.round(100 * frac)}%)">${obs}<span>${esc(text)}</span>`
    + `<span class="bar"><span class="fill ${cls}" style="width:${Math.min(100, 100 * frac).toFixed(1)}%;display:block"></span></span></div>`;
}

function columns() {
  const b = state.budgets;
  const cols = [
    { key: "id", label: "node", left: true, cell: n => esc(n.id) },
    { key: "state", label: "this round", left: true,
      cell: n => `<span class="state ${esc(n.state)}" title="${esc(n.why || "")}">${esc(n.state)}</span>` },
    { key: "epsilon", label: `ε at δ=${b.delta ?? "?"}`, cell: n => {
        // A run whose releases carry no (ε, δ) noise has no finite ε: said, never drawn as 0.
        if (b.guarantee === "none") return `<div class="budget"><span>not private</span></div>`;
        if (b.guarantee === "mi_dp") return `<div class="budget"><span>ε-MI-DP: see MI-ε</span></div>`;
        const obs = Object.entries(n.epsilon_by || {});
        if (obs.length <= 1) return budgetBar(n.epsilon, b.epsilon, num, obs.length ? obs[0][0] : "");
        return obs.map(([o, e]) => budgetBar(e, b.epsilon, num, o)).join("");
      } },
    { key: "energy_j", label: "energy (J)", cell: n => budgetBar(n.energy_j, b.energy_j, num) },
    { key: "cost_units", label: "cost units", cell: n => budgetBar(n.cost_units, b.cost_units, num) },
    { key: "bytes", label: "bytes", cell: n => budgetBar(n.bytes, b.bytes, bytes) },
    { key: "rounds", label: "rounds done", cell: n => esc(n.rounds) },
    { key: "straggled", label: "straggled", cell: n => esc(n.straggled) },
    { key: "refused_round", label: "refused", cell: n => n.refused_round ? `round ${esc(n.refused_round)}` : "–" },
    { key: "last_round", label: "last seen", cell: n => n.last_round
        ? `round ${esc(n.last_round)}${n.last_seen_s !== null ? ` (at ${esc(duration(n.last_seen_s))})` : ""}` : "–" },
    { key: "board", label: "board", left: true, cell: n => esc(n.board ?? "–") },
    { key: "measured", label: "costs", left: true, cell: n => n.measured === null ? "–" : n.measured ? "measured" : "modelled" },
  ];
  if (b.mi_epsilon || b.guarantee === "mi_dp") cols.splice(3, 0, { key: "mi_epsilon", label: "MI-ε (nats)", cell: n => budgetBar(n.mi_epsilon, b.mi_epsilon, num) });
  // An over-the-air run: its algorithm registers a view of the channel, and the feed fills these.
  if ([...state.nodes.values()].some(n => n.gain !== null && n.gain !== undefined)) {
    cols.push({ key: "gain", label: "channel gain", cell: n => esc(num(n.gain, 3)) });
    cols.push({ key: "snr_db", label: "rx SNR (dB)", cell: n => esc(num(n.snr_db, 3)) });
  }
  return cols;
}

function sortedRows() {
  const f = view.filter.toLowerCase();
  let rows = [...state.nodes.values()];
  if (f) rows = rows.filter(n => `${n.id} ${n.state} ${n.board}`.toLowerCase().includes(f));
  const k = view.sortKey, d = view.sortDir;
  rows.sort((a, b) => {
    const x = a[k], y = b[k];
    if (x === y) return a.id - b.id;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * d;
  });
  return rows;
}

function renderTable() {
  const cols = columns();
  const head = document.getElementById("nodes-head");
  head.innerHTML = cols.map(c => {
    const sorted = c.key === view.sortKey ? (view.sortDir > 0 ? "sorted-asc" : "sorted-desc") : "";
    return `<th data-key="${esc(c.key)}" class="${c.left ? "left" : ""} ${sorted}">${esc(c.label)}</th>`;
  }).join("");
  const rows = sortedRows();
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
  view.page = Math.min(view.page, pages - 1);
  const shown = rows.slice(view.page * PAGE_SIZE, (view.page + 1) * PAGE_SIZE);
  document.getElementById("nodes-body").innerHTML = shown.map(n =>
    `<tr data-node="${esc(n.id)}" data-state="${esc(n.state)}">` + cols.map(c => `<td class="${c.left ? "left" : ""}">${c.cell(n)}</td>`).join("") + "</tr>").join("");
  document.getElementById("page-text").textContent = `page ${view.page + 1} of ${pages}`;
  document.getElementById("node-count").textContent = `${rows.length} of ${state.nodes.size}`;
}

document.getElementById("nodes-head").addEventListener("click", e => {
  const key = e.target.closest("th")?.dataset.key;
  if (!key) return;
  view.sortDir = key === view.sortKey ? -view.sortDir : (key === "id" ? 1 : -1);
  view.sortKey = key;
  renderTable();
});
document.getElementById("filter").addEventListener("input", e => { view.filter = e.target.value; view.page = 0; renderTable(); });
document.getElementById("prev").addEventListener("click", () => { view.page = Math.max(0, view.page - 1); renderTable(); });
document.getElementById("next").addEventListener("click", () => { view.page += 1; renderTable(); });

// ---------------------------------------------------------------- main

function render() {
  renderHeader();
  renderCards();
  renderCharts();
  renderGraph();
  renderTable();
}

const events = new EventSource("/api/events");
events.addEventListener("snapshot", e => takeSnapshot(JSON.parse(e.data)));
events.addEventListener("delta", e => applyDelta(JSON.parse(e.data)));
events.onerror = () => {
  const badge = document.getElementById("run-status");
  if (state.run.status === "running" || !state.run.status) { badge.textContent = "reconnecting"; badge.className = "badge"; }
};

/* The live GPU heatmap: a snapshot, then versioned deltas over /ws/fleet/ (see fleet/feed.py).
 * A row is [cluster, node, model, pool, cells]; a cell is [index, slices 0..7, flags, MIG layout, claims].
 *
 * Drawn on a canvas of our own, one block per GPU: a 40,000-GPU fleet is 40,000 fillRect calls (a few
 * milliseconds), and a delta repaints only the blocks of the rows it carries. (A Plotly heatmap redrew the
 * whole matrix for every delta: 180-370 ms.) Rows are nodes, sorted by cluster, model, pool and name, and
 * grouped by cluster and model; when a group has more nodes than fit the height, its rows flow into
 * several bands side by side (top to bottom, then the next band). No build step: plain browser JavaScript.
 *
 * Colour by allocation (the cells' slices) or by utilization: /usage/gpus.json (usage/cells.py), polled,
 * gives each GPU's measured activity (null: a gap, drawn hatched, never as 0 %) and an "allocated but
 * idle" mark, drawn in both modes.
 */
"use strict";
(function () {
  const TAINTED = 1, UNAVAILABLE = 2, RESERVED = 4, UNRESERVED = 8;
  // Cividis (colour-blind safe, monotonic in lightness), sampled at 0/7 .. 7/7 allocated compute slices.
  const CIVIDIS = [[0, 32, 76], [0, 42, 102], [0, 52, 110], [39, 63, 108], [60, 74, 107], [76, 85, 107],
    [91, 95, 109], [104, 106, 112], [117, 117, 117], [131, 129, 120], [146, 140, 120], [161, 152, 118],
    [176, 165, 114], [192, 177, 109], [209, 191, 102], [225, 204, 92], [243, 219, 79], [255, 233, 69]];
  const COLORS = Array.from({ length: 8 }, (_, k) => cividis(k / 7));
  const TAINT_COLOR = "#D55E00", LEAK_COLOR = "#CC79A7", EMPTY = "#eef1f6", INK = "#1d2330";
  const IDLE_COLOR = "#E69F00", GAP_COLOR = "#c9ced8", USAGE_POLL_MS = 30000;
  const SIZES = [24, 18, 14, 10, 8, 6, 5, 4, 3]; // candidate block sizes, largest first
  const LABEL_MIN = 14; // blocks at least this tall get node names beside them
  const HEADER = 18, GROUP_GAP = 8, BAND_GAP = 14, LABEL_WIDTH = 150;

  const cfg = JSON.parse(document.getElementById("heatmap-config").textContent);
  const plot = document.getElementById("heatmap");
  const canvas = document.getElementById("heatmap-canvas");
  const tip = document.getElementById("heatmap-tip");
  const live = document.getElementById("live");
  const card = document.getElementById("gpu-card");
  const summary = document.getElementById("heatmap-summary");
  const modeSelect = document.getElementById("heatmap-mode");
  const usageStatus = document.getElementById("usage-status");
  const usageUrl = document.getElementById("heatmap-mode-bar").dataset.usageUrl;
  let mode = location.hash === "#utilization" ? "utilization" : "allocation";
  let usage = { rows: {} };
  const ctx = canvas.getContext("2d", { alpha: false });
  const stats = (window.heatmapStats = { snapshots: 0, deltas: 0, resyncs: 0, renderMs: 0, deltaMs: 0, cells: 0, firstRenderAt: 0 });
  let rows = new Map();
  let version = 0;
  let socket = null;
  let attempt = 0;
  // Layout: groups [{top, lines, keys}], each row key's place, and the block geometry.
  let view = { groups: [], place: new Map(), size: 0, gap: 0, labels: false, columns: 1, bandWidth: 0, width: 0, height: 0 };

  function cividis(t) {
    const x = t * (CIVIDIS.length - 1), i = Math.min(CIVIDIS.length - 2, Math.floor(x)), f = x - i;
    const c = CIVIDIS[i].map((v, j) => Math.round(v + (CIVIDIS[i + 1][j] - v) * f));
    return "rgb(" + c.join(",") + ")";
  }

  function setStatus(state, detail) {
    live.className = "status " + state;
    live.dataset.state = state;
    live.dataset.version = String(version);
    live.textContent = detail ? state + " · " + detail : state;
  }

  function stateText(cell) {
    const parts = [];
    if (cell[1] === 0) parts.push("free");
    else parts.push(cell[1] >= 7 ? "fully allocated" : "partly allocated");
    if (cell[2] & RESERVED) parts.push("in use");
    if (cell[2] & UNRESERVED) parts.push("allocated, no consumer");
    if (cell[2] & TAINTED) parts.push("tainted");
    if (cell[2] & UNAVAILABLE) parts.push("partitions blocked");
    return parts.join(", ");
  }

  function compareRows(a, b) {
    const ra = rows.get(a), rb = rows.get(b);
    for (const i of [0, 2, 3, 1]) {
      if (ra[i] < rb[i]) return -1;
      if (ra[i] > rb[i]) return 1;
    }
    return 0;
  }

  function columnCount() {
    let columns = 1;
    for (const row of rows.values()) for (const cell of row[4]) columns = Math.max(columns, cell[0] + 1);
    return columns;
  }

  // ------------------------------------------------------------------------------------------ layout

  function groupRows(order) {
    const groups = [];
    for (const key of order) {
      const row = rows.get(key), last = groups[groups.length - 1];
      if (last && last.cluster === row[0] && last.model === row[2]) last.keys.push(key);
      else groups.push({ cluster: row[0], model: row[2], keys: [key], top: 0, lines: 0 });
    }
    return groups;
  }

  // The largest block size whose layout fits the target height (the smallest size scrolls instead).
  function layout() {
    const order = Array.from(rows.keys()).sort(compareRows);
    const groups = groupRows(order);
    const columns = columnCount();
    const width = Math.max(320, plot.clientWidth - 14); // inside its padding
    const target = Math.max(420, window.innerHeight - 160);
    let chosen = null;
    // Largest blocks first, then the fewest bands: a small fleet reads as one column of nodes.
    search: for (const size of SIZES) {
      const gap = size >= 8 ? 2 : 1;
      const labels = size >= LABEL_MIN;
      const bandWidth = (labels ? LABEL_WIDTH : 0) + columns * (size + gap) + BAND_GAP;
      const most = Math.max(1, Math.floor((width + BAND_GAP) / bandWidth));
      for (let bands = 1; bands <= most; bands++) {
        let height = 0;
        const tops = groups.map((g) => {
          const top = height;
          const lines = Math.ceil(g.keys.length / bands);
          height += HEADER + lines * (size + gap) + GROUP_GAP;
          return { top, lines };
        });
        chosen = { size, gap, labels, bandWidth, bands, height, tops };
        if (height <= target) break search;
      }
    }
    const place = new Map();
    groups.forEach((g, n) => {
      g.top = chosen.tops[n].top;
      g.lines = chosen.tops[n].lines;
      g.keys.forEach((key, i) => {
        const band = Math.floor(i / g.lines), line = i % g.lines;
        place.set(key, { group: n, x: band * chosen.bandWidth + (chosen.labels ? LABEL_WIDTH : 0), y: g.top + HEADER + line * (chosen.size + chosen.gap) });
      });
    });
    view = { groups, place, size: chosen.size, gap: chosen.gap, labels: chosen.labels, columns, bandWidth: chosen.bandWidth,
      width, height: Math.max(chosen.height, 60), clusters: new Set(order.map((k) => rows.get(k)[0])).size };
  }

  // ----------------------------------------------------------------------------------------- drawing

  function usageOf(key, cell) {
    const row = usage.rows[key];
    return row ? row[String(cell[0])] : undefined;
  }

  function drawCell(x, y, cell, key) {
    const s = view.size;
    const flags = cell[2];
    const u = usageOf(key, cell);
    if (flags & TAINTED && s < 8) ctx.fillStyle = TAINT_COLOR;
    else if (mode === "utilization") ctx.fillStyle = u && u[0] !== null ? cividis(Math.min(100, u[0]) / 100) : GAP_COLOR;
    else ctx.fillStyle = COLORS[Math.max(0, Math.min(7, cell[1]))];
    ctx.fillRect(x, y, s, s);
    if (mode === "utilization" && !(u && u[0] !== null) && s >= 8) {
      ctx.strokeStyle = "#ffffff"; // hatched: no sample is not 0 %
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(x, y + s); ctx.lineTo(x + s, y);
      ctx.moveTo(x, y + s / 2); ctx.lineTo(x + s / 2, y);
      ctx.moveTo(x + s / 2, y + s); ctx.lineTo(x + s, y + s / 2);
      ctx.stroke();
    }
    if (u && u[1]) {
      ctx.fillStyle = IDLE_COLOR;
      const t = Math.max(3, Math.round(s / 2));
      ctx.beginPath();
      ctx.moveTo(x + s - t, y); ctx.lineTo(x + s, y); ctx.lineTo(x + s, y + t);
      ctx.closePath();
      ctx.fill();
    }
    if (flags & UNRESERVED) {
      ctx.strokeStyle = LEAK_COLOR;
      if (s >= 8) {
        ctx.lineWidth = 2;
        ctx.beginPath();
        ctx.arc(x + s / 2, y + s / 2, s / 2 - 2, 0, 2 * Math.PI);
        ctx.stroke();
      } else {
        ctx.lineWidth = 1;
        ctx.strokeRect(x + 0.5, y + 0.5, s - 1, s - 1);
      }
    }
    if (flags & TAINTED && s >= 8) {
      ctx.strokeStyle = TAINT_COLOR;
      ctx.lineWidth = Math.max(2, s / 8);
      ctx.beginPath();
      ctx.moveTo(x + 2, y + 2); ctx.lineTo(x + s - 2, y + s - 2);
      ctx.moveTo(x + s - 2, y + 2); ctx.lineTo(x + 2, y + s - 2);
      ctx.stroke();
    }
  }

  // One row's blocks (and its label): what a delta repaints.
  function drawRow(key) {
    const at = view.place.get(key), row = rows.get(key);
    const step = view.size + view.gap;
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(at.x, at.y, view.columns * step, view.size);
    ctx.fillStyle = EMPTY;
    for (let c = 0; c < view.columns; c++) ctx.fillRect(at.x + c * step, at.y, view.size, view.size);
    for (const cell of row[4]) drawCell(at.x + cell[0] * step, at.y, cell, key);
    if (view.labels) {
      ctx.fillStyle = INK;
      ctx.font = "12px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      ctx.fillText(row[1], at.x - 8, at.y + view.size / 2, LABEL_WIDTH - 12);
    }
  }

  function draw() {
    const t0 = performance.now();
    layout();
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(view.width * ratio);
    canvas.height = Math.round(view.height * ratio);
    canvas.style.width = view.width + "px";
    canvas.style.height = view.height + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, view.width, view.height);
    ctx.font = "bold 12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "left";
    for (const g of view.groups) {
      ctx.fillStyle = INK;
      const name = (view.clusters > 1 ? g.cluster + " · " : "") + g.model;
      ctx.fillText(name + " · " + g.keys.length + (g.keys.length === 1 ? " node" : " nodes"), 0, g.top + HEADER / 2);
    }
    for (const key of view.place.keys()) drawRow(key);
    updateSummary();
    plot.dataset.cells = String(stats.cells);
    return performance.now() - t0;
  }

  function updateSummary() {
    let gpus = 0, used = 0, tainted = 0;
    for (const row of rows.values()) {
      for (const cell of row[4]) {
        gpus += 1;
        used += cell[1];
        if (cell[2] & TAINTED) tainted += 1;
      }
    }
    stats.cells = gpus;
    const pct = gpus ? Math.round((100 * used) / (7 * gpus)) : 0;
    let idle = 0, measured = 0, active = 0;
    for (const [key, row] of rows) {
      for (const cell of row[4]) {
        const u = usageOf(key, cell);
        if (u && u[1]) idle += 1;
        if (u && u[0] !== null) { measured += 1; active += u[0]; }
      }
    }
    summary.dataset.idle = String(idle);
    summary.textContent = gpus + " GPUs on " + rows.size + " nodes · " + used + " of " + 7 * gpus +
      " compute slices allocated (" + pct + "%) · " + tainted + " tainted · " + idle + " allocated but idle" +
      (mode === "utilization" ? " · mean activity " + (measured ? Math.round(active / measured) : "–") + "% over " +
        measured + " GPUs with samples" : "");
  }

  // A delta that keeps every row in its place repaints its rows only; otherwise lay out and draw again.
  function applyDelta(message) {
    let relayout = message.removed.length > 0;
    const changed = [];
    for (const [key, row] of Object.entries(message.rows)) {
      const old = rows.get(key);
      if (!old || old[0] !== row[0] || old[2] !== row[2] || old[3] !== row[3]) relayout = true;
      for (const cell of row[4]) if (cell[0] >= view.columns) relayout = true;
      rows.set(key, row);
      changed.push(key);
    }
    for (const key of message.removed) rows.delete(key);
    if (relayout || columnCount() !== view.columns) return draw();
    const t0 = performance.now();
    const ratio = window.devicePixelRatio || 1;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    for (const key of changed) drawRow(key);
    updateSummary();
    plot.dataset.cells = String(stats.cells);
    return performance.now() - t0;
  }

  // ------------------------------------------------------------------------------ hover and click

  // The row key and cell under a point of the canvas (CSS pixels), or null.
  function hit(x, y) {
    const step = view.size + view.gap;
    for (const g of view.groups) {
      const top = g.top + HEADER;
      if (y < top || y >= top + g.lines * step) continue;
      const line = Math.floor((y - top) / step);
      if (y - top - line * step >= view.size) return null; // in the gap
      const band = Math.floor(x / view.bandWidth);
      const bx = x - band * view.bandWidth - (view.labels ? LABEL_WIDTH : 0);
      const column = Math.floor(bx / step);
      if (bx < 0 || column >= view.columns || bx - column * step >= view.size) return null;
      const key = g.keys[band * g.lines + line];
      if (key === undefined) return null;
      const cell = rows.get(key)[4].find((c) => c[0] === column);
      return cell ? { key, row: rows.get(key), cell } : null;
    }
    return null;
  }

  // For tests and scripts: the page coordinates of a GPU's block centre, or null.
  window.heatmapCellCenter = function (key, index) {
    const at = view.place.get(key);
    if (!at) return null;
    const box = canvas.getBoundingClientRect(), step = view.size + view.gap;
    return { x: box.left + at.x + index * step + view.size / 2, y: box.top + at.y + view.size / 2 };
  };

  window.heatmapRows = () => Object.fromEntries(rows); // the rows the page holds (tests, debugging)

  function gpuUrl(row, cell, suffix) {
    return cfg.base + "c/" + encodeURIComponent(row[0]) + "/nodes/" + encodeURIComponent(row[1]) + "/gpus/" + cell[0] + "/" + suffix;
  }

  function pointAt(event) {
    const box = canvas.getBoundingClientRect();
    return hit(event.clientX - box.left, event.clientY - box.top);
  }

  let hoverTimer = 0, hoverUrl = "";
  function onMove(event) {
    const point = pointAt(event);
    if (!point) {
      tip.hidden = true;
      canvas.style.cursor = "default";
      return;
    }
    const { row, cell } = point;
    canvas.style.cursor = "pointer";
    tip.replaceChildren();
    const head = document.createElement("strong");
    head.textContent = row[1] + " · GPU " + cell[0];
    const u = usageOf(point.key, cell);
    const lines = [row[2] + " · " + (cell[3] || "whole GPU"),
      cell[1] + "/7 compute slices allocated · " + cell[4] + " claim(s)", stateText(cell),
      u && u[0] !== null ? "activity " + u[0] + "%" + (u[1] ? " · allocated but idle" : "") : "no utilization sample",
      row[0] + " · pool " + row[3]];
    tip.append(head);
    for (const text of lines) {
      const div = document.createElement("div");
      div.textContent = text;
      tip.append(div);
    }
    tip.hidden = false;
    const wrap = plot.getBoundingClientRect();
    tip.style.left = Math.min(event.clientX - wrap.left + 14, wrap.width - 260) + "px";
    tip.style.top = event.clientY - wrap.top + 14 + "px";
    const url = gpuUrl(row, cell, "card/");
    if (url === hoverUrl) return;
    hoverUrl = url;
    window.clearTimeout(hoverTimer);
    hoverTimer = window.setTimeout(() => {
      fetch(url, { credentials: "same-origin" })
        .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
        .then((html) => { if (url === hoverUrl) card.innerHTML = html; })
        .catch(() => { card.textContent = "GPU details unavailable"; });
    }, 120);
  }

  function onClick(event) {
    const point = pointAt(event);
    if (point) window.location.assign(gpuUrl(point.row, point.cell, ""));
  }

  // --------------------------------------------------------------------------------------- the feed

  function rendered() {
    setStatus("live", "v" + version);
    plot.dataset.rendered = String(version);
  }

  function onMessage(event) {
    const t0 = performance.now();
    const message = JSON.parse(event.data);
    if (message.type === "snapshot") {
      rows = new Map(Object.entries(message.rows));
      version = message.version;
      attempt = 0;
      stats.snapshots += 1;
      draw();
      stats.renderMs = performance.now() - t0;
      if (!stats.firstRenderAt) stats.firstRenderAt = performance.now(); // ms since navigation start
      rendered();
    } else if (message.type === "delta") {
      if (message.version !== version + 1) {
        // A gap: some delta was lost; ask for a fresh snapshot.
        stats.resyncs += 1;
        socket.send(JSON.stringify({ type: "resync" }));
        return;
      }
      version = message.version;
      stats.deltas += 1;
      applyDelta(message);
      stats.deltaMs = performance.now() - t0; // parse + apply + repaint
      rendered();
    } else if (message.type === "error") {
      setStatus("error", message.message);
    }
  }

  function connect() {
    setStatus(attempt ? "stale" : "connecting", attempt ? "reconnecting" : "");
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + cfg.ws);
    socket.onmessage = onMessage;
    socket.onclose = (event) => {
      if (event.code === 4400) return; // bad filters: reconnecting would not help
      if (event.code === 4401) { setStatus("stale", "logged out: reload to log in"); return; }
      const delay = Math.min(30000, 500 * 2 ** attempt) * (0.5 + Math.random() / 2);
      attempt += 1;
      setStatus("stale", "reconnecting in " + (delay / 1000).toFixed(1) + " s");
      window.setTimeout(connect, delay);
    };
  }

  function legend() {
    const scale = document.getElementById("heatmap-scale");
    const utilization = mode === "utilization";
    scale.replaceChildren();
    document.getElementById("heatmap-scale-label").textContent = utilization
      ? "Graphics-engine activity per physical GPU (DCGM):" : "Allocated compute slices per physical GPU:";
    document.getElementById("legend-gap").hidden = !utilization;
    COLORS.forEach((color, k) => {
      const step = document.createElement("span");
      step.className = "step";
      step.style.background = color;
      step.style.color = k >= 5 ? INK : "#ffffff";
      step.textContent = utilization ? Math.round((100 * k) / 7) + "%" : k + "/7";
      scale.append(step);
    });
  }

  function showUsageStatus() {
    const when = (iso) => new Date(iso).toLocaleString([], { weekday: "short", hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
    if (usage.unavailable_since) {
      usageStatus.textContent = "utilization unavailable since " + when(usage.unavailable_since);
      plot.dataset.usage = "unavailable";
    } else if (usage.sampled_at) {
      usageStatus.textContent = "utilization sampled " + when(usage.sampled_at) + " · idle: below " +
        usage.below_percent + "% for " + usage.idle_window_minutes + " min";
      plot.dataset.usage = "loaded";
    } else {
      usageStatus.textContent = "no utilization sampled yet";
      plot.dataset.usage = "empty";
    }
  }

  function fetchUsage() {
    fetch(usageUrl, { credentials: "same-origin" })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((body) => {
        usage = body;
        showUsageStatus();
        if (rows.size) draw();
      })
      .catch(() => { usageStatus.textContent = "utilization unavailable"; plot.dataset.usage = "error"; });
  }

  function setMode(next) {
    mode = next;
    modeSelect.value = next;
    plot.dataset.mode = next;
    history.replaceState(null, "", next === "utilization" ? "#utilization" : location.pathname + location.search);
    legend();
    if (rows.size) draw();
  }

  window.heatmapUsage = () => usage; // the utilization the page holds (tests, debugging)

  let resizeTimer = 0;
  window.addEventListener("resize", () => {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(() => { if (rows.size) draw(); }, 150);
  });
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", onClick);
  modeSelect.addEventListener("change", () => setMode(modeSelect.value));
  setMode(mode);
  fetchUsage();
  window.setInterval(fetchUsage, USAGE_POLL_MS);
  connect();
})();

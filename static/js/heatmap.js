/* The live GPU heatmap: a snapshot, then versioned deltas over /ws/fleet/ (see fleet/feed.py).
 * A row is [cluster, node, model, pool, cells]; a cell is [index, slices 0..7, flags, MIG layout, claims].
 * No build step: plain browser JavaScript, plotly.js from our static files. */
"use strict";
(function () {
  const TAINTED = 1, UNAVAILABLE = 2, RESERVED = 4, UNRESERVED = 8;
  const cfg = JSON.parse(document.getElementById("heatmap-config").textContent);
  const plot = document.getElementById("heatmap");
  const live = document.getElementById("live");
  const card = document.getElementById("gpu-card");
  const summary = document.getElementById("heatmap-summary");
  const stats = (window.heatmapStats = { snapshots: 0, deltas: 0, resyncs: 0, renderMs: 0, deltaMs: 0, cells: 0, firstRenderAt: 0 });
  let rows = new Map();
  let version = 0;
  let order = [];
  let position = new Map(); // row key -> y position
  let matrix = { z: [], custom: [] };
  let revision = 0;
  let socket = null;
  let attempt = 0;

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

  function rowLine(row, columns) {
    const z = new Array(columns).fill(null);
    const custom = new Array(columns).fill(null);
    for (const cell of row[4]) {
      z[cell[0]] = cell[1] / 7;
      custom[cell[0]] = [row[1], cell[0], row[2], cell[3] || "whole GPU", cell[1], cell[4], stateText(cell), row[0], row[3]];
    }
    return { z, custom };
  }

  function columnCount() {
    let columns = 1;
    for (const row of rows.values()) for (const cell of row[4]) columns = Math.max(columns, cell[0] + 1);
    return columns;
  }

  function rebuild() {
    order = Array.from(rows.keys()).sort(compareRows);
    position = new Map(order.map((key, i) => [key, i]));
    const columns = columnCount();
    matrix = { z: [], custom: [], columns };
    for (const key of order) {
      const line = rowLine(rows.get(key), columns);
      matrix.z.push(line.z);
      matrix.custom.push(line.custom);
    }
  }

  function labels() {
    const clusters = new Set(order.map((key) => rows.get(key)[0]));
    return order.map((key) => (clusters.size > 1 ? key : rows.get(key)[1]));
  }

  function markers(y) {
    const tainted = { x: [], y: [] }, leaked = { x: [], y: [] };
    let gpus = 0, used = 0, taintedCount = 0;
    order.forEach((key, r) => {
      for (const cell of rows.get(key)[4]) {
        gpus += 1;
        used += cell[1];
        if (cell[2] & TAINTED) { tainted.x.push(cell[0]); tainted.y.push(y[r]); taintedCount += 1; }
        if (cell[2] & UNRESERVED) { leaked.x.push(cell[0]); leaked.y.push(y[r]); }
      }
    });
    stats.cells = gpus;
    const pct = gpus ? Math.round((100 * used) / (7 * gpus)) : 0;
    summary.textContent = gpus + " GPUs on " + order.length + " nodes · " + used + " of " + 7 * gpus +
      " compute slices allocated (" + pct + "%) · " + taintedCount + " tainted";
    return { tainted, leaked };
  }

  function groupShapes(y) {
    const shapes = [], annotations = [];
    let start = 0;
    for (let r = 1; r <= order.length; r++) {
      const prev = rows.get(order[r - 1]);
      const next = r < order.length ? rows.get(order[r]) : null;
      if (next && next[0] === prev[0] && next[2] === prev[2]) continue;
      if (next) shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: r - 0.5, y1: r - 0.5, line: { color: "#ffffff", width: 2 } });
      annotations.push({ xref: "paper", x: 1.005, xanchor: "left", yref: "y", y: y[Math.floor((start + r - 1) / 2)],
        text: prev[2] + (order.length > 1 ? " (" + (r - start) + ")" : ""), showarrow: false, font: { size: 12, color: "#1d2330" } });
      start = r;
    }
    return { shapes, annotations };
  }

  function draw() {
    const t0 = performance.now();
    const y = labels();
    const marks = markers(y);
    const groups = groupShapes(y);
    revision += 1;
    const height = Math.max(300, Math.min(2400, order.length * 18 + 120));
    const traces = [
      {
        type: "heatmap", z: matrix.z.slice(), customdata: matrix.custom.slice(), y: y,
        x: Array.from({ length: matrix.columns }, (_, i) => i),
        zmin: 0, zmax: 1, colorscale: "Cividis", xgap: 2, ygap: 2, hoverongaps: false,
        colorbar: { title: { text: "allocated" }, tickvals: [0, 1 / 7, 2 / 7, 3 / 7, 4 / 7, 5 / 7, 6 / 7, 1],
          ticktext: ["0/7", "1/7", "2/7", "3/7", "4/7", "5/7", "6/7", "7/7"], len: Math.min(1, 500 / height), y: 1, yanchor: "top", x: 1.15, xanchor: "left" },
        hovertemplate: "<b>%{customdata[0]}</b> · GPU %{customdata[1]}<br>%{customdata[2]} · %{customdata[3]}<br>" +
          "%{customdata[4]}/7 compute slices allocated · %{customdata[5]} claim(s)<br>%{customdata[6]}<extra>%{customdata[7]} · pool %{customdata[8]}</extra>",
      },
      { type: "scatter", mode: "markers", name: "tainted", x: marks.tainted.x, y: marks.tainted.y, hoverinfo: "skip",
        marker: { symbol: "x-thin", size: 11, line: { width: 3, color: "#D55E00" } } },
      { type: "scatter", mode: "markers", name: "allocated, no consumer", x: marks.leaked.x, y: marks.leaked.y, hoverinfo: "skip",
        marker: { symbol: "circle-open", size: 10, color: "#CC79A7", line: { width: 2.5, color: "#CC79A7" } } },
    ];
    const layout = {
      datarevision: revision, height: height, showlegend: false, uirevision: "keep",
      margin: { l: 150, r: 190, t: 40, b: 20 }, paper_bgcolor: "#ffffff", plot_bgcolor: "#eef1f6",
      // Explicit ranges: marker traces would otherwise pad the category axes.
      xaxis: { title: { text: "GPU index" }, side: "top", dtick: 1, range: [-0.5, matrix.columns - 0.5] },
      yaxis: { type: "category", range: [order.length - 0.5, -0.5], automargin: true },
      shapes: groups.shapes, annotations: groups.annotations,
    };
    return Plotly.react(plot, traces, layout, { displaylogo: false, responsive: true }).then(() => performance.now() - t0);
  }

  function applyDelta(message) {
    let reshaped = false;
    for (const key of message.removed) {
      if (rows.delete(key)) reshaped = true;
    }
    const changed = [];
    for (const [key, row] of Object.entries(message.rows)) {
      if (!rows.has(key)) reshaped = true;
      rows.set(key, row);
      changed.push(key);
    }
    if (reshaped || columnCount() !== matrix.columns) {
      rebuild();
      return true;
    }
    for (const key of changed) {
      const r = position.get(key);
      const line = rowLine(rows.get(key), matrix.columns);
      matrix.z[r] = line.z;
      matrix.custom[r] = line.custom;
    }
    return false;
  }

  // Same rows and columns: only the values and the markers change, not the axes, groups or layout.
  function restyle() {
    const marks = markers(labels());
    return Plotly.restyle(plot, {
      z: [matrix.z.slice(), undefined, undefined], customdata: [matrix.custom.slice(), undefined, undefined],
      x: [undefined, marks.tainted.x, marks.leaked.x], y: [undefined, marks.tainted.y, marks.leaked.y],
    }, [0, 1, 2]);
  }

  function onMessage(event) {
    const message = JSON.parse(event.data);
    if (message.type === "snapshot") {
      rows = new Map(Object.entries(message.rows));
      version = message.version;
      attempt = 0;
      stats.snapshots += 1;
      const t0 = performance.now();
      rebuild();
      draw().then((ms) => {
        stats.renderMs = performance.now() - t0;
        if (!stats.firstRenderAt) stats.firstRenderAt = performance.now(); // ms since navigation start
        setStatus("live", "v" + version);
        plot.dataset.rendered = String(version);
      });
    } else if (message.type === "delta") {
      if (message.version !== version + 1) {
        // A gap: some delta was lost; ask for a fresh snapshot.
        stats.resyncs += 1;
        socket.send(JSON.stringify({ type: "resync" }));
        return;
      }
      version = message.version;
      stats.deltas += 1;
      const t0 = performance.now();
      const redraw = applyDelta(message) ? draw() : restyle();
      redraw.then(() => {
        stats.deltaMs = performance.now() - t0;
        setStatus("live", "v" + version);
        plot.dataset.rendered = String(version);
      });
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

  function gpuUrl(point, suffix) {
    const c = point.customdata;
    return cfg.base + "c/" + encodeURIComponent(c[7]) + "/nodes/" + encodeURIComponent(c[0]) + "/gpus/" + c[1] + "/" + suffix;
  }

  let hoverTimer = 0, hoverUrl = "";
  function onHover(event) {
    const point = event.points && event.points[0];
    if (!point || !point.customdata) return;
    const url = gpuUrl(point, "card/");
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
    const point = event.points && event.points[0];
    if (point && point.customdata) window.location.assign(gpuUrl(point, ""));
  }

  Plotly.newPlot(plot, [], { height: 300, margin: { t: 20 } }, { displaylogo: false, responsive: true }).then(() => {
    plot.on("plotly_hover", onHover);
    plot.on("plotly_click", onClick);
    connect();
  });
})();

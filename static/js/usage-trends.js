/* The trends page: allocated vs active GPUs per group over time (Plotly from our static files). */
"use strict";
(function () {
  const el = document.getElementById("trends-chart");
  if (!el) return;
  const data = JSON.parse(document.getElementById("trends-data").textContent);
  const fields = data.window.group.split(",");
  const gapMs = data.window.gap_seconds * 1000;
  const series = new Map();
  for (const p of data.points) {
    const key = [p.cluster, ...fields.map((f) => p[f] || "(free)")].join(" · ");
    if (!series.has(key)) series.set(key, { x: [], allocated: [], active: [], last: null });
    const s = series.get(key);
    const at = Date.parse(p.time);
    if (s.last !== null && at - s.last > gapMs) {
      // Rounds were missed here (Prometheus down, no worker): a gap in both lines, not a straight line.
      s.x.push(new Date(s.last + gapMs / 2).toISOString());
      s.allocated.push(null);
      s.active.push(null);
    }
    s.last = at;
    s.x.push(p.time);
    s.allocated.push(p.allocated);
    s.active.push(p.measured ? p.active : null); // nothing measured: a gap, not 0
  }
  const traces = [];
  for (const [key, s] of series) {
    traces.push({ type: "scatter", mode: "lines", name: key + " allocated", x: s.x, y: s.allocated, legendgroup: key,
      connectgaps: false });
    traces.push({ type: "scatter", mode: "lines", name: key + " active", x: s.x, y: s.active, legendgroup: key,
      line: { dash: "dot" }, connectgaps: false });
  }
  window.Plotly.newPlot(el, traces, { height: 420, margin: { l: 48, r: 12, t: 12, b: 36 }, yaxis: { title: { text: "GPUs" } },
    legend: { orientation: "h" } }, { displaylogo: false, responsive: true });
  el.dataset.state = "plotted";
})();

/* The triage page's chart: allocated share of each model's compute slices over the window, from the report
 * embedded in the page (the same data as /api/v1/triage/). plotly.js comes from our static files. */
"use strict";
(function () {
  const report = JSON.parse(document.getElementById("triage-data").textContent);
  const chart = document.getElementById("allocation-chart");
  const clusters = new Set(report.allocation.map((s) => s.cluster));
  const traces = report.allocation.map((s) => ({
    type: "scatter",
    mode: "lines",
    line: { shape: "hv", width: 2 },
    name: clusters.size > 1 ? s.cluster + " " + s.model : s.model,
    x: s.time,
    y: s.allocated.map((a, i) => (s.total[i] ? (100 * a) / s.total[i] : 0)),
    customdata: s.allocated.map((a, i) => [a, s.total[i]]),
    hovertemplate: "%{y:.0f}% (%{customdata[0]:.0f} / %{customdata[1]:.0f} slices)<extra>%{fullData.name}</extra>",
  }));
  const layout = {
    margin: { t: 16, r: 16, b: 40, l: 56 },
    yaxis: { title: { text: "allocated %" }, range: [0, 105], ticksuffix: "%" },
    xaxis: { type: "date", range: [report.window.since, report.window.until] },
    legend: { orientation: "h", y: -0.2 },
    annotations: traces.length ? [] : [{ text: "No allocation samples in this window", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }],
  };
  Plotly.newPlot(chart, traces, layout, { displaylogo: false, responsive: true }).then(() => {
    chart.dataset.rendered = String(traces.length);
  });

  // MIG exhaustion as a timeline: one bar per (model, profile) from the first to the last diagnosis that
  // found it exhausted while bigger slices sat idle.
  const mig = document.getElementById("mig-chart");
  if (mig && report.mig_exhaustion.length) {
    const rows = report.mig_exhaustion;
    const label = (m) => (clusters.size > 1 ? m.cluster + " " : "") + m.model + " " + m.profile;
    const idle = (m) => Object.entries(m.idle_bigger).map(([p, n]) => n + " × " + p + " idle").join(", ");
    const bars = [{
      type: "bar",
      orientation: "h",
      y: rows.map(label),
      base: rows.map((m) => m.start),
      x: rows.map((m) => m.seconds * 1000),
      marker: { color: "#0b6bcb" },
      customdata: rows.map((m) => [m.waiting, idle(m)]),
      hovertemplate: "%{base|%a %H:%M} → %{x}<br>%{customdata[0]} waiting; %{customdata[1]}<extra>%{y}</extra>",
    }];
    const migLayout = {
      margin: { t: 8, r: 16, b: 32, l: 120 },
      height: 80 + 36 * rows.length,
      xaxis: { type: "date", range: [report.window.since, report.window.until] },
      showlegend: false,
    };
    Plotly.newPlot(mig, bars, migLayout, { displaylogo: false, responsive: true }).then(() => {
      mig.dataset.rendered = String(rows.length);
    });
  }
})();

/* 24-hour utilization charts on GPU, node and claim pages: /usage/series.json (usage/charts.py) plotted with
 * Plotly from our static files. Steps without a sample arrive as null and stay gaps (connectgaps off). */
"use strict";
(function () {
  const LAYOUT = { margin: { l: 48, r: 12, t: 28, b: 36 }, height: 260, showlegend: true, legend: { orientation: "h" },
    yaxis: { range: [0, 100], ticksuffix: "%" }, xaxis: { type: "date" } };

  function plot(el, title, traces) {
    const data = traces.map((t) => ({ type: "scatter", mode: "lines", name: t.name, x: t.x, y: t.y, connectgaps: false }));
    window.Plotly.newPlot(el, data, { ...LAYOUT, title: { text: title, font: { size: 13 } } },
      { displaylogo: false, responsive: true });
  }

  for (const box of document.querySelectorAll(".usage-charts[data-url]")) {
    const status = box.querySelector(".usage-chart-status");
    fetch(box.dataset.url, { credentials: "same-origin" })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((body) => {
        if (body.unavailable) {
          status.textContent = body.unavailable;
          box.dataset.state = "unavailable";
          return;
        }
        if (!body.activity.length && !body.memory.length) {
          status.textContent = "no utilization series for this in the last 24 hours";
          box.dataset.state = "empty";
          return;
        }
        status.textContent = "";
        plot(box.querySelector(".usage-activity"), "Graphics-engine activity", body.activity);
        plot(box.querySelector(".usage-memory"), "Framebuffer used", body.memory);
        box.dataset.state = "plotted";
      })
      .catch((err) => { status.textContent = "utilization unavailable (" + err + ")"; box.dataset.state = "error"; });
  }
})();

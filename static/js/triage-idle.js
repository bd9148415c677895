/* The triage report's "GPUs held idle" section: the idle report of the same window from /api/v1/idle/
 * (usage/report.py), as sentences and a table of idle GPU-hours per namespace and model. */
"use strict";
(function () {
  const box = document.getElementById("idle-section");
  if (!box) return;

  function element(tag, text, className) {
    const el = document.createElement(tag);
    if (text !== undefined) el.textContent = text;
    if (className) el.className = className;
    return el;
  }

  fetch(box.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
    .then((report) => {
      box.replaceChildren();
      if (report.unavailable_since) {
        box.append(element("p", "Utilization unavailable since " + new Date(report.unavailable_since).toLocaleString([], { hourCycle: "h23" }) + ".", "warning"));
      }
      if (!report.claims.length) {
        box.append(element("p", "No claim held GPUs idle in this window (or no utilization was sampled).", "muted"));
        box.dataset.state = "empty";
        return;
      }
      const list = element("ul");
      list.id = "idle-sentences";
      for (const c of report.claims.slice(0, 20)) {
        const hours = c.gpus ? c.idle_gpu_hours / c.gpus : 0;
        let text = c.gpus + " " + c.model + (c.profile ? " " + c.profile : "") + " idle for " + hours.toFixed(1) +
          " h held by " + c.namespace + "/" + c.claim;
        if (c.blocked) text += " while " + c.blocked + " claims waited for " + c.model;
        list.append(element("li", text));
      }
      box.append(list);
      const table = element("table", undefined, "grid");
      table.id = "idle-waste-triage";
      const head = table.createTHead().insertRow();
      for (const h of ["Namespace", "Model", "Claims", "GPU-hours idle"]) head.append(element("th", h));
      const body = table.createTBody();
      for (const w of report.waste) {
        const row = body.insertRow();
        row.append(element("td", w.namespace), element("td", w.model), element("td", String(w.claims), "num"),
          element("td", w.idle_gpu_hours.toFixed(1), "num"));
      }
      box.append(table);
      box.dataset.state = "loaded";
    })
    .catch((err) => { box.textContent = "Idle GPUs unavailable (" + err + ")"; box.dataset.state = "error"; });
})();

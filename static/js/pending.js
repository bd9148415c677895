/* The pending page, live: /ws/pending/ says when pending claims or their diagnoses changed; the page then
 * refetches its grouped rows (the same query string, served with the user's visibility) and swaps them in.
 * The fragment is the truth, so a missed message costs nothing but delay. No build step. */
"use strict";
(function () {
  const live = document.getElementById("live");
  const target = document.getElementById("pending-groups");
  const wsPath = JSON.parse(document.getElementById("pending-ws").textContent);
  const stats = (window.pendingStats = { messages: 0, refreshes: 0, version: 0 });
  let socket = null;
  let attempt = 0;
  let timer = null;
  let inflight = false;
  let again = false;

  function setStatus(state, detail) {
    live.className = "status " + state;
    live.dataset.state = state;
    live.dataset.version = String(stats.version);
    live.textContent = detail ? state + " · " + detail : state;
  }

  async function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    try {
      const response = await fetch(target.dataset.fragment, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } });
      if (response.redirected) {
        setStatus("forbidden", "log in again"); // the session ended: the login page is not our fragment
      } else if (response.ok) {
        target.innerHTML = await response.text();
        stats.refreshes += 1;
        target.dataset.refreshes = String(stats.refreshes);
        setStatus("live");
      } else {
        setStatus("error", "HTTP " + response.status);
      }
    } catch (err) {
      setStatus("error", "refresh failed");
    } finally {
      inflight = false;
      if (again) { again = false; refresh(); }
    }
  }

  function schedule() {
    // Coalesce bursts (a recompute stores many diagnoses): one refetch per 300 ms at most.
    if (timer === null) timer = setTimeout(function () { timer = null; refresh(); }, 300);
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + wsPath);
    socket.onopen = function () { attempt = 0; };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      stats.messages += 1;
      if (message.type === "hello") {
        const reconnected = stats.version > 0;
        stats.version = message.version;
        setStatus("live");
        if (reconnected) schedule(); // changes may have been missed while disconnected
      } else if (message.type === "changed") {
        stats.version = message.version;
        schedule();
      } else if (message.type === "error") {
        setStatus("error", message.message);
      }
    };
    socket.onclose = function (event) {
      if (event.code === 4401) { setStatus("forbidden", "log in again"); return; }
      if (event.code === 4400) return;
      attempt += 1;
      const delay = Math.min(30000, 500 * 2 ** Math.min(attempt, 6));
      setStatus("backoff", "reconnecting");
      setTimeout(connect, delay);
    };
  }

  connect();
})();

"use strict";
// The dashboard: polls /dashboard/data (the token, when given, adds sessions and tools)
// and draws the last minutes on plain canvases. Everything from the server is put in
// the page as text, never as HTML.
(function () {
  const ROOT = document.querySelector('meta[name="protoflask-root"]').content;
  const POLL_MS = 1000;
  const HISTORY_MS = 5 * 60 * 1000;
  const $ = (id) => document.getElementById(id);

  // -- token and tabs (shared with the playground) --------------------------------------
  const tokenInput = $("token");
  const params = new URLSearchParams(location.search);
  const fragment = new URLSearchParams(location.hash.slice(1));
  tokenInput.value = fragment.get("token") || params.get("token")
    || sessionStorage.getItem("protoflask-token") || "";
  if (fragment.get("token") || params.get("token")) {
    // read once and kept for this tab only: out of the address bar, the browser's
    // history and any link copied from it
    sessionStorage.setItem("protoflask-token", tokenInput.value.trim());
    const clean = new URL(location.href);
    clean.hash = "";
    clean.searchParams.delete("token");
    window.history.replaceState(null, "", clean);
  }
  tokenInput.addEventListener("change", () => {
    sessionStorage.setItem("protoflask-token", tokenInput.value.trim());
    lastSample = 0;
    history.length = 0;
    poll();
  });
  window.protoflaskToken = () => tokenInput.value.trim();

  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => {
      for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t === tab);
      for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== tab.dataset.tab;
    });
  }

  // -- numbers -----------------------------------------------------------------------------
  function show(id, value, text) {
    const el = $(id);
    el.dataset.value = String(value);
    el.textContent = text === undefined ? String(value) : text;
  }

  function duration(ms) {
    const s = Math.floor(ms / 1000);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
  }

  // Whose numbers these are: in a cluster each poll may be answered by another worker,
  // so the page says which figures are cluster-wide and which are the answering node's.
  function renderScope(data) {
    let el = $("dash-scope");
    if (!el) {
      el = document.createElement("p");
      el.id = "dash-scope";
      el.className = "note";
      $("dash-status").after(el);
    }
    const scope = data.scope || {};
    el.dataset.scope = scope.stats || "server";
    el.textContent = scope.stats === "cluster"
      ? `Cluster-wide figures (${scope.nodes} live node${scope.nodes === 1 ? "" : "s"}); ` +
        `this poll was answered by node ${data.node}, whose own are the transports line, ` +
        "the sessions/pending/tools cards and the charts."
      : "Figures of this server (one process).";
  }

  function render(data) {
    renderScope(data);
    const st = data.stats;
    show("stat-activeConnections", st.activeConnections);
    show("stat-totalConnections", st.totalConnections);
    show("stat-totalMessages", st.totalMessages);
    show("stat-messagesPerSecond", st.messagesPerSecond);
    show("stat-averageLatency", st.averageLatency);
    show("stat-errorRate", st.errorRate, (st.errorRate * 100).toFixed(2) + " %");
    show("stat-uptime", st.uptime, duration(st.uptime));
    const here = (data.scope || {}).stats === "cluster" ? "this node: " : "";
    const kinds = Object.entries(data.transports).map(([kind, t]) => `${kind} ${t.active}`);
    $("stat-transports").textContent = here + (kinds.join(" · ") || (here ? "none" : ""));
    const g = data.gauges;
    show("gauge-sessions", g.connected, `${g.connected} / ${g.disconnected}`);
    show("gauge-pending", g.pending);
    show("gauge-tools", g.toolsRunning, `${g.toolsRunning} / ${g.toolsQueued}`);
    renderSessions(data);
    renderTools(data.tools);
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }

  function renderSessions(data) {
    const body = $("sessions").tBodies[0];
    body.replaceChildren();
    const access = data.access;
    const note = $("sessions-note");
    const operator = window.protoflaskOperator;  // operator.js: the operator's buttons
    if (operator) operator.heading($("sessions").tHead.rows[0]);
    if (access.sessions === "none") {
      note.textContent = "Enter a token to list your sessions (development mode lists all).";
      return;
    }
    note.textContent = (access.operator
      ? `All sessions (operator): ${data.sessionsListed}`
      : access.sessions === "all"
      ? `All sessions (development mode): ${data.sessionsListed}`
      : `Sessions of user ${access.user}: ${data.sessionsListed}`)
      + (data.sessionsComplete === false ? " (partial: the cluster holds too many to scan)" : "");
    for (const s of data.sessions) {
      const tr = document.createElement("tr");
      tr.dataset.session = s.id;
      cell(tr, s.id, "mono");
      cell(tr, s.userId);
      cell(tr, s.transport || "–");
      if (s.node) tr.title = `held by node ${s.node}`;
      cell(tr, s.connected ? "yes" : "no (kept for resume)");
      cell(tr, new Date(s.lastActivity).toLocaleTimeString());
      cell(tr, String(s.lastClientSeq));
      cell(tr, String(s.lastDeliveredSeq));
      // a session another node holds has only its shared record: no live queues here
      cell(tr, s.pendingMessages === undefined ? "–" : String(s.pendingMessages));
      cell(tr, String(s.activeRuns));
      cell(tr, s.toolsRunning === undefined ? `on node ${s.node || "none"}`
        : `${s.toolsRunning} running, ${s.toolsQueued} queued`);
      if (operator) operator.decorate(tr, s);
      body.appendChild(tr);
    }
  }

  function renderTools(tools) {
    const body = $("tools").tBodies[0];
    body.replaceChildren();
    for (const tool of tools || []) {
      const tr = document.createElement("tr");
      tr.dataset.tool = tool.name;
      cell(tr, tool.name, "mono");
      cell(tr, tool.description);
      const props = (tool.inputSchema || {}).properties || {};
      cell(tr, Object.entries(props).map(([k, v]) => `${k}: ${v.type || (v.enum ? "enum" : "any")}`).join(", ") || "–", "mono");
      body.appendChild(tr);
    }
  }

  // -- charts: [time ms, value] points over the last minutes ---------------------------
  const history = [];  // [second ms, connections, messages, latency ms, errors]
  let lastSample = 0;

  function drawChart(canvas, points, color, now) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, left = 36, bottom = 16;
    ctx.clearRect(0, 0, w, h);
    const max = Math.max(1, ...points.map((p) => p[1]));
    ctx.strokeStyle = "#d9dde5";
    ctx.fillStyle = "#6b7385";
    ctx.font = "10px sans-serif";
    ctx.beginPath();
    ctx.moveTo(left, 4); ctx.lineTo(left, h - bottom); ctx.lineTo(w - 4, h - bottom);
    ctx.stroke();
    ctx.fillText(String(Math.round(max * 100) / 100), 2, 12);
    ctx.fillText("0", 2, h - bottom);
    ctx.fillText("-5 min", left, h - 3);
    ctx.fillText("now", w - 24, h - 3);
    const x = (t) => left + (w - 4 - left) * (1 - (now - t) / HISTORY_MS);
    const y = (v) => h - bottom - (h - bottom - 6) * (v / max);
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
  }

  function drawCharts() {
    const now = Date.now();
    const recent = history.filter((s) => now - s[0] <= HISTORY_MS);
    drawChart($("chart-connections"), recent.map((s) => [s[0], s[1]]), "#2f6fde", now);
    drawChart($("chart-messages"), recent.map((s) => [s[0], s[2]]), "#1f8a4c", now);
    drawChart($("chart-latency"), recent.map((s) => [s[0], s[3]]), "#a4501b", now);
  }

  // -- polling -------------------------------------------------------------------------
  let timer = null;
  async function poll() {
    clearTimeout(timer);
    const status = $("dash-status");
    const headers = {};
    // with the operator's token (operator.js), every session; else the user's own
    const operator = window.protoflaskOperator && window.protoflaskOperator.source(lastSample);
    const token = operator ? operator.token : window.protoflaskToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    try {
      const resp = await fetch(operator ? operator.url : `${ROOT}dashboard/data?since=${lastSample}`,
                               {headers});
      const data = await resp.json();
      if (!resp.ok) {
        status.textContent = `${data.error.code}: ${data.error.message}`;
        status.classList.add("bad");
      } else {
        for (const sample of data.history) history.push(sample);
        if (history.length) lastSample = history[history.length - 1][0];
        while (history.length > 300) history.shift();
        render(data);
        drawCharts();
        status.textContent = `updated ${new Date().toLocaleTimeString()}`;
        status.classList.remove("bad");
        window.dashboardData = data;  // for tests and the curious
      }
    } catch (e) {
      status.textContent = `server unreachable: ${e}`;
      status.classList.add("bad");
    }
    timer = setTimeout(poll, POLL_MS);
  }
  window.dashboardPoll = poll;
  poll();
})();

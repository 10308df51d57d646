"use strict";
// The dashboard's operator controls (docs/OPERATIONS.md, "Operator actions"): shown only
// when the server has an operatorToken (GET dashboard/operator says so). The operator's
// token is kept in this tab's sessionStorage, never in the URL; with it the dashboard lists
// every session, each with Disconnect and Send, and the Broadcast form sends to all.
// dashboard.js asks this file where to poll (source) and for each row's buttons (decorate).
(function () {
  const ROOT = document.querySelector('meta[name="protoflask-root"]').content;
  const KEY = "protoflask-operator-token";
  const $ = (id) => document.getElementById(id);
  let enabled = false;

  const tokenInput = $("operator-token");
  tokenInput.value = sessionStorage.getItem(KEY) || "";
  const token = () => (enabled ? tokenInput.value.trim() : "");

  function report(text, bad) {
    const status = $("operator-status");
    status.textContent = text;
    status.classList.toggle("bad", !!bad);
  }

  // The message of the form: type, channel and a JSON object payload.
  function message() {
    let payload;
    try {
      payload = JSON.parse($("operator-payload").value || "{}");
    } catch (e) {
      throw new Error(`the payload is not JSON: ${e.message}`);
    }
    return {type: $("operator-type").value.trim(), channel: $("operator-channel").value, payload};
  }

  async function act(path, body, done) {
    try {
      const resp = await fetch(ROOT + path, {
        method: "POST",
        headers: {"Authorization": `Bearer ${token()}`, "Content-Type": "application/json"},
        body: body === undefined ? "" : JSON.stringify(body),
      });
      const answer = await resp.json();
      if (resp.ok) report(done(answer), false);
      else report(`${answer.error.code}: ${answer.error.message}`, true);
      if (window.dashboardPoll) window.dashboardPoll();
    } catch (e) {
      report(String(e.message || e), true);
    }
  }

  function button(text, action, title) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "small";
    b.textContent = text;
    b.dataset.action = action;
    if (title) b.title = title;
    return b;
  }

  $("sessions").addEventListener("click", (event) => {
    const b = event.target.closest("button[data-action]");
    const row = b && b.closest("tr[data-session]");
    if (!row) return;
    const id = row.dataset.session;
    const path = `dashboard/sessions/${encodeURIComponent(id)}/${b.dataset.action}`;
    if (b.dataset.action === "disconnect") {
      act(path, undefined, (a) => a.disconnected ? `disconnected ${id}`
        : `${id} had no live connection`);
    } else {
      let body;
      try { body = message(); } catch (e) { report(e.message, true); return; }
      act(path, body, () => `sent ${body.type} to ${id}`);
    }
  });

  $("operator-form").addEventListener("submit", (event) => {
    event.preventDefault();
    let body;
    try { body = message(); } catch (e) { report(e.message, true); return; }
    act("dashboard/broadcast", body, (a) => `broadcast ${body.type}: reached ${a.reached}`
      + " session(s) on the answering worker");
  });

  tokenInput.addEventListener("change", () => {
    sessionStorage.setItem(KEY, tokenInput.value.trim());
    if (window.dashboardPoll) window.dashboardPoll();
  });

  window.protoflaskOperator = {
    // where the dashboard polls: with an operator token, every session of the server
    source(since) {
      const t = token();
      return t ? {url: `${ROOT}dashboard/operator/data?since=${since}`, token: t} : null;
    },
    // the first cell of a session's row (in sight on a narrow screen): its buttons
    decorate(tr, session) {
      if (!token()) return;
      const td = document.createElement("td");
      const elsewhere = session.pendingMessages === undefined;
      const off = button("Disconnect", "disconnect",
        elsewhere ? "held by another node: disconnect it there" : "close its connection "
          + "(the client may resume)");
      off.disabled = elsewhere;
      td.append(off, " ", button("Send", "send", "send the message below to this session"));
      tr.insertBefore(td, tr.firstChild);
    },
    // the sessions table's heading: an Operator column while a token is given
    heading(tr) {
      const th = tr.querySelector("th.operator-col");
      if (token() && !th) {
        const cell = document.createElement("th");
        cell.className = "operator-col";
        cell.textContent = "Operator";
        tr.insertBefore(cell, tr.firstChild);
      } else if (!token() && th) {
        th.remove();
      }
    },
  };

  fetch(`${ROOT}dashboard/operator`).then((r) => (r.ok ? r.json() : null)).then((body) => {
    if (!body || !body.operatorActions) return;
    enabled = true;
    $("operator").hidden = false;
    if (window.dashboardPoll) window.dashboardPoll();
  }).catch(() => {});
})();

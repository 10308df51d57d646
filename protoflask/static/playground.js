// The playground: connect with a token over WebSocket, SSE or the HTTP stream, chat, call
// a tool through a form built from its inputSchema (TOOL_LIST), and watch every frame in
// the wire log. It runs on protoclient.mjs, the TypeScript client's browser build
// (clients/js), which keeps the session healthy and resumes it after a drop.
import { ProtoClient, ToolCancelled } from "./protoclient.mjs";

{
  const ROOT = document.querySelector('meta[name="protoflask-root"]').content;
  const MAX_LOG = 500;
  const $ = (id) => document.getElementById(id);
  let client = null;
  let tools = {};
  let currentCall = null;
  let counter = 0;
  let activeRun = null;  // the run started here (Start run), until it ends
  const historyEntries = new Map();  // call record -> its line in the call history
  const agentTexts = {};  // message_id -> the bubble's text node

  // what tests (and a curious developer in the console) can read
  window.playground = {wire: [], chat: [], calls: {}, get client() { return client; }};

  // -- wire log --------------------------------------------------------------------------
  const CONTROL = new Set(["ACK", "PING", "PONG", "FLOW_UPDATE"]);  // hidden by the filter

  function logLine(dir, text, cls, type, msg) {
    const log = $("wire-log");
    const li = document.createElement("li");
    li.className = cls;
    if (msg && CONTROL.has(msg.type)) li.classList.add("control");
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = new Date().toISOString().slice(11, 23);
    li.append(time);
    if (msg) li.addEventListener("click", () => togglePretty(li, msg));
    const mark = document.createElement("span");
    mark.className = "dir";
    mark.textContent = dir;
    li.append(mark);
    if (type) {
      const name = document.createElement("span");
      name.className = "type";
      name.textContent = type;
      li.append(name);
    }
    li.append(document.createTextNode(text));
    log.appendChild(li);
    while (log.children.length > MAX_LOG) log.firstChild.remove();
    log.scrollTop = log.scrollHeight;
  }

  function onFrame(dir, raw, msg) {
    window.playground.wire.push({dir, type: msg.type, seq: msg.seq, raw});
    if (window.playground.wire.length > 5 * MAX_LOG) window.playground.wire.splice(0, MAX_LOG);
    logLine(dir === "in" ? "←" : "→", raw, dir, `${msg.type} #${msg.seq}`, msg);
  }

  function togglePretty(li, msg) {
    const open = li.querySelector("pre");
    if (open) {
      open.remove();
      return;
    }
    const pre = document.createElement("pre");
    pre.textContent = JSON.stringify(msg, null, 2);
    li.append(pre);
  }

  $("log-quiet").addEventListener("change", (e) => $("wire-log").classList.toggle("quiet", e.target.checked));

  function note(text) {
    logLine("·", text, "note-line");
  }

  // -- connection --------------------------------------------------------------------------
  function setConnected(ready) {
    $("disconnect").disabled = !client || client.state === "closed";
    $("drop").disabled = !ready;
    $("raw-send").disabled = !ready;
    $("run-start").disabled = !ready;
    $("run-cancel").disabled = !ready || !activeRun;
    $("chat-send").disabled = !ready;
    $("tool-select").disabled = !ready;
    $("tool-call").disabled = !ready || !Object.keys(tools).length;
  }

  function onState(state, detail) {
    const status = $("conn-status");
    status.classList.toggle("bad", state === "closed");
    status.dataset.state = state;
    if (state === "ready") {
      status.textContent = `ready: session ${client.session} over ${client.transport}`;
      client.listTools().then(setTools, (e) => note(`TOOL_LIST failed: ${e.message}`));
    } else {
      status.textContent = detail ? `${state}: ${detail}` : state;
    }
    setConnected(state === "ready");
  }

  $("connect").addEventListener("click", () => {
    const token = window.protoflaskToken();
    if (!token) {
      onState("closed", "enter a token first");
      return;
    }
    if (client) client.close();
    tools = {};
    // downstream credit on, so the wire log shows the page granting it (FLOW_UPDATE)
    activeRun = null;
    $("run-status").textContent = "";
    const url = $("server-url").value.trim() || ROOT;  // another server: it must allow this origin (CORS)
    const mine = client = new ProtoClient({url, token, transport: $("transport").value,
                                           downstream: {messages: 200, bytes: 1 << 20}});
    client.on("frame", onFrame);
    client.on("state", (state, detail) => { if (client === mine) onState(state, detail); });
    client.on("message", onMessage);
    client.on("error", (e) => note(`ERROR ${e.code}: ${e.message}`));
    readTexts(mine);
    client.connect().catch((e) => {
      if (client === mine) onState("closed", e.message);
    });
    setConnected(false);
  });

  $("disconnect").addEventListener("click", () => client && client.close());
  // as a network failure would: the client reconnects and resumes (state "ready ... resumed")
  $("drop").addEventListener("click", () => client && client.dropConnection());
  $("log-clear").addEventListener("click", () => $("wire-log").replaceChildren());

  // -- incoming ------------------------------------------------------------------------------
  // streamed texts, chunk by chunk as they arrive
  async function readTexts(mine) {
    for await (const chunk of mine.texts()) {
      if (chunk.kind === "start") {
        bubble("agent", chunk.messageId, "");
      } else if (chunk.kind === "part") {
        const node = agentTexts[chunk.messageId] || bubble("agent", chunk.messageId, "");
        node.textContent += chunk.content;
      } else {
        if (agentTexts[chunk.messageId]) window.playground.chat.push({who: "agent", text: chunk.text});
        delete agentTexts[chunk.messageId];
      }
    }
  }

  function onMessage(msg) {
    if (msg.type === "TOOL_LIST") setTools(msg.payload.tools || []);
  }

  // -- chat --------------------------------------------------------------------------------
  function bubble(who, messageId, text) {
    const div = document.createElement("div");
    div.className = `bubble ${who}`;
    const name = document.createElement("span");
    name.className = "who";
    name.textContent = who === "me" ? "you" : "agent";
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    div.append(name, body);
    $("chat").appendChild(div);
    $("chat").scrollTop = $("chat").scrollHeight;
    if (messageId && who === "agent") agentTexts[messageId] = body;
    return body;
  }

  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("chat-input");
    const text = input.value;
    if (!text || !client || client.state !== "ready") return;
    client.sendText(text);
    bubble("me", null, text);
    window.playground.chat.push({who: "me", text});
    input.value = "";
  });

  // -- tools: a form from the inputSchema ----------------------------------------------------
  function setTools(list) {
    tools = {};
    const select = $("tool-select");
    const previous = select.value;
    select.replaceChildren();
    for (const tool of list) {
      tools[tool.name] = tool;
      const option = document.createElement("option");
      option.value = tool.name;
      option.textContent = tool.name;
      select.appendChild(option);
    }
    if (previous && tools[previous]) select.value = previous;
    buildForm();
    setConnected(client && client.state === "ready");
  }

  function fieldKind(schema) {
    if (Array.isArray(schema.enum)) return "enum";
    const type = Array.isArray(schema.type) ? schema.type.find((t) => t !== "null") : schema.type;
    return ["string", "number", "integer", "boolean"].includes(type) ? type : "json";
  }

  function buildForm() {
    const form = $("tool-form");
    form.replaceChildren();
    const tool = tools[$("tool-select").value];
    $("tool-description").textContent = tool ? tool.description : "";
    if (!tool) return;
    const schema = tool.inputSchema || {};
    const props = schema.properties || {};
    const required = new Set(schema.required || []);
    const names = Object.keys(props);
    if (!names.length) {
      addField(form, "params", "json", {}, false, "params (JSON object)");
      return;
    }
    for (const name of names) {
      addField(form, name, fieldKind(props[name]), props[name], required.has(name));
    }
  }

  function addField(form, name, kind, schema, required, labelText) {
    const label = document.createElement("label");
    label.htmlFor = `param-${name}`;
    label.textContent = (labelText || name) + (required ? " *" : "");
    if (schema.description) label.title = schema.description;
    let input;
    if (kind === "enum") {
      input = document.createElement("select");
      for (const value of schema.enum) {
        const option = document.createElement("option");
        option.value = JSON.stringify(value);
        option.textContent = String(value);
        input.appendChild(option);
      }
    } else if (kind === "json") {
      input = document.createElement("textarea");
      input.placeholder = "JSON";
      if (schema.default !== undefined) input.value = JSON.stringify(schema.default);
      else if (name === "params") input.value = "{}";
    } else {
      input = document.createElement("input");
      input.type = kind === "boolean" ? "checkbox" : kind === "string" ? "text" : "number";
      if (kind === "integer") input.step = "1";
      if (kind === "number") input.step = "any";
      if (schema.default !== undefined) {
        if (kind === "boolean") input.checked = !!schema.default;
        else input.value = String(schema.default);
      }
    }
    input.id = `param-${name}`;
    input.name = name;
    input.dataset.kind = kind;
    input.dataset.required = required ? "1" : "";
    form.append(label, input);
  }

  function readParams() {
    const tool = tools[$("tool-select").value];
    const params = {};
    for (const input of $("tool-form").querySelectorAll("[data-kind]")) {
      const {kind, required} = input.dataset;
      const empty = kind !== "boolean" && input.value.trim() === "";
      if (empty && !required) continue;
      if (empty) {
        input.setAttribute("aria-invalid", "true");
        input.focus();
        throw new Error(`${input.name} is required`);
      }
      input.removeAttribute("aria-invalid");
      let value;
      if (kind === "boolean") value = input.checked;
      else if (kind === "number" || kind === "integer") {
        value = Number(input.value);
        if (!Number.isFinite(value) || (kind === "integer" && !Number.isInteger(value))) {
          throw new Error(`${input.name}: not ${kind === "integer" ? "an integer" : "a number"}`);
        }
      }
      else if (kind === "enum" || kind === "json") {
        try { value = JSON.parse(input.value); } catch (e) {
          throw new Error(`${input.name}: not valid JSON (${e.message})`);
        }
      } else value = input.value;
      if (input.name === "params" && !Object.keys((tool.inputSchema || {}).properties || {}).length) {
        return value;
      }
      params[input.name] = value;
    }
    return params;
  }

  $("tool-select").addEventListener("change", buildForm);

  $("tool-call").addEventListener("click", () => {
    const result = $("tool-result");
    let params;
    try {
      params = readParams();
    } catch (e) {
      result.textContent = e.message;
      result.classList.add("bad");
      return;
    }
    const callId = `web-call-${++counter}`;
    const tool = $("tool-select").value;
    const record = window.playground.calls[callId] = {tool, params, updates: [], done: null};
    const entry = document.createElement("li");
    entry.textContent = `${tool} ${JSON.stringify(params)}: sent`;
    $("call-history").prepend(entry);
    historyEntries.set(record, entry);
    currentCall = {callId, abort: new AbortController()};
    $("tool-progress").value = 0;
    $("tool-status").textContent = "sent";
    result.textContent = "";
    result.classList.remove("bad");
    $("tool-cancel").disabled = false;
    const mine = currentCall;
    const onProgress = (progress, status, partial) => {
      const update = {call_id: callId, status};
      if (progress !== undefined) update.progress = progress;
      if (partial !== undefined) update.partial = partial;
      record.updates.push(update);
      if (currentCall !== mine) return;
      if (typeof progress === "number") $("tool-progress").value = progress;
      $("tool-status").textContent = status + (typeof progress === "number" ? ` ${progress}%` : "");
      if (partial !== undefined) $("tool-result").textContent = `partial: ${JSON.stringify(partial, null, 2)}`;
    };
    const options = {callId, onProgress, signal: mine.abort.signal};
    if (activeRun) options.runId = activeRun;
    client.callTool(tool, params, options).then(
      (value) => done(mine, record, {call_id: callId, status: "OK", result: value}),
      (e) => done(mine, record, e instanceof ToolCancelled
        ? {call_id: callId, status: "CANCELLED"}
        : {call_id: callId, status: "ERROR", error: {code: e.code || "ERROR", message: e.message}}));
  });

  $("tool-cancel").addEventListener("click", () => {
    if (currentCall) currentCall.abort.abort();  // the client sends TOOL_CANCEL
  });

  function done(mine, record, p) {
    record.done = p;
    const entry = historyEntries.get(record);
    historyEntries.delete(record);
    entry.textContent = `${record.tool} ${JSON.stringify(record.params)}: ${p.status}`
      + (p.status === "OK" ? ` ${JSON.stringify(p.result)}` : p.error ? ` ${p.error.code}` : "");
    entry.classList.toggle("bad", p.status !== "OK");
    if (currentCall !== mine) return;
    const result = $("tool-result");
    $("tool-status").textContent = p.status;
    $("tool-cancel").disabled = true;
    if (p.status === "OK") {
      $("tool-progress").value = 100;
      result.textContent = JSON.stringify(p.result, null, 2);
      result.classList.remove("bad");
    } else {
      result.textContent = p.error ? p.error.message : p.status;
      result.classList.add("bad");
    }
  }

  // -- runs: calls made while a run is active belong to it; cancelling it cancels them -------
  $("run-start").addEventListener("click", () => {
    client.startRun().then((runId) => {
      activeRun = runId;
      $("run-status").textContent = `run ${runId} active`;
      setConnected(client.state === "ready");
    }, (e) => { $("run-status").textContent = `${e.code}: ${e.message}`; });
  });

  $("run-cancel").addEventListener("click", () => {
    const runId = activeRun;
    client.cancelRun(runId).then((r) => {
      if (activeRun === runId) activeRun = null;
      $("run-status").textContent = `run ${runId} ${r.status}`;
      setConnected(client.state === "ready");
    }, (e) => { $("run-status").textContent = `${e.code}: ${e.message}`; });
  });

  // -- a raw message: any type, channel and payload, as the client would send it -----------
  $("raw-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const status = $("raw-status");
    let payload;
    try {
      payload = JSON.parse($("raw-payload").value || "{}");
    } catch (exc) {
      status.textContent = `payload: not valid JSON (${exc.message})`;
      status.classList.add("bad");
      return;
    }
    try {
      const id = client.send($("raw-type").value.trim(), $("raw-channel").value, payload);
      status.textContent = `sent ${id}`;
      status.classList.remove("bad");
    } catch (exc) {
      status.textContent = exc.message;
      status.classList.add("bad");
    }
  });
}

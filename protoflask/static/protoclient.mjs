// protoflask browser client: generated from clients/js by 'npm run build'; do not edit.

// src/errors.ts
var ProtoError = class extends Error {
  constructor(code, message, detail) {
    super(message ? `${code}: ${message}` : code);
    this.name = new.target.name;
    this.code = code;
    this.detail = detail;
  }
};
var ConnectionRefused = class extends ProtoError {
  constructor(status, code, message, detail) {
    super(code, `HTTP ${status} ${message}`, detail);
    this.status = status;
  }
};
var ConnectionFailed = class extends ProtoError {
  constructor(message, cause) {
    super("UNREACHABLE", message);
    this.cause = cause;
  }
};
var ConnectionLost = class extends ProtoError {
};
var ClientTimeout = class extends ProtoError {
  constructor(message) {
    super("TIMEOUT", message);
  }
};
var ToolError = class extends ProtoError {
  constructor(callId, code, message, detail) {
    super(code, message, detail);
    this.callId = callId;
  }
};
var ToolCancelled = class extends ToolError {
  constructor(callId, message = "the tool call was cancelled") {
    super(callId, "CANCELLED", message);
  }
};
var ServerError = class extends ProtoError {
  constructor(code, message, detail, relatedId) {
    super(code, message, detail);
    this.relatedId = relatedId;
  }
};
var RunError = class extends ProtoError {
  constructor(runId, code, message, detail) {
    super(code, message, detail);
    this.runId = runId;
  }
};

// src/transports.ts
async function refusal(resp) {
  let code = "HTTP_" + resp.status;
  let message = resp.statusText || "refused";
  let detail;
  try {
    const body = await resp.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
      detail = body.error.detail;
    }
  } catch {
  }
  return new ConnectionRefused(resp.status, code, message, detail);
}
function endpoint(opts, path, extra) {
  const url = new URL(path, opts.base);
  for (const [key, value] of Object.entries(extra)) {
    if (value !== void 0) url.searchParams.set(key, value);
  }
  return url.href;
}
function resumeQuery(opts) {
  return {
    session: opts.session,
    last_seq: opts.session !== void 0 && opts.lastSeq !== void 0 ? String(opts.lastSeq) : void 0
  };
}
function openLink(kind, opts, on) {
  if (kind === "websocket") return openWebSocket(opts, on);
  if (kind === "sse") return openSse(opts, on);
  return openStream(opts, on);
}
function openWebSocket(opts, on) {
  const Ctor = opts.WebSocket ?? globalThis.WebSocket;
  if (!Ctor) {
    throw new ConnectionFailed("no WebSocket in this runtime: pass one in (options.WebSocket, e.g. from 'ws')");
  }
  const query = { ...resumeQuery(opts) };
  if (opts.credential) query[opts.credential[0]] = opts.credential[1];
  const url = new URL(endpoint(opts, "proto/websocket", query));
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const ws = new Ctor(url.href);
  let opened = false;
  let ended = false;
  let failure = "";
  const finish = (info) => {
    if (ended) return;
    ended = true;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    on.closed(info);
  };
  ws.onopen = () => {
    opened = true;
    on.open(opts.session);
  };
  ws.onmessage = (ev) => {
    on.activity();
    if (typeof ev.data === "string") on.raw(ev.data);
  };
  ws.onclose = (ev) => {
    if (!opened) {
      diagnose(opts, url, failure).then((error) => finish({ code: ev.code || 1006, reason: ev.reason || "refused", error }));
      return;
    }
    finish({ code: ev.code || 1006, reason: ev.reason || "" });
  };
  ws.onerror = (ev) => {
    failure = String(ev?.message ?? ev?.error?.message ?? "");
  };
  return {
    confirmsByPost: false,
    settled: () => Promise.resolve(),
    send(raw) {
      if (!ended && ws.readyState === 1) ws.send(raw);
    },
    close(code = 1e3, reason = "bye") {
      try {
        const terminate = ws.terminate;
        if (code === 1006 && typeof terminate === "function") terminate.call(ws);
        else ws.close(code === 1e3 || code >= 3e3 && code <= 4999 ? code : 3e3, reason);
      } catch {
      }
      finish({ code, reason });
    }
  };
}
async function diagnose(opts, url, failure) {
  try {
    if (/\b426\b/.test(failure)) {
      const plain = new URL(url.href);
      plain.protocol = plain.protocol === "wss:" ? "https:" : "http:";
      plain.searchParams.delete("ticket");
      const resp2 = await opts.fetch(plain.href, { headers: { Authorization: `Bearer ${opts.token}` } });
      if (resp2.status === 426) return await refusal(resp2);
      await resp2.body?.cancel().catch(() => void 0);
    }
    const headers = { Authorization: `Bearer ${opts.token}` };
    let resp = await opts.fetch(new URL("proto/ticket", opts.base).href, { method: "POST", headers });
    if (resp.status === 404) {
      await resp.body?.cancel().catch(() => void 0);
      resp = await opts.fetch(new URL("dashboard/data", opts.base).href, { headers });
    }
    if (resp.status === 401 || resp.status === 403) return await refusal(resp);
    await resp.body?.cancel().catch(() => void 0);
    return new ConnectionFailed(
      'the WebSocket upgrade failed although the server answers HTTP and takes the token: a proxy on the way may not pass WebSocket upgrades (it must forward the Upgrade and Connection headers); transport "sse" or "stream" work without them',
      failure || void 0
    );
  } catch (exc) {
    return new ConnectionFailed(`cannot reach ${opts.base.href}: ${exc}`, exc);
  }
}
function postedLink(poster, finish) {
  return {
    confirmsByPost: true,
    settled: () => poster.idle(),
    send(raw, seq) {
      poster.push(raw, seq);
    },
    close(code = 1e3, reason = "bye") {
      finish({ code, reason });
    }
  };
}
var RETRY_503_MS = 6e4;
var MAX_RETRY_AFTER_MS = 5e3;
function retryAfterMs(resp) {
  const seconds = Number(resp.headers.get("Retry-After"));
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds * 1e3, MAX_RETRY_AFTER_MS) : 1e3;
}
var Poster = class {
  constructor(opts, path, session, on, fail) {
    this.opts = opts;
    this.path = path;
    this.session = session;
    this.on = on;
    this.fail = fail;
    this.queue = [];
    this.busy = false;
    this.dead = false;
    this.idleWaiters = [];
    this.pump = async () => {
      const session = this.session();
      if (this.busy || this.dead || !this.queue.length || session === void 0) return;
      this.busy = true;
      const batch = this.queue.splice(0);
      const seqs = batch.map(([, seq]) => seq);
      const first = Math.min(...seqs);
      const last = Math.max(...seqs);
      try {
        const resp = await this.opts.fetch(endpoint(this.opts, this.path, { session }), {
          method: "POST",
          headers: { Authorization: `Bearer ${this.opts.token}`, "Content-Type": "application/x-ndjson" },
          body: batch.map(([raw]) => raw).join("\n")
        });
        if (resp.status === 202) {
          await resp.body?.cancel().catch(() => void 0);
          this.retryingSince = void 0;
          this.on.confirmed(last, first);
        } else if (resp.status === 503 && Date.now() - (this.retryingSince ?? (this.retryingSince = Date.now())) < RETRY_503_MS) {
          await resp.body?.cancel().catch(() => void 0);
          this.queue.unshift(...batch);
          await new Promise((resolve) => setTimeout(resolve, retryAfterMs(resp)));
        } else {
          const error = await refusal(resp);
          if (resp.status === 413) {
            this.on.confirmed(last, first);
          } else {
            this.fail({ code: 1006, reason: `POST answered ${resp.status}`, error });
          }
        }
      } catch (exc) {
        this.fail({ code: 1006, reason: `POST failed: ${exc}` });
      } finally {
        this.busy = false;
        for (const wake of this.idleWaiters.splice(0)) wake();
      }
      void this.pump();
    };
  }
  push(raw, seq) {
    if (this.dead) return;
    this.queue.push([raw, seq]);
    void this.pump();
  }
  stop() {
    this.dead = true;
    this.queue = [];
  }
  idle() {
    if (!this.busy) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }
};
async function readLines(body, line, chunk) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (; ; ) {
    const { done, value } = await reader.read();
    if (done) break;
    chunk();
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf("\n")) >= 0) {
      let text = buffer.slice(0, at);
      buffer = buffer.slice(at + 1);
      if (text.endsWith("\r")) text = text.slice(0, -1);
      line(text);
    }
  }
  buffer += decoder.decode();
  if (buffer) line(buffer);
}
function openSse(opts, on) {
  const abort = new AbortController();
  let session = opts.session;
  let ended = false;
  let closeEvent;
  const finish = (info) => {
    if (ended) return;
    ended = true;
    poster.stop();
    abort.abort();
    on.closed(info);
  };
  const poster = new Poster(opts, "proto/sse", () => session, on, finish);
  const headers = { Authorization: `Bearer ${opts.token}`, Accept: "text/event-stream" };
  if (opts.session !== void 0 && opts.lastSeq !== void 0) headers["Last-Event-ID"] = `${opts.session}:${opts.lastSeq}`;
  (async () => {
    const resp = await opts.fetch(endpoint(opts, "proto/sse", resumeQuery(opts)), { headers, signal: abort.signal });
    if (resp.status !== 200 || !resp.body) {
      finish({ code: 1006, reason: `HTTP ${resp.status}`, error: await refusal(resp) });
      return;
    }
    let event = "";
    let data = [];
    await readLines(
      resp.body,
      (line) => {
        if (line === "") {
          const text = data.join("\n");
          const name = event || "message";
          event = "";
          data = [];
          if (!text) return;
          if (name === "session") {
            session = JSON.parse(text).session;
            on.open(session);
            void poster.pump();
          } else if (name === "close") {
            const info = JSON.parse(text);
            closeEvent = { code: Number(info.code) || 1e3, reason: String(info.reason || "") };
          } else if (name === "message") {
            on.raw(text);
          }
          return;
        }
        if (line.startsWith(":")) return;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      },
      () => on.activity()
    );
    finish(closeEvent ?? { code: 1006, reason: "the event stream ended" });
  })().catch((exc) => finish(closeEvent ?? { code: 1006, reason: `the event stream failed: ${exc}` }));
  return postedLink(poster, finish);
}
function openStream(opts, on) {
  return opts.duplex ? openDuplexStream(opts, on) : openPostStream(opts, on);
}
function openPostStream(opts, on) {
  const abort = new AbortController();
  let session = opts.session;
  let ended = false;
  const finish = (info) => {
    if (ended) return;
    ended = true;
    poster.stop();
    abort.abort();
    on.closed(info);
  };
  const poster = new Poster(opts, "proto/stream", () => session, on, finish);
  const [hello] = opts.hello();
  (async () => {
    const resp = await opts.fetch(endpoint(opts, "proto/stream", resumeQuery(opts)), {
      method: "POST",
      headers: { Authorization: `Bearer ${opts.token}`, "Content-Type": "application/x-ndjson" },
      body: hello + "\n",
      signal: abort.signal
    });
    if (resp.status !== 200 || !resp.body) {
      finish({ code: 1006, reason: `HTTP ${resp.status}`, error: await refusal(resp) });
      return;
    }
    session = resp.headers.get("Proto-Session") ?? session;
    on.open(session);
    void poster.pump();
    await readLines(resp.body, (line) => line.trim() && on.raw(line), () => on.activity());
    finish({ code: 1006, reason: "the stream ended" });
  })().catch((exc) => finish({ code: 1006, reason: `the stream failed: ${exc}` }));
  return postedLink(poster, finish);
}
function openDuplexStream(opts, on) {
  let ended = false;
  let req;
  const early = [];
  const finish = (info) => {
    if (ended) return;
    ended = true;
    try {
      req?.destroy();
    } catch {
    }
    on.closed(info);
  };
  const [hello] = opts.hello();
  const url = new URL(endpoint(opts, "proto/stream", resumeQuery(opts)));
  const modName = url.protocol === "https:" ? "node:https" : "node:http";
  (async () => {
    const mod = await import(
      /* webpackIgnore: true */
      modName
    );
    if (ended) return;
    req = mod.request(url, {
      method: "POST",
      headers: {
        Authorization: `Bearer ${opts.token}`,
        "Content-Type": "application/x-ndjson",
        "Transfer-Encoding": "chunked"
      }
    });
    req.setNoDelay?.(true);
    req.on("error", (exc) => finish({ code: 1006, reason: `the stream failed: ${exc.message}` }));
    req.on("response", (res) => {
      if (res.statusCode !== 200) {
        const chunks = [];
        res.on("data", (d) => chunks.push(d));
        res.on("end", async () => {
          const text = chunks.map((c) => new TextDecoder().decode(c)).join("");
          const resp = new Response(text, { status: res.statusCode });
          finish({ code: 1006, reason: `HTTP ${res.statusCode}`, error: await refusal(resp) });
        });
        return;
      }
      on.open(res.headers["proto-session"] ?? opts.session);
      const decoder = new TextDecoder();
      let buffer = "";
      res.on("data", (d) => {
        on.activity();
        buffer += decoder.decode(d, { stream: true });
        let at;
        while ((at = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, at).trim();
          buffer = buffer.slice(at + 1);
          if (line && !ended) on.raw(line);
        }
      });
      res.on("end", () => finish({ code: 1006, reason: "the stream ended" }));
      res.on("error", () => finish({ code: 1006, reason: "the stream failed" }));
    });
    req.write(hello + "\n");
    for (const raw of early.splice(0)) req.write(raw + "\n");
  })().catch((exc) => finish({ code: 1006, reason: `the stream failed: ${exc}` }));
  return {
    confirmsByPost: false,
    settled: () => Promise.resolve(),
    send(raw) {
      if (ended) return;
      if (req) req.write(raw + "\n");
      else early.push(raw);
    },
    close(code = 1e3, reason = "bye") {
      finish({ code, reason });
    }
  };
}

// src/client.ts
var PROTO_VERSION = "1.1.2";
var CONTROL = /* @__PURE__ */ new Set([
  "HELLO",
  "PING",
  "PONG",
  "ACK",
  "FLOW_UPDATE",
  "PAUSE_CHANNEL",
  "RESUME_CHANNEL",
  "REPLAY_REQUEST",
  "ERROR"
]);
var NOT_RESENT = /* @__PURE__ */ new Set(["PONG", "ACK", "FLOW_UPDATE"]);
var HEARTBEAT = /* @__PURE__ */ new Set(["PING", "PONG"]);
var NEEDED_EVENTS = ["HELLO", "ERROR", "PING", "PONG", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL"];
var UNLIMITED = Number.MAX_SAFE_INTEGER;
var ACK_EVERY = 32;
var IDLE_MS = 100;
var BACKOFF_FIRST_MS = 20;
var BACKOFF_MAX_MS = 1e3;
var SEEN_WINDOW = 1024 - 256;
var encoder = new TextEncoder();
var byteLength = (text) => encoder.encode(text).length;
function randomId() {
  const c = globalThis.crypto;
  if (c && typeof c.randomUUID === "function") return c.randomUUID().replace(/-/g, "").slice(0, 16);
  return Math.random().toString(36).slice(2, 18);
}
function isNode() {
  const p = globalThis.process;
  return !!(p && p.versions && typeof p.versions.node === "string");
}
var ProtoClient = class {
  constructor(options) {
    this.listeners = {
      state: /* @__PURE__ */ new Set(),
      message: /* @__PURE__ */ new Set(),
      frame: /* @__PURE__ */ new Set(),
      error: /* @__PURE__ */ new Set()
    };
    this.tag = randomId().slice(0, 6);
    this._state = "idle";
    this.token = "";
    this.ticketsUnsupported = false;
    this.linkReady = false;
    this.helloSeq = 0;
    this.closedByUser = false;
    this.reconnectStarted = 0;
    this.backoff = 0;
    this._reconnects = 0;
    // upstream
    this.seq = 0;
    this.counter = 0;
    this.outbox = [];
    this.unconfirmed = [];
    this.refused = [];
    this.upCredit = null;
    this.upInitial = { messages: 0, bytes: 0 };
    this.paused = /* @__PURE__ */ new Set();
    // downstream
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.sinceAck = 0;
    this.down = /* @__PURE__ */ new Map();
    this.openTexts = /* @__PURE__ */ new Map();
    this.textQueue = [];
    this.textWaiters = [];
    // requests
    this.calls = /* @__PURE__ */ new Map();
    this.byEnvelope = /* @__PURE__ */ new Map();
    this.failing = /* @__PURE__ */ new Map();
    this.lastFailed = /* @__PURE__ */ new Map();
    this.runs = /* @__PURE__ */ new Map();
    this.toolLists = [];
    this.pings = /* @__PURE__ */ new Map();
    this.lastHelloRaw = "";
    /** The current connection's response (or upgrade) came: the server answers. */
    this.linkOpened = false;
    if (!options || !options.url) throw new TypeError("ProtoClient: options.url is required");
    if (options.token === void 0 && !options.getToken) {
      throw new TypeError("ProtoClient: give options.token or options.getToken");
    }
    this.opts = options;
    this.transport = options.transport ?? "websocket";
    if (!["websocket", "sse", "stream"].includes(this.transport)) {
      throw new TypeError(`ProtoClient: unknown transport ${JSON.stringify(this.transport)}`);
    }
    if (options.duplex === true && this.transport === "stream" && !isNode()) {
      throw new TypeError("ProtoClient: duplex: true needs Node (its node:http): a browser's fetch cannot write a request body while reading the response; leave duplex out (follow-up POSTs)");
    }
    const here = globalThis.location?.href;
    const base = new URL(options.url, here);
    if (!base.pathname.endsWith("/")) base.pathname += "/";
    this.base = base;
    const f = options.fetch ?? globalThis.fetch;
    if (!f) throw new TypeError("ProtoClient: no fetch in this runtime: pass options.fetch");
    this.fetchImpl = options.fetch ? options.fetch : (input, init) => f(input, init);
    const ds = options.downstream;
    this.downCredit = ds ? {
      messages: typeof ds === "object" && ds.messages || 1e3,
      bytes: typeof ds === "object" && ds.bytes || 16 * 1024 * 1024
    } : null;
  }
  // -- public state ----------------------------------------------------------------------
  get state() {
    return this._state;
  }
  /** The session id, once the server named it. */
  get session() {
    return this._session;
  }
  /** The server's HELLO reply (its capabilities). */
  get serverHello() {
    return this._hello;
  }
  /** How many times the client resumed the session after a drop. */
  get reconnects() {
    return this._reconnects;
  }
  /** Listen to `state`, `message`, `frame` or `error`; returns a function that stops it. */
  on(event, fn) {
    this.listeners[event].add(fn);
    return () => this.off(event, fn);
  }
  off(event, fn) {
    this.listeners[event].delete(fn);
  }
  emit(event, ...args) {
    for (const fn of [...this.listeners[event]]) {
      try {
        fn(...args);
      } catch (exc) {
        console.error(exc);
      }
    }
  }
  setState(state, detail = "") {
    this._state = state;
    this.emit("state", state, detail);
  }
  // -- connecting ------------------------------------------------------------------------
  /** Open the connection and complete the handshake; resolves with the server's HELLO. */
  connect() {
    if (this._state !== "idle") return Promise.reject(new ProtoError("INVALID_STATE", `connect() in state ${this._state}`));
    this.setState("connecting");
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject };
      waiter.timer = setTimeout(() => {
        if (this.connectWaiter !== waiter) return;
        this.connectWaiter = void 0;
        const error = this.transport === "stream" && (this.opts.duplex ?? isNode()) && !this.linkOpened ? new ConnectionFailed(
          `no response to the duplex stream within ${this.timeoutMs} ms: a proxy on the way probably holds the request body until it ends (nginx: proxy_request_buffering off), which a duplex stream never does; pass duplex: false to send follow-up POSTs instead`,
          new ClientTimeout(`no handshake within ${this.timeoutMs} ms`)
        ) : new ClientTimeout(`no handshake within ${this.timeoutMs} ms`);
        this.shutdown(error);
        reject(error);
      }, this.timeoutMs);
      this.connectWaiter = waiter;
      this.openConnection().catch((error) => this.connectionFailed(error));
    });
  }
  get timeoutMs() {
    return this.opts.timeoutMs ?? 1e4;
  }
  async freshToken() {
    this.token = this.opts.getToken ? await this.opts.getToken() : this.opts.token;
    return this.token;
  }
  /** WebSocket only: `ticket=` from POST /proto/ticket, else `token=` (an older server). */
  async credential(token) {
    if (this.opts.ticket === false || this.ticketsUnsupported) return ["token", token];
    let resp;
    try {
      resp = await this.fetchImpl(new URL("proto/ticket", this.base).href, {
        method: "POST",
        headers: { Authorization: `Bearer ${token}` }
      });
    } catch (exc) {
      throw new ConnectionFailed(`cannot reach ${this.base.href}: ${exc}`, exc);
    }
    if (resp.status === 404 || resp.status === 405) {
      await resp.body?.cancel().catch(() => void 0);
      this.ticketsUnsupported = true;
      return ["token", token];
    }
    if (resp.status !== 200) throw await refusal(resp);
    const body = await resp.json();
    return ["ticket", String(body.ticket)];
  }
  async openConnection() {
    const previous = this.lastLink;
    if (previous) await previous.settled();
    const token = await this.freshToken();
    const credential = this.transport === "websocket" ? await this.credential(token) : void 0;
    if (this._state === "closed") return;
    this.linkReady = false;
    this.linkOpened = false;
    this.helloSeq = 0;
    let link = void 0;
    const current = () => link !== void 0 && this.link === link;
    link = openLink(
      this.transport,
      {
        base: this.base,
        token,
        credential,
        session: this._session,
        lastSeq: this._session !== void 0 ? this.lastSeq : void 0,
        fetch: this.fetchImpl,
        WebSocket: this.opts.WebSocket,
        duplex: this.opts.duplex ?? isNode(),
        hello: () => {
          const raw = this.buildHello();
          return [raw, this.helloSeq];
        }
      },
      {
        open: (session) => {
          if (!current()) return;
          this.linkOpened = true;
          if (session) this._session = session;
          if (!this.helloSeq) this.write(this.buildHello());
          this.kickWatchdog();
        },
        raw: (raw) => {
          if (current()) this.receive(raw);
        },
        closed: (info) => {
          if (current()) this.linkClosed(info);
        },
        confirmed: (last, first) => {
          if (current()) this.confirm(last, first);
        },
        activity: () => {
          if (current()) this.kickWatchdog();
        }
      }
    );
    this.link = link;
    this.lastLink = link;
    if (this.helloSeq) this.frameOut(this.lastHelloRaw);
  }
  buildHello() {
    const accept = this.opts.acceptEvents?.length ? [.../* @__PURE__ */ new Set([...this.opts.acceptEvents, ...NEEDED_EVENTS])] : [];
    const fc = this.downCredit ? { downstream: true, initial_credit_messages: this.downCredit.messages, initial_credit_bytes: this.downCredit.bytes } : { initial_credit_messages: UNLIMITED, initial_credit_bytes: UNLIMITED };
    this.seq += 1;
    this.helloSeq = this.seq;
    const raw = this.envelope(`${this.tag}-h${this.seq}`, this.seq, "HELLO", "SYSTEM", {
      proto_version: PROTO_VERSION,
      accept_major: [1],
      accept_events: accept,
      capabilities: this.opts.extensions?.length ? { flow_control: fc, extensions: this.opts.extensions } : { flow_control: fc }
    });
    this.lastHelloRaw = raw;
    this.down.clear();
    return raw;
  }
  envelope(id, seq, type, channel, payload) {
    return JSON.stringify({
      id,
      session: this._session ?? "",
      seq: String(seq),
      ts: String(Date.now()),
      type,
      channel,
      payload
    });
  }
  write(raw, seq = this.seq) {
    const link = this.link;
    if (!link) return;
    this.frameOut(raw);
    link.send(raw, seq);
  }
  frameOut(raw) {
    if (this.listeners.frame.size) this.emit("frame", "out", raw, JSON.parse(raw));
  }
  connectionFailed(error) {
    if (this._state === "closed") return;
    if (this.connectWaiter) {
      const waiter = this.connectWaiter;
      this.connectWaiter = void 0;
      clearTimeout(waiter.timer);
      this.shutdown(error);
      waiter.reject(error);
      return;
    }
    this.linkClosed({ code: 1006, reason: error.message, error });
  }
  linkClosed(info) {
    this.link = void 0;
    this.linkReady = false;
    clearTimeout(this.watchdog);
    clearTimeout(this.confirmTimer);
    this.confirmTimer = void 0;
    this.confirmPing = void 0;
    if (this.closedByUser || this._state === "closed") return;
    const detail = `${info.code}${info.reason ? " " + info.reason : ""}`;
    if (this.connectWaiter) {
      this.connectionFailed(info.error ?? new ConnectionFailed(`cannot connect to ${this.base.href}: ${detail}`, info.reason));
      return;
    }
    let fatal;
    if (info.code === 4002) fatal = new ConnectionLost("SUPERSEDED", "another connection resumed this session");
    else if (info.code === 4001) fatal = new ConnectionLost("UNSUPPORTED_VERSION", "the server does not speak protocol 1");
    else if (info.error instanceof ConnectionRefused && [401, 403, 404].includes(info.error.status)) fatal = info.error;
    else if (this.opts.reconnect === false) fatal = new ConnectionLost("CLOSED", `connection closed ${detail}`);
    if (fatal) {
      this.shutdown(fatal);
      return;
    }
    const now = Date.now();
    if (this._state !== "reconnecting") {
      this.reconnectStarted = now;
      this.backoff = 0;
      this.setState("reconnecting", detail);
    }
    const limit = this.opts.reconnectTimeoutMs ?? this._hello?.capabilities.replay_window?.time_ms ?? 6e4;
    if (now - this.reconnectStarted > limit) {
      this.shutdown(info.error ?? new ConnectionLost("UNREACHABLE", `could not resume within ${limit} ms (${detail})`));
      return;
    }
    const delay = this.backoff;
    this.backoff = Math.min(BACKOFF_MAX_MS, this.backoff ? this.backoff * 2 : BACKOFF_FIRST_MS);
    this.reconnectTimer = setTimeout(() => {
      this.openConnection().catch((error) => this.connectionFailed(error));
    }, delay);
  }
  /** The server sends a PING every heartbeat interval: silence much longer than that
   * means a connection that died without a FIN (a sleeping laptop, a lost route). */
  kickWatchdog() {
    clearTimeout(this.watchdog);
    const interval = this._hello?.capabilities.heartbeat_interval_ms;
    if (!interval) return;
    const link = this.link;
    this.watchdog = setTimeout(() => {
      if (link && this.link === link) link.close(4e3, "no heartbeat from the server");
      if (link === this.link) this.linkClosed({ code: 4e3, reason: "no heartbeat from the server" });
    }, 2 * interval + 5e3);
  }
  /** Cut the connection abruptly, as a network failure would; the client resumes. */
  dropConnection() {
    const link = this.link;
    if (!link) return;
    this.link = void 0;
    link.close(1006, "dropped");
    this.linkClosed({ code: 1006, reason: "dropped by the application" });
  }
  /** Close the session: pending requests reject with ConnectionLost("CLOSED"). */
  async close() {
    if (this._state === "closed") return;
    this.closedByUser = true;
    const link = this.link;
    this.shutdown(new ConnectionLost("CLOSED", "the client was closed"));
    link?.close(1e3, "bye");
  }
  shutdown(error) {
    this.fatal = error;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.ackTimer);
    clearTimeout(this.watchdog);
    clearTimeout(this.confirmTimer);
    this.confirmTimer = void 0;
    const link = this.link;
    this.link = void 0;
    if (link && !this.closedByUser) link.close(1e3, "bye");
    if (this.connectWaiter) {
      const waiter = this.connectWaiter;
      this.connectWaiter = void 0;
      clearTimeout(waiter.timer);
      waiter.reject(error);
    }
    for (const call of this.calls.values()) {
      clearTimeout(call.timer);
      call.reject(error);
    }
    this.calls.clear();
    for (const run of this.runs.values()) run.reject(error);
    this.runs.clear();
    for (const list of this.toolLists) list.reject(error);
    this.toolLists = [];
    for (const ping of this.pings.values()) ping.reject(error);
    this.pings.clear();
    this.outbox = [];
    this.setState("closed", error.message);
    for (const wake of this.textWaiters.splice(0)) wake();
  }
  // -- sending ---------------------------------------------------------------------------
  /**
   * Send any message; returns its envelope id. Messages that need credit wait (in order)
   * until their channel has some; nothing is sent while the connection is down.
   */
  send(type, channel, payload = {}) {
    if (this.fatal) throw this.fatal;
    this.counter += 1;
    const id = `${this.tag}-${this.counter}`;
    const item = { id, type, channel, payload };
    const max = this._hello?.capabilities.max_message_size;
    if (max && byteLength(JSON.stringify(item)) + 120 > max) {
      throw new ProtoError("MESSAGE_TOO_LARGE", `the message is larger than the server's max_message_size (${max} bytes)`);
    }
    this.outbox.push(item);
    this.flush();
    return id;
  }
  flush() {
    if (!this.linkReady || !this.link) return;
    let index = 0;
    while (index < this.outbox.length) {
      const item = this.outbox[index];
      const control = CONTROL.has(item.type);
      if (!control) {
        if (this.paused.has(item.channel) || !this.canSpend(item)) {
          index += 1;
          while (index < this.outbox.length && !CONTROL.has(this.outbox[index].type)) index += 1;
          continue;
        }
      }
      this.outbox.splice(index, 1);
      this.transmit(item, !control);
    }
    this.scheduleConfirm();
  }
  estimate(item) {
    return byteLength(this.envelope(item.id, this.seq + 1, item.type, item.channel, item.payload)) + 8;
  }
  account(channel) {
    if (!this.upCredit) return null;
    let acct = this.upCredit.get(channel);
    if (!acct) {
      acct = { ...this.upInitial };
      this.upCredit.set(channel, acct);
    }
    return acct;
  }
  canSpend(item) {
    const acct = this.account(item.channel);
    return !acct || acct.messages >= 1 && acct.bytes >= this.estimate(item);
  }
  transmit(item, spend) {
    const again = item.resendSeq !== void 0 && item.resendSeq > this.seq - SEEN_WINDOW;
    const seq = again ? item.resendSeq : this.seq += 1;
    const raw = this.envelope(item.id, seq, item.type, item.channel, item.payload);
    const bytes = byteLength(raw);
    const acct = spend ? this.account(item.channel) : null;
    if (acct) {
      acct.messages -= 1;
      acct.bytes -= bytes;
    }
    const confirming = item.type === "PING" && String(item.payload.nonce).startsWith("confirm-");
    if (!NOT_RESENT.has(item.type) && !confirming) {
      this.unconfirmed.push({ ...item, seq, bytes, spent: !!acct, resendSeq: again ? seq : void 0 });
    }
    this.write(raw, seq);
  }
  /** The server has seen the upstream messages `first`..`last`. (A POST confirms only
   * what it carried: messages of a dropped connection before it are not confirmed.) */
  confirm(last, first = 0) {
    if (first <= (this.unconfirmed[0]?.seq ?? 0)) {
      let n = 0;
      while (n < this.unconfirmed.length && this.unconfirmed[n].seq <= last) n += 1;
      if (n) this.unconfirmed.splice(0, n);
      return;
    }
    this.unconfirmed = this.unconfirmed.filter((m) => m.seq < first || m.seq > last);
  }
  /** Over WebSocket and a duplex stream nothing confirms a message by itself: a PING
   * does (its PONG means everything before it was read), sent when the client falls idle. */
  scheduleConfirm() {
    if (this.link?.confirmsByPost || this.confirmPing || !this.unconfirmed.length) return;
    const ping = () => {
      this.confirmTimer = void 0;
      if (!this.linkReady || this.confirmPing || !this.unconfirmed.length) return;
      const nonce = `confirm-${this.tag}-${this.seq + 1}`;
      this.confirmPing = { nonce, seq: this.seq + 1 };
      this.transmit({ id: `${this.tag}-p${this.seq + 1}`, type: "PING", channel: "SYSTEM", payload: { nonce } }, false);
    };
    if (this.unconfirmed.length >= 256) ping();
    else if (this.confirmTimer === void 0) this.confirmTimer = setTimeout(ping, IDLE_MS);
  }
  /** Send a text: MESSAGE_START, one PART per chunk, MESSAGE_END. Returns its message_id. */
  sendText(text, options = {}) {
    const messageId = options.messageId ?? `${this.tag}-m${++this.counter}`;
    const parts = typeof text === "string" ? [text] : [...text];
    this.send("MESSAGE_START", "USER", { message_id: messageId, content_type: options.contentType ?? "text/plain" });
    for (const content of parts) this.send("MESSAGE_PART", "USER", { message_id: messageId, content });
    this.send("MESSAGE_END", "USER", { message_id: messageId });
    return messageId;
  }
  // -- receiving -------------------------------------------------------------------------
  receive(raw) {
    let msg;
    try {
      msg = JSON.parse(raw);
    } catch {
      return;
    }
    if (msg.seq === void 0) {
      this.emit("message", msg);
      return;
    }
    const seq = Number(msg.seq);
    if (!(seq > this.lastSeq)) return;
    this.lastSeq = seq;
    if (this.listeners.frame.size) this.emit("frame", "in", raw, msg);
    const p = msg.payload || {};
    if (this.failing.size) this.flushFailing(msg.type === "ERROR" ? p.related_id : void 0);
    if (!CONTROL.has(msg.type)) this.spendDown(msg.channel, byteLength(raw));
    if (!HEARTBEAT.has(msg.type)) this.scheduleAck();
    switch (msg.type) {
      case "HELLO":
        this.onHello(p);
        break;
      case "PING":
        this.send("PONG", "SYSTEM", { nonce: p.nonce });
        break;
      case "PONG":
        this.onPong(String(p.nonce));
        break;
      case "FLOW_UPDATE": {
        const acct = this.account(p.channel);
        if (acct) {
          acct.messages += Number(p.add_messages) || 0;
          acct.bytes += Number(p.add_bytes) || 0;
        }
        this.requeueRefused();
        this.flush();
        break;
      }
      case "PAUSE_CHANNEL":
        this.paused.add(p.channel);
        break;
      case "RESUME_CHANNEL":
        this.paused.delete(p.channel);
        this.requeueRefused();
        this.flush();
        break;
      case "ERROR":
        this.onError(p);
        break;
      case "MESSAGE_START":
      case "MESSAGE_PART":
      case "MESSAGE_END":
        this.onText(msg);
        break;
      case "TOOL_UPDATE": {
        const call = this.calls.get(p.call_id);
        if (call?.onProgress) {
          try {
            call.onProgress(typeof p.progress === "number" ? p.progress : void 0, p.status, p.partial);
          } catch (exc) {
            console.error(exc);
          }
        }
        break;
      }
      case "TOOL_DONE":
        this.onToolDone(p);
        break;
      case "TOOL_LIST": {
        const waiter = this.toolLists.shift();
        if (waiter) {
          clearTimeout(waiter.timer);
          this.byEnvelope.delete(waiter.envelopeId);
          waiter.resolve(p.tools ?? []);
        }
        break;
      }
      case "RUN_STARTED":
      case "RUN_FINISHED":
        this.onRun(msg.type, p);
        break;
      default:
        break;
    }
    this.emit("message", msg);
  }
  onHello(p) {
    const first = !this._hello;
    this._hello = p;
    this._session = p.session;
    const fc = p.capabilities?.flow_control;
    if (first) {
      if (fc && fc.enabled !== false) {
        this.upInitial = { messages: fc.initial_credit_messages, bytes: fc.initial_credit_bytes };
        this.upCredit = /* @__PURE__ */ new Map();
      } else {
        this.upCredit = null;
      }
    }
    const seen = Number(p.last_client_seq) || 0;
    const lost = this.unconfirmed.filter(
      (m) => (m.seq > seen || m.resendSeq !== void 0) && m.seq < this.helloSeq
    );
    this.unconfirmed = this.unconfirmed.filter((m) => m.seq >= this.helloSeq);
    const resend = [];
    for (const m of lost) {
      this.refund(m);
      resend.push({ id: m.id, type: m.type, channel: m.channel, payload: m.payload, resendSeq: m.seq });
    }
    this.outbox.unshift(...this.refused.map((m) => ({ id: m.id, type: m.type, channel: m.channel, payload: m.payload })), ...resend);
    this.refused = [];
    this.confirmPing = void 0;
    this.linkReady = true;
    if (first) {
      this.setState("ready", p.session);
    } else {
      this._reconnects += 1;
      this.setState("ready", `${p.session} resumed`);
    }
    this.kickWatchdog();
    if (this.connectWaiter) {
      const waiter = this.connectWaiter;
      this.connectWaiter = void 0;
      clearTimeout(waiter.timer);
      waiter.resolve(p);
    }
    this.flush();
  }
  refund(m) {
    if (!m.spent) return;
    const acct = this.account(m.channel);
    if (acct) {
      acct.messages += 1;
      acct.bytes += m.bytes;
    }
    m.spent = false;
  }
  requeueRefused() {
    if (!this.refused.length) return;
    const again = this.refused.filter((m) => !this.paused.has(m.channel));
    this.refused = this.refused.filter((m) => this.paused.has(m.channel));
    this.outbox.unshift(...again.map((m) => ({ id: m.id, type: m.type, channel: m.channel, payload: m.payload })));
  }
  onPong(nonce) {
    if (this.confirmPing && this.confirmPing.nonce === nonce) {
      this.confirm(this.confirmPing.seq);
      this.confirmPing = void 0;
      this.scheduleConfirm();
      return;
    }
    const ping = this.pings.get(nonce);
    if (ping) {
      this.pings.delete(nonce);
      clearTimeout(ping.timer);
      this.byEnvelope.delete(ping.envelopeId);
      this.confirm(ping.seq);
      ping.resolve(Date.now() - ping.sent);
    }
  }
  onError(p) {
    const related = p.related_id;
    const code = String(p.code);
    const message = String(p.message ?? "");
    if (related !== void 0) {
      const failing = this.failing.get(related);
      if (failing) {
        this.failing.delete(related);
        const owner2 = this.byEnvelope.get(related);
        this.byEnvelope.delete(related);
        if (owner2 && owner2.kind === "call") {
          const call = this.lastFailed.get(related);
          if (call) {
            this.lastFailed.delete(related);
            call.reject(new ToolError(call.callId, code, message, p.detail));
            return;
          }
        }
        failing();
        return;
      }
      if (code === "CHANNEL_PAUSED" || code === "INSUFFICIENT_CREDITS") {
        const at = this.unconfirmed.findIndex((m) => m.id === related);
        if (at >= 0) {
          const [m] = this.unconfirmed.splice(at, 1);
          this.refund(m);
          this.refused.push(m);
          if (code === "CHANNEL_PAUSED") this.paused.add(m.channel);
          return;
        }
      }
      const owner = this.byEnvelope.get(related);
      if (owner) {
        this.byEnvelope.delete(related);
        this.failRequest(owner, code, message, p.detail, related);
        return;
      }
    }
    this.emit("error", new ServerError(code, message, p.detail, related));
  }
  failRequest(owner, code, message, detail, related) {
    if (owner.kind === "call") {
      const call = this.calls.get(owner.key);
      if (call) {
        this.calls.delete(owner.key);
        clearTimeout(call.timer);
        call.reject(new ToolError(call.callId, code, message, detail));
      }
    } else if (owner.kind === "run") {
      const run = this.runs.get(owner.key);
      if (run) {
        this.runs.delete(owner.key);
        clearTimeout(run.timer);
        run.reject(new ServerError(code, message, detail, related));
      }
    } else if (owner.kind === "tools") {
      const at = this.toolLists.findIndex((w) => w.envelopeId === related);
      if (at >= 0) {
        const [w] = this.toolLists.splice(at, 1);
        clearTimeout(w.timer);
        w.reject(new ServerError(code, message, detail, related));
      }
    } else if (owner.kind === "ping") {
      const ping = this.pings.get(owner.key);
      if (ping) {
        this.pings.delete(owner.key);
        clearTimeout(ping.timer);
        ping.reject(new ServerError(code, message, detail, related));
      }
    }
  }
  onText(msg) {
    const p = msg.payload;
    const id = String(p.message_id);
    let chunk;
    if (msg.type === "MESSAGE_START") {
      const contentType = String(p.content_type ?? "text/plain");
      this.openTexts.set(id, { channel: msg.channel, contentType, parts: [] });
      chunk = { kind: "start", messageId: id, channel: msg.channel, contentType, content: "" };
    } else {
      let open = this.openTexts.get(id);
      if (!open) {
        open = { channel: msg.channel, contentType: "text/plain", parts: [] };
        this.openTexts.set(id, open);
      }
      if (msg.type === "MESSAGE_PART") {
        const content = String(p.content ?? "");
        open.parts.push(content);
        chunk = { kind: "part", messageId: id, channel: open.channel, contentType: open.contentType, content };
      } else {
        this.openTexts.delete(id);
        chunk = {
          kind: "end",
          messageId: id,
          channel: open.channel,
          contentType: open.contentType,
          content: "",
          text: open.parts.join("")
        };
      }
    }
    this.textQueue.push(chunk);
    for (const wake of this.textWaiters.splice(0)) wake();
  }
  spendDown(channel, nbytes) {
    const credit = this.downCredit;
    if (!credit) return;
    let acct = this.down.get(channel);
    if (!acct) {
      acct = { ...credit };
      this.down.set(channel, acct);
    }
    acct.messages -= 1;
    acct.bytes -= nbytes;
    if (acct.messages <= credit.messages / 2 || acct.bytes <= credit.bytes / 2) {
      this.send("FLOW_UPDATE", "SYSTEM", {
        channel,
        add_messages: credit.messages - acct.messages,
        add_bytes: credit.bytes - acct.bytes
      });
      acct.messages = credit.messages;
      acct.bytes = credit.bytes;
    }
  }
  /** ACK after every 32 messages and whenever the downstream falls idle (the heartbeat
   * itself is acknowledged only along with other messages). */
  scheduleAck() {
    this.sinceAck += 1;
    const ack = () => {
      this.ackTimer = void 0;
      if (this.linkReady && this.lastSeq > this.ackedSeq) {
        this.ackedSeq = this.lastSeq;
        this.sinceAck = 0;
        this.send("ACK", "SYSTEM", { seq: String(this.lastSeq) });
      }
    };
    if (this.sinceAck >= ACK_EVERY) {
      clearTimeout(this.ackTimer);
      ack();
    } else if (this.ackTimer === void 0) {
      this.ackTimer = setTimeout(ack, IDLE_MS);
    }
  }
  // -- texts -----------------------------------------------------------------------------
  /**
   * Every text the server streams (any channel), chunk by chunk as its messages arrive:
   * `start`, each `part`, `end` (with the whole `text`). Texts are buffered from the
   * moment the client connects; one reader at a time. Ends when the client closes.
   */
  async *texts() {
    for (; ; ) {
      const chunk = this.textQueue.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this._state === "closed") return;
      await new Promise((wake) => this.textWaiters.push(wake));
    }
  }
  /** The next whole text (its chunks are consumed from {@link texts}' buffer). */
  async nextText(options = {}) {
    const deadline = Date.now() + (options.timeoutMs ?? this.timeoutMs);
    for (; ; ) {
      const at = this.textQueue.findIndex((c) => c.kind === "end");
      if (at >= 0) {
        const end = this.textQueue[at];
        this.textQueue = this.textQueue.filter((c, i) => i > at || c.messageId !== end.messageId);
        return { messageId: end.messageId, channel: end.channel, contentType: end.contentType, text: end.text ?? "" };
      }
      if (this._state === "closed") throw this.fatal ?? new ConnectionLost("CLOSED", "closed");
      const left = deadline - Date.now();
      if (left <= 0) throw new ClientTimeout("no text arrived in time");
      await new Promise((wake) => {
        const timer = setTimeout(wake, left);
        this.textWaiters.push(() => {
          clearTimeout(timer);
          wake();
        });
      });
    }
  }
  // -- tools -----------------------------------------------------------------------------
  /** Call a tool; resolves with its result, rejects with ToolError / ToolCancelled. */
  callTool(name, params = {}, options = {}) {
    const callId = options.callId ?? `${this.tag}-call-${++this.counter}`;
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(new ToolCancelled(callId, "aborted before it was sent"));
    return new Promise((resolve, reject) => {
      const payload = { call_id: callId, tool: name, params };
      if (options.runId) payload.run_id = options.runId;
      let envelopeId;
      try {
        envelopeId = this.send("TOOL_CALL", "USER", payload);
      } catch (exc) {
        reject(exc);
        return;
      }
      const onAbort = () => {
        if (this.calls.has(callId) && !this.fatal) this.send("TOOL_CANCEL", "USER", { call_id: callId });
      };
      const cleanup = () => signal?.removeEventListener("abort", onAbort);
      const call = {
        callId,
        envelopeId,
        onProgress: options.onProgress,
        resolve: (v) => {
          cleanup();
          resolve(v);
        },
        reject: (e) => {
          cleanup();
          reject(e);
        }
      };
      if (options.timeoutMs) {
        call.timer = setTimeout(() => {
          if (!this.calls.delete(callId)) return;
          this.byEnvelope.delete(envelopeId);
          if (!this.fatal) this.send("TOOL_CANCEL", "USER", { call_id: callId });
          call.reject(new ClientTimeout(`${name} did not finish within ${options.timeoutMs} ms`));
        }, options.timeoutMs);
      }
      this.calls.set(callId, call);
      this.byEnvelope.set(envelopeId, { kind: "call", key: callId });
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
  onToolDone(p) {
    const call = this.calls.get(p.call_id);
    if (!call) return;
    this.calls.delete(p.call_id);
    clearTimeout(call.timer);
    if (p.status !== "OK" && p.status !== "CANCELLED") this.lastFailed.set(call.envelopeId, call);
    else this.byEnvelope.delete(call.envelopeId);
    if (p.status === "OK") {
      call.resolve(p.result);
    } else if (p.status === "CANCELLED") {
      call.reject(new ToolCancelled(call.callId));
    } else {
      const error = p.error ?? {};
      this.failing.set(call.envelopeId, () => {
        this.lastFailed.delete(call.envelopeId);
        this.byEnvelope.delete(call.envelopeId);
        call.reject(new ToolError(call.callId, error.code ?? "TOOL_EXECUTION_ERROR", error.message ?? "", error.detail));
      });
    }
  }
  flushFailing(except) {
    for (const [id, reject] of [...this.failing]) {
      if (id === except) continue;
      this.failing.delete(id);
      reject();
    }
  }
  /** The server's tools: name, description, inputSchema, outputSchema. */
  listTools() {
    return new Promise((resolve, reject) => {
      const envelopeId = this.send("TOOL_LIST", "SYSTEM", {});
      const waiter = { resolve, reject, envelopeId };
      waiter.timer = setTimeout(() => {
        const at = this.toolLists.indexOf(waiter);
        if (at >= 0) this.toolLists.splice(at, 1);
        reject(new ClientTimeout("no TOOL_LIST reply in time"));
      }, this.timeoutMs);
      this.toolLists.push(waiter);
      this.byEnvelope.set(envelopeId, { kind: "tools", key: envelopeId });
    });
  }
  /** Round trip of a PING, in ms. */
  ping() {
    return new Promise((resolve, reject) => {
      const nonce = `${this.tag}-ping-${++this.counter}`;
      const envelopeId = this.send("PING", "SYSTEM", { nonce });
      const waiter = { resolve, reject, sent: Date.now(), seq: this.seq, envelopeId };
      waiter.timer = setTimeout(() => {
        this.pings.delete(nonce);
        reject(new ClientTimeout("no PONG in time"));
      }, this.timeoutMs);
      this.pings.set(nonce, waiter);
      this.byEnvelope.set(envelopeId, { kind: "ping", key: nonce });
    });
  }
  // -- runs ------------------------------------------------------------------------------
  /** Start a run (RUN_STARTED); resolves with its run_id once the server answered. */
  startRun(options = {}) {
    const runId = options.runId ?? `${this.tag}-run-${++this.counter}`;
    const payload = { run_id: runId };
    if (options.threadId !== void 0) payload.thread_id = options.threadId;
    if (options.metadata !== void 0) payload.metadata = options.metadata;
    return this.runRequest("start", runId, "RUN_STARTED", payload).then(() => runId);
  }
  /** Finish a run (RUN_FINISHED); resolves with the server's RUN_FINISHED payload. */
  finishRun(runId, summary) {
    const payload = { run_id: runId };
    if (summary !== void 0) payload.summary = summary;
    return this.runRequest("end", runId, "RUN_FINISHED", payload);
  }
  /** Cancel a run and its tool calls (RUN_CANCEL); resolves with status "cancelled". */
  cancelRun(runId) {
    return this.runRequest("end", runId, "RUN_CANCEL", { run_id: runId });
  }
  runRequest(kind, runId, type, payload) {
    return new Promise((resolve, reject) => {
      const key = `${kind}:${runId}`;
      if (this.runs.has(key)) {
        reject(new ProtoError("INVALID_STATE", `a ${type} for ${runId} is already waiting`));
        return;
      }
      const envelopeId = this.send(type, "USER", payload);
      const waiter = { resolve, reject, kind, envelopeId };
      waiter.timer = setTimeout(() => {
        if (this.runs.get(key) !== waiter) return;
        this.runs.delete(key);
        this.byEnvelope.delete(envelopeId);
        reject(new ClientTimeout(`no answer to ${type} in time`));
      }, this.timeoutMs);
      this.runs.set(key, waiter);
      this.byEnvelope.set(envelopeId, { kind: "run", key });
    });
  }
  onRun(type, p) {
    const key = `${type === "RUN_STARTED" ? "start" : "end"}:${p.run_id}`;
    const run = this.runs.get(key);
    if (!run) return;
    this.runs.delete(key);
    clearTimeout(run.timer);
    this.byEnvelope.delete(run.envelopeId);
    if (type === "RUN_FINISHED" && p.status === "error") {
      const error = p.error ?? {};
      run.reject(new RunError(p.run_id, error.code ?? "RUN_ERROR", error.message ?? "the run failed", error.detail));
    } else {
      run.resolve(p);
    }
  }
};
export {
  ClientTimeout,
  ConnectionFailed,
  ConnectionLost,
  ConnectionRefused,
  PROTO_VERSION,
  ProtoClient,
  ProtoError,
  RunError,
  ServerError,
  ToolCancelled,
  ToolError
};

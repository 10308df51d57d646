"use strict";
// A small protoflask client for the browser (docs/PROTOCOL.md): WebSocket, or SSE for
// the downstream plus POSTs for the upstream. It keeps a session healthy on its own:
// HELLO on connect, PONG for every server PING, upstream credit spent and refilled by
// the server's FLOW_UPDATEs (messages wait while a channel has none), downstream credit
// announced in HELLO and granted back with FLOW_UPDATE as it is used, and ACKs.
(function (global) {
  const CONTROL = new Set(["HELLO", "PING", "PONG", "ACK", "FLOW_UPDATE", "PAUSE_CHANNEL",
    "RESUME_CHANNEL", "REPLAY_REQUEST", "ERROR"]);
  const DOWN_MESSAGES = 200;        // downstream credit announced per channel
  const DOWN_BYTES = 1 << 20;
  const ACK_DELAY_MS = 1000;
  const encoder = new TextEncoder();
  const byteLength = (text) => encoder.encode(text).length;

  class ProtoClient {
    // root: the server's base path ("/"); transport: "websocket" | "sse";
    // hooks: onFrame(dir, raw, msg), onMessage(msg), onState(state, detail), onNote(text)
    constructor(root, token, transport, hooks) {
      this.root = root;
      this.token = token;
      this.transport = transport;
      this.hooks = hooks || {};
      this.session = null;
      this.seq = 0;
      this.state = "idle";
      this.upCredit = null;         // channel -> {messages, bytes}; null: not limited
      this.initialUp = null;
      this.waiting = [];            // [type, channel, payload] held for upstream credit
      this.down = {};               // channel -> {messages, bytes} left of what we granted
      this.downLimited = true;
      this.lastSeq = 0;
      this.ackedSeq = 0;
      this.ackTimer = null;
      this.posting = false;
      this.postQueue = [];
      this.closedByUser = false;
    }

    _hook(name, ...args) {
      const fn = this.hooks[name];
      if (fn) { try { fn(...args); } catch (e) { console.error(e); } }
    }

    _setState(state, detail) {
      this.state = state;
      this._hook("onState", state, detail || "");
    }

    url(path) {
      return new URL(this.root + path, global.location.href);
    }

    // A single-use connect ticket (POST /proto/ticket), so the token never goes in a URL.
    async _ticket() {
      const r = await fetch(this.url("proto/ticket"), {method: "POST",
        headers: {"Authorization": `Bearer ${this.token}`}});
      const body = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error(body.error ? `${body.error.code} ${body.error.message}` : r.status);
      return encodeURIComponent(body.ticket);
    }

    async connect() {
      if (this.session === null) this._setState("connecting");
      let ticket;
      try { ticket = await this._ticket(); } catch (e) {
        this._setState("closed", `no connect ticket: ${e.message}`);
        return;
      }
      if (this.transport === "websocket") {
        const url = this.url("proto/websocket?ticket=" + ticket);
        url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
        const ws = this.ws = new WebSocket(url.href);
        ws.onopen = () => { this._setState("open"); this._hello(); };
        ws.onmessage = (e) => {
          if (typeof e.data === "string") this._receive(e.data);
        };
        ws.onclose = (e) => {
          this._setState("closed", `WebSocket closed ${e.code}${e.reason ? " " + e.reason : ""}`);
        };
        ws.onerror = () => this._hook("onNote", "WebSocket error");
      } else {
        // a resume names the session and the last seq seen (the used ticket cannot be
        // replayed, so the browser's own reconnect is replaced by this one)
        const resume = this.session === null ? "" :
          `&session=${encodeURIComponent(this.session)}&last_seq=${this.lastSeq}`;
        const es = this.es = new EventSource(this.url("proto/sse?ticket=" + ticket + resume).href);
        es.addEventListener("session", (e) => {
          const first = this.session === null;
          this.session = JSON.parse(e.data).session;
          this._hook("onNote", `event: session ${this.session}`);
          if (first) { this._setState("open"); this._hello(); }
        });
        es.onmessage = (e) => this._receive(e.data);
        es.addEventListener("close", (e) => {
          const info = JSON.parse(e.data);
          this._hook("onNote", `event: close ${info.code} ${info.reason}`);
          if (info.code === 4001 || info.code === 4002 || this.closedByUser) {
            es.close();
            this._setState("closed", `stream ended ${info.code} ${info.reason}`);
          }
        });
        es.onerror = () => {
          es.close();
          if (this.closedByUser || this.session === null || this.es !== es) {
            this._setState("closed", "event stream closed");
          } else {
            this._hook("onNote", "event stream interrupted; resuming with a new ticket");
            setTimeout(() => { if (!this.closedByUser) this.connect(); }, 1000);
          }
        };
      }
    }

    close() {
      this.closedByUser = true;
      clearTimeout(this.ackTimer);
      if (this.ws) this.ws.close(1000, "bye");
      if (this.es) { this.es.close(); this._setState("closed", "closed"); }
    }

    _hello() {
      this._send("HELLO", "SYSTEM", {
        proto_version: "1.1.2", accept_major: [1], accept_events: [],
        capabilities: {flow_control: {initial_credit_messages: DOWN_MESSAGES,
                                      initial_credit_bytes: DOWN_BYTES}},
      });
    }

    // Send a message; a non-control one waits while its channel has no credit.
    send(type, channel, payload) {
      if (!CONTROL.has(type) && (this.waiting.length || !this._canSpend(channel, type, payload))) {
        this.waiting.push([type, channel, payload]);
        this._hook("onNote", `${type} waits for ${channel} credit`);
        return;
      }
      this._send(type, channel, payload);
    }

    _envelope(type, channel, payload) {
      this.seq += 1;
      return JSON.stringify({id: `web-${this.seq}`, session: this.session || "",
                             seq: String(this.seq), ts: String(Date.now()), type, channel, payload});
    }

    _canSpend(channel, type, payload) {
      if (this.upCredit === null) return true;
      const acct = this._upAccount(channel);
      // the seq digits may grow by one: a little margin on the size estimate
      const size = byteLength(this._peek(type, channel, payload)) + 4;
      return acct.messages >= 1 && acct.bytes >= size;
    }

    _peek(type, channel, payload) {
      return JSON.stringify({id: `web-${this.seq + 1}`, session: this.session || "",
                             seq: String(this.seq + 1), ts: String(Date.now()), type, channel,
                             payload});
    }

    _upAccount(channel) {
      if (!this.upCredit[channel]) {
        this.upCredit[channel] = {messages: this.initialUp.messages, bytes: this.initialUp.bytes};
      }
      return this.upCredit[channel];
    }

    _send(type, channel, payload) {
      const raw = this._envelope(type, channel, payload);
      if (!CONTROL.has(type) && this.upCredit !== null) {
        const acct = this._upAccount(channel);
        acct.messages -= 1;
        acct.bytes -= byteLength(raw);
      }
      this._hook("onFrame", "out", raw, JSON.parse(raw));
      if (this.transport === "websocket") {
        if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(raw);
      } else {
        this.postQueue.push(raw);
        this._flushPosts();
      }
    }

    // One POST at a time, so the server sees the upstream in seq order.
    async _flushPosts() {
      if (this.posting || !this.postQueue.length || !this.session) return;
      this.posting = true;
      const body = this.postQueue.splice(0).join("\n");
      try {
        const resp = await fetch(this.url(`proto/sse?session=${encodeURIComponent(this.session)}`), {
          method: "POST", body,
          headers: {"Authorization": `Bearer ${this.token}`, "Content-Type": "application/x-ndjson"},
        });
        if (resp.status !== 202) this._hook("onNote", `POST answered ${resp.status}: ${await resp.text()}`);
      } catch (e) {
        this._hook("onNote", `POST failed: ${e}`);
      } finally {
        this.posting = false;
        this._flushPosts();
      }
    }

    _receive(raw) {
      let msg;
      try { msg = JSON.parse(raw); } catch (e) { this._hook("onNote", "unreadable frame"); return; }
      this._hook("onFrame", "in", raw, msg);
      const seq = Number(msg.seq);
      if (seq > this.lastSeq) this.lastSeq = seq;
      const p = msg.payload || {};
      if (msg.type === "HELLO") {
        this.session = p.session;
        const fc = (p.capabilities || {}).flow_control || {};
        if (fc.enabled === false) {
          this.upCredit = null;
          this.downLimited = false;
        } else {
          this.initialUp = {messages: fc.initial_credit_messages, bytes: fc.initial_credit_bytes};
          this.upCredit = {};
        }
        this._setState("ready", p.session);
      } else if (msg.type === "PING") {
        this._send("PONG", "SYSTEM", {nonce: p.nonce});
      } else if (msg.type === "FLOW_UPDATE" && this.upCredit !== null) {
        const acct = this._upAccount(p.channel);
        acct.messages += p.add_messages || 0;
        acct.bytes += p.add_bytes || 0;
        this._drainWaiting();
      }
      if (!CONTROL.has(msg.type)) this._spendDown(msg.channel, byteLength(raw));
      this._scheduleAck();
      this._hook("onMessage", msg);
    }

    _drainWaiting() {
      while (this.waiting.length) {
        const [type, channel, payload] = this.waiting[0];
        if (!this._canSpend(channel, type, payload)) return;
        this.waiting.shift();
        this._send(type, channel, payload);
      }
    }

    // Grant the server more downstream credit once half of a channel's is used.
    _spendDown(channel, nbytes) {
      if (!this.downLimited) return;
      const acct = this.down[channel] || (this.down[channel] = {messages: DOWN_MESSAGES, bytes: DOWN_BYTES});
      acct.messages -= 1;
      acct.bytes -= nbytes;
      if (acct.messages <= DOWN_MESSAGES / 2 || acct.bytes <= DOWN_BYTES / 2) {
        this._send("FLOW_UPDATE", "SYSTEM", {channel, add_messages: DOWN_MESSAGES - acct.messages,
                                             add_bytes: DOWN_BYTES - acct.bytes});
        acct.messages = DOWN_MESSAGES;
        acct.bytes = DOWN_BYTES;
      }
    }

    _scheduleAck() {
      if (this.ackTimer !== null) return;
      this.ackTimer = setTimeout(() => {
        this.ackTimer = null;
        if (this.state === "ready" && this.lastSeq > this.ackedSeq) {
          this.ackedSeq = this.lastSeq;
          this._send("ACK", "SYSTEM", {seq: String(this.lastSeq)});
        }
      }, ACK_DELAY_MS);
    }
  }

  global.ProtoClient = ProtoClient;
})(window);

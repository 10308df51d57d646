// Load generator for bench/run.py: one Node.js process, one event loop, N WebSocket
// connections driven closed-loop (each waits for its reply before sending again).
//
//   node bench/loadgen.mjs '<json config>'
//
// Config: {url, mode: "ping"|"tool"|"stream"|"idle", proto: "proto"|"echo",
//          connections, warmup, seconds, serverPid?, clkTck?, parts?, pipeline?,
//          connectConcurrency?}
//  - proto "proto": the full protocol (HELLO handshake first; PING -> PONG,
//    TOOL_CALL echo -> TOOL_DONE, MESSAGE_START/PART x N/END + PING -> PONG).
//  - proto "echo": a bare echo server; any text frame answers the frame sent.
//  - mode "idle": connect (and handshake), print {"event":"ready",...}, hold every
//    connection until a line arrives on stdin, then report how many were still open.
// Prints one JSON object (the result) as the last line of stdout.
//
// The server's CPU time is read from /proc/<serverPid>/stat at the start and the end of
// the measured window, and this process's own CPU time from process.cpuUsage(), so each
// result says whether the server's core (not this one) was the one that saturated.

import fs from "node:fs";
import readline from "node:readline";
import { performance } from "node:perf_hooks";
import { WebSocket } from "ws";

const cfg = Object.assign({
  mode: "ping", proto: "proto", connections: 1, warmup: 1, seconds: 5, serverPid: 0,
  clkTck: 100, parts: 20, pipeline: 2, connectConcurrency: 64, drain: 1.0,
}, JSON.parse(process.argv[2] || "{}"));

const SESSION = "0123456789abcdef0123456789abcdef"; // ignored by the server; keeps frames ~185 B
const NONCE_PAD = "------------------------------";
const BIG_CREDIT = 1_000_000_000; // announced downstream credit: TOOL_DONE on AGENT never stalls

// -- measurement state --------------------------------------------------------------------
let running = true;   // send more requests
let counting = false; // inside the measured window
let replies = 0;      // completed round trips (or stream messages) inside the window
let messages = 0;     // stream: client messages confirmed processed inside the window
let errors = 0;
let firstError = null;
let closedEarly = 0;
let lat = new Float64Array(1 << 16);
let nlat = 0;

function record(ms) {
  if (nlat === lat.length) {
    const bigger = new Float64Array(lat.length * 2);
    bigger.set(lat);
    lat = bigger;
  }
  lat[nlat++] = ms;
}

function noteError(what) {
  errors++;
  if (firstError === null) firstError = what;
}

function serverCpuSeconds() {
  if (!cfg.serverPid) return null;
  try {
    const s = fs.readFileSync(`/proc/${cfg.serverPid}/stat`, "latin1");
    const f = s.slice(s.lastIndexOf(")") + 2).split(" "); // f[0] is field 3 (state)
    return (Number(f[11]) + Number(f[12])) / cfg.clkTck; // utime + stime, all threads
  } catch {
    return null;
  }
}

// -- frames ---------------------------------------------------------------------------------

function envelope(c, type, channel, payload) {
  c.seq++;
  return `{"id":"c${c.idx}-${c.seq}","session":"${SESSION}","seq":"${c.seq}","ts":"${Date.now()}",` +
    `"type":"${type}","channel":"${channel}","payload":${payload}}`;
}

function pingFrame(c) {
  const nonce = ("n" + (c.seq + 1) + NONCE_PAD).slice(0, 30);
  return envelope(c, "PING", "SYSTEM", `{"nonce":"${nonce}"}`);
}

const HELLO_PAYLOAD = JSON.stringify({
  proto_version: "1.1.2", accept_major: [1], accept_events: [],
  capabilities: { flow_control: { initial_credit_messages: BIG_CREDIT,
                                  initial_credit_bytes: BIG_CREDIT * 1000 } },
});

// -- per-mode behaviour -------------------------------------------------------------------

class Conn {
  constructor(idx) {
    this.idx = idx;
    this.seq = 0;
    this.ws = null;
    this.ready = false;
    this.open = false;
    this.sentAt = 0;
    this.callId = "";
    this.upMessages = 0; // stream: upstream USER credit the server granted
    this.upBytes = 0;
    this.bursts = [];    // stream: send times of bursts awaiting their PONG
    this.msgNo = 0;
  }
}

function sendRequest(c) {
  if (!running || !c.open) return;
  switch (cfg.mode) {
    case "ping":
      c.sentAt = performance.now();
      c.ws.send(pingFrame(c));
      break;
    case "tool": {
      c.callId = `t${c.idx}-${c.seq + 1}`;
      c.sentAt = performance.now();
      c.ws.send(envelope(c, "TOOL_CALL", "USER",
        `{"call_id":"${c.callId}","tool":"echo","params":{"message":"hello from the bench"}}`));
      break;
    }
    case "stream":
      sendBursts(c);
      break;
  }
}

function sendBursts(c) {
  // One burst: MESSAGE_START, PART x parts, MESSAGE_END (all on USER, spending credit),
  // then a PING whose PONG confirms the server processed the burst (replies come in order).
  const sock = c.ws._socket;
  while (running && c.open && c.bursts.length < cfg.pipeline) {
    const id = `m${c.idx}-${++c.msgNo}`;
    const frames = [envelope(c, "MESSAGE_START", "USER", `{"message_id":"${id}","content_type":"text/plain"}`)];
    for (let i = 0; i < cfg.parts; i++) {
      frames.push(envelope(c, "MESSAGE_PART", "USER", `{"message_id":"${id}","content":" token${i}"}`));
    }
    frames.push(envelope(c, "MESSAGE_END", "USER", `{"message_id":"${id}"}`));
    let nbytes = 0;
    for (const f of frames) nbytes += Buffer.byteLength(f);
    if (c.upMessages < frames.length || c.upBytes < nbytes) {
      // Out of credit: roll the seq back is unnecessary (gaps are allowed); wait for FLOW_UPDATE.
      c.msgNo--;
      return;
    }
    c.upMessages -= frames.length;
    c.upBytes -= nbytes;
    sock.cork();
    for (const f of frames) c.ws.send(f);
    c.ws.send(pingFrame(c));
    sock.uncork();
    c.bursts.push(performance.now());
  }
}

function onMessage(c, data) {
  if (cfg.proto === "echo") {
    if (cfg.mode === "idle") return;
    if (counting) {
      replies++;
      record(performance.now() - c.sentAt);
    }
    sendRequest(c);
    return;
  }
  let m;
  try {
    m = JSON.parse(data);
  } catch {
    noteError("unparseable frame: " + String(data).slice(0, 200));
    return;
  }
  const p = m.payload || {};
  switch (m.type) {
    case "PONG":
      if (cfg.mode === "ping") {
        if (counting) {
          replies++;
          record(performance.now() - c.sentAt);
        }
        sendRequest(c);
      } else if (cfg.mode === "stream" && c.bursts.length) {
        const t = c.bursts.shift();
        if (counting) {
          messages += cfg.parts + 2;
          replies++;
          record(performance.now() - t);
        }
        sendBursts(c);
      }
      break;
    case "TOOL_DONE":
      if (cfg.mode === "tool" && p.call_id === c.callId) {
        if (p.status !== "OK") noteError("TOOL_DONE " + JSON.stringify(p).slice(0, 200));
        if (counting) {
          replies++;
          record(performance.now() - c.sentAt);
        }
        sendRequest(c);
      }
      break;
    case "PING": // the server's heartbeat
      c.ws.send(envelope(c, "PONG", "SYSTEM", JSON.stringify({ nonce: p.nonce })));
      break;
    case "FLOW_UPDATE":
      if (p.channel === "USER") {
        c.upMessages += Number(p.add_messages || 0);
        c.upBytes += Number(p.add_bytes || 0);
        if (cfg.mode === "stream") sendBursts(c);
      }
      break;
    case "HELLO":
      if (!c.ready) {
        const fc = (p.capabilities || {}).flow_control || {};
        c.upMessages = fc.enabled === false ? Infinity : Number(fc.initial_credit_messages || 1000);
        c.upBytes = fc.enabled === false ? Infinity : Number(fc.initial_credit_bytes || 1048576);
        c.ready = true;
        c.onReady();
      }
      break;
    case "ERROR":
      noteError(`ERROR ${p.code}: ${p.message}`);
      break;
    default:
      break; // TOOL_UPDATE etc.
  }
}

function connect(idx) {
  return new Promise((resolve, reject) => {
    const c = new Conn(idx);
    const ws = new WebSocket(cfg.url, { perMessageDeflate: false, handshakeTimeout: 30000 });
    c.ws = ws;
    let settled = false;
    c.onReady = () => { if (!settled) { settled = true; resolve(c); } };
    ws.on("open", () => {
      c.open = true;
      if (cfg.proto === "proto") {
        ws.send(envelope(c, "HELLO", "SYSTEM", HELLO_PAYLOAD));
      } else {
        c.ready = true;
        c.onReady();
      }
    });
    ws.on("message", (data) => onMessage(c, data));
    ws.on("close", (code) => {
      if (c.open && c.ready && !shuttingDown) closedEarly++;
      c.open = false;
      if (!settled) { settled = true; reject(new Error(`closed before ready (code ${code})`)); }
    });
    ws.on("error", (err) => {
      if (!settled) { settled = true; reject(err); }
      else noteError(String(err && err.message || err));
    });
  });
}

async function connectAll(n) {
  const conns = [];
  let next = 0;
  let failed = 0;
  let lastError = null;
  const t0 = performance.now();
  async function lane() {
    while (next < n) {
      const idx = next++;
      try {
        conns.push(await connect(idx));
      } catch (err) {
        failed++;
        lastError = String(err && err.message || err);
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(cfg.connectConcurrency, n) }, lane));
  const seconds = (performance.now() - t0) / 1000;
  return { conns, failed, lastError, seconds };
}

let shuttingDown = false;

function percentile(sorted, q) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function round(x, digits = 3) {
  if (x === null || x === undefined || !Number.isFinite(x)) return null;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

function finish(result) {
  shuttingDown = true;
  process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(0));
}

async function main() {
  const { conns, failed, lastError, seconds: connectSeconds } = await connectAll(cfg.connections);
  const base = {
    mode: cfg.mode, proto: cfg.proto, connections: cfg.connections, connected: conns.length,
    connect_failed: failed, connect_error: lastError, connect_seconds: round(connectSeconds),
    connect_per_s: round(conns.length / connectSeconds, 1),
  };
  if (cfg.mode === "idle") {
    process.stdout.write(JSON.stringify({ event: "ready", ...base }) + "\n");
    const rl = readline.createInterface({ input: process.stdin });
    const done = () => {
      const held = conns.filter((c) => c.open).length;
      for (const c of conns) c.ws.terminate();
      finish({ ...base, held, closed_early: closedEarly, errors, first_error: firstError });
    };
    rl.once("line", done);
    rl.once("close", done);
    return;
  }
  if (!conns.length) {
    finish({ ...base, error: "no connection could be opened: " + lastError });
    return;
  }
  for (const c of conns) sendRequest(c);
  let t0, cpu0, srv0;
  await new Promise((r) => setTimeout(r, cfg.warmup * 1000));
  counting = true;
  t0 = performance.now();
  cpu0 = process.cpuUsage();
  srv0 = serverCpuSeconds();
  await new Promise((r) => setTimeout(r, cfg.seconds * 1000));
  counting = false;
  const t1 = performance.now();
  const cpu = process.cpuUsage(cpu0);
  const srv1 = serverCpuSeconds();
  running = false;
  const window = (t1 - t0) / 1000;
  const sorted = lat.slice(0, nlat).sort();
  const work = cfg.mode === "stream" ? messages : replies;
  const srvCpu = srv0 !== null && srv1 !== null ? srv1 - srv0 : null;
  const result = {
    ...base,
    window_s: round(window),
    replies,
    rt_per_s: round(replies / window, 1),
    messages: cfg.mode === "stream" ? messages : undefined,
    messages_per_s: cfg.mode === "stream" ? round(messages / window, 1) : undefined,
    parts: cfg.mode === "stream" ? cfg.parts : undefined,
    p50_ms: round(percentile(sorted, 0.5)),
    p90_ms: round(percentile(sorted, 0.9)),
    p99_ms: round(percentile(sorted, 0.99)),
    max_ms: round(sorted.length ? sorted[sorted.length - 1] : null),
    server_cpu_s: round(srvCpu, 3),
    server_cpu_pct: round(srvCpu === null ? null : (100 * srvCpu) / window, 1),
    // per reply for ping/tool; per client message for stream
    server_us_per_op: round(srvCpu === null || !work ? null : (srvCpu * 1e6) / work, 2),
    gen_cpu_pct: round((100 * (cpu.user + cpu.system) / 1e6) / window, 1),
    gen_us_per_op: round(work ? (cpu.user + cpu.system) / work : null, 2),
    errors,
    first_error: firstError,
    closed_early: closedEarly,
  };
  // let in-flight replies land, then drop every connection
  await new Promise((r) => setTimeout(r, Math.min(cfg.drain, 0.3) * 1000));
  shuttingDown = true;
  for (const c of conns) c.ws.terminate();
  finish(result);
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.stack || err) }) + "\n",
    () => process.exit(1));
});

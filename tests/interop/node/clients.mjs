// Node clients protoflask did not write: the `ws` and `eventsource` packages (plus Node's
// own fetch for SSE upstream POSTs). Driven by tests/interop/test_node.py, which reads one
// JSON object per stdout line:
//   node clients.mjs ws  <base> <token>   HELLO, a TOOL_CALL, prints each message; exits
//                                          after TOOL_DONE
//   node clients.mjs ws-refused <base>    an upgrade without a token: prints the refusal
//   node clients.mjs sse <base> <token>   EventSource with a Bearer header; prints
//                                          {kind: "open" | "session" | "message" | "error"}
//                                          lines until killed (reconnects on its own)
import { EventSource } from "eventsource";
import WebSocket from "ws";

const [mode, base, token] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
let seq = 0;
const envelope = (session, type, channel, payload) => {
  seq += 1;
  return { id: `node-${seq}`, session: session || "", seq: String(seq), ts: String(Date.now()),
           type, channel, payload };
};
const HELLO = { proto_version: "1.1.2", accept_major: [1], accept_events: [] };

if (mode === "ws") {
  const ws = new WebSocket(`${base.replace(/^http/, "ws")}/proto/websocket?token=${token}`);
  ws.on("open", () => ws.send(JSON.stringify(envelope("", "HELLO", "SYSTEM", HELLO))));
  ws.on("message", (data) => {
    const msg = JSON.parse(data.toString());
    out({ kind: "message", msg });
    if (msg.type === "HELLO") {
      ws.send(JSON.stringify(envelope(msg.session, "TOOL_CALL", "USER",
        { call_id: "node-add", tool: "add", params: { a: 40, b: 2 } })));
    } else if (msg.type === "TOOL_DONE") {
      ws.close(1000);
    }
  });
  ws.on("close", (code) => { out({ kind: "close", code }); process.exit(0); });
  ws.on("error", (err) => { out({ kind: "error", error: String(err) }); process.exit(1); });
} else if (mode === "ws-refused") {
  const ws = new WebSocket(`${base.replace(/^http/, "ws")}/proto/websocket`);
  ws.on("unexpected-response", (req, res) => {
    let body = "";
    res.on("data", (chunk) => { body += chunk; });
    res.on("end", () => {
      out({ kind: "refused", status: res.statusCode, contentType: res.headers["content-type"],
            body: JSON.parse(body) });
      process.exit(0);
    });
  });
  ws.on("open", () => { out({ kind: "open" }); process.exit(1); });
  ws.on("error", (err) => { out({ kind: "error", error: String(err) }); process.exit(1); });
} else if (mode === "sse") {
  const auth = { Authorization: `Bearer ${token}` };
  const source = new EventSource(`${base}/proto/sse`, {
    fetch: (input, init) => fetch(input, { ...init, headers: { ...init.headers, ...auth } }),
  });
  let session = null;
  const post = (msg) => fetch(`${base}/proto/sse?session=${msg.session}`, {
    method: "POST", headers: { ...auth, "Content-Type": "application/json" },
    body: JSON.stringify(msg),
  }).then(async (resp) => out({ kind: "post", status: resp.status, body: await resp.json() }));
  source.onopen = () => out({ kind: "open" });
  source.addEventListener("session", (event) => {
    const sid = JSON.parse(event.data).session;
    out({ kind: "session", sid });
    if (session === null) { session = sid; post(envelope(sid, "HELLO", "SYSTEM", HELLO)); }
  });
  source.onmessage = (event) => {
    const msg = JSON.parse(event.data);
    out({ kind: "message", id: event.lastEventId, msg });
    if (msg.type === "PING") post(envelope(msg.session, "PONG", "SYSTEM", { nonce: msg.payload.nonce }));
  };
  source.onerror = (err) => out({ kind: "error", error: String(err && err.message) });
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}

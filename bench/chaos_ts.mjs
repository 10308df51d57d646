// The TypeScript client's sessions in bench/cluster_chaos.py (--ts N): argv[2] is a JSON
// object {url, sessions: [{token, transport}], callTimeoutMs}. Each session calls `add`
// in a loop through clients/js (its dist build), and beside it one `work` call at a time
// (bench/chaos_app.py: 2-10 s, a TOOL_UPDATE every 0.5 s). When stdin ends, prints one JSON line:
// per session {transport, calls, lost, stranded, doneTwice, dead, toolErrors}. The
// client drops a seq it has already delivered before the application sees it, so what
// is checked here is what reaches the application: a gap in the seqs it hands on (lost),
// a call with no TOOL_DONE (stranded), a call with two (doneTwice). Each call carries its
// own call_id, so that a stranded one is reported by session and call id (strandedCalls)
// and can be followed in the nodes' logs.
import WebSocket from "ws";
import { ProtoClient } from "../clients/js/dist/index.js";

const { url, sessions, callTimeoutMs } = JSON.parse(process.argv[2]);
let running = true;

async function session({ token, transport }, index) {
  const out = { transport, calls: 0, lost: 0, stranded: 0, doneTwice: 0, dead: null, toolErrors: 0 };
  const client = new ProtoClient({ url, token, transport, WebSocket, duplex: false, reconnectTimeoutMs: 600000 });
  let last = 0;
  const dones = new Map();
  const seen = {}; // call_id -> its TOOL_DONEs (seq, status, when): for a call done twice or stranded
  const strandedCalls = [];
  const strand = (callId, sentAt) => {
    out.stranded += 1;
    strandedCalls.push({ call: callId, sent: sentAt, gaveUp: new Date().toISOString(),
                         done: seen[callId] ?? [] });
  };
  client.on("message", (msg) => {
    const seq = Number(msg.seq);
    if (last && seq > last + 1) out.lost += seq - last - 1;
    last = seq;
    if (msg.type === "TOOL_DONE") {
      const id = msg.payload.call_id;
      dones.set(id, (dones.get(id) || 0) + 1);
      (seen[id] ??= []).push(`seq ${msg.seq} ${msg.payload.status} at ${new Date().toISOString()}`);
    }
  });
  client.on("state", (state, detail) => {
    if (state === "closed" && running) out.dead = detail;
  });
  try {
    await client.connect();
  } catch (exc) {
    out.dead = `connect: ${exc}`;
    return out;
  }
  out.workCalls = 0;
  const workLane = (async () => {
    for (let k = 1; running && !out.dead; k++) {
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(), callTimeoutMs);
      const callId = `ts${index}-work-${k}`;
      const sentAt = new Date().toISOString();
      try {
        await client.callTool("work", { seconds: 2 + ((k * 3) % 9) }, { signal: abort.signal, callId });
      } catch (exc) {
        if (abort.signal.aborted) strand(callId, sentAt);
        else if (out.dead === null && client.state !== "closed") out.toolErrors += 1;
      } finally {
        clearTimeout(timer);
      }
      out.workCalls += 1;
    }
  })();
  for (let n = 1; running && !out.dead; n++) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), callTimeoutMs);
    const callId = `ts${index}-add-${n}`;
    const sentAt = new Date().toISOString();
    try {
      const { result } = await client.callTool("add", { a: n, b: 1 }, { signal: abort.signal, callId });
      if (result !== n + 1) throw new Error(`add(${n}, 1) = ${JSON.stringify(result)}`);
    } catch (exc) {
      if (abort.signal.aborted) strand(callId, sentAt);
      else if (out.dead === null && client.state !== "closed") {
        out.toolErrors += 1;
        out.firstError ??= String(exc);
      }
    } finally {
      clearTimeout(timer);
    }
    out.calls += 1;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await workLane;
  out.doneTwice = [...dones.values()].filter((v) => v > 1).length;
  const twice = [...dones].filter(([, v]) => v > 1).map(([id]) => ({ id, dones: seen[id] }));
  if (twice.length) out.twice = { session: client.session, calls: twice };
  if (strandedCalls.length) out.strandedCalls = { session: client.session, calls: strandedCalls };
  // (a close that cannot flush, its node gone, must not hold the report)
  await Promise.race([client.close().catch(() => undefined), new Promise((r) => setTimeout(r, 5000))]);
  return out;
}

const all = Promise.all(sessions.map((s, i) => session(s, i)));
process.stdin.resume();
process.stdin.on("end", async () => {
  running = false;
  console.log(JSON.stringify(await all));
  process.exit(0);
});

// The published @ag-ui/client HttpAgent against protoflask's /proto/agui, run by
// tests/agui/test_httpagent.py. One JSON line per thing seen:
//   {"kind": "event", "run": i, "event": {...}}   every event HttpAgent delivered
//   {"kind": "done", "run": i, "result": ..., "messages": [...]}
//   {"kind": "error", "run": i, "message": "..."}
// Modes: run <url> <token> <thread> <text> [tool-json]   one run (a frontend tool declared)
//        frontend <url> <token> <thread>                  a frontend tool call, then its result
//        stop <url> <token> <thread>                       stop the run after its first text
//        soak <url> <token> <thread> <n>                   n runs on one thread
//        cut <url> <token> <thread> <k>                    a raw stream cut after k events,
//                                                          then HttpAgent re-attaches
import { HttpAgent } from "@ag-ui/client";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "true";
const [mode, url, token, thread, arg] = process.argv.slice(2);
const endpoint = `${url}/proto/agui`;
const headers = { Authorization: `Bearer ${token}` };
const print = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

function agent(options = {}) {
  return new HttpAgent({ url: endpoint, headers, threadId: thread, ...options });
}

async function runOnce(a, i, params = {}) {
  const seen = [];
  try {
    const { result, newMessages } = await a.runAgent(params, {
      onEvent: ({ event }) => {
        seen.push(event);
        print({ kind: "event", run: i, event });
      },
    });
    print({ kind: "done", run: i, result: result ?? null, messages: newMessages });
  } catch (err) {
    print({ kind: "error", run: i, message: String(err && err.message ? err.message : err) });
  }
  return seen;
}

function user(text) {
  return { id: `u-${Math.random().toString(36).slice(2)}`, role: "user", content: text };
}

async function main() {
  if (mode === "run") {
    const a = agent();
    a.addMessage(user(arg));
    await runOnce(a, 0);
  } else if (mode === "frontend") {
    const a = agent();
    a.addMessage(user("frontend"));
    const tools = [{ name: "confirm", description: "Ask the user to confirm",
                     parameters: { type: "object", properties: { question: { type: "string" } } } }];
    const first = await runOnce(a, 0, { tools });
    const call = first.find((e) => e.type === "TOOL_CALL_START");
    a.addMessage({ id: `t-${call.toolCallId}`, role: "tool", toolCallId: call.toolCallId,
                   content: "yes" });
    await runOnce(a, 1, { tools });
  } else if (mode === "stop") {
    const a = agent();
    a.addMessage(user("slow"));
    let stopped = false;
    const { result } = await a.runAgent({ runId: "run-to-stop" }, {
      onEvent: async ({ event }) => {
        print({ kind: "event", run: 0, event });
        if (event.type === "TEXT_MESSAGE_CONTENT" && !stopped) {
          stopped = true;
          const r = await fetch(`${endpoint}/stop`, { method: "POST",
            headers: { ...headers, "Content-Type": "application/json" },
            body: JSON.stringify({ threadId: thread, runId: "run-to-stop" }) });
          print({ kind: "stop", status: r.status, body: await r.json() });
        }
      },
    }).catch((err) => ({ result: { error: String(err.message) } }));
    print({ kind: "done", run: 0, result: result ?? null });
  } else if (mode === "soak") {
    const a = agent();
    for (let i = 0; i < Number(arg); i++) {
      a.addMessage(user(`message ${i}`));
      await runOnce(a, i);
    }
  } else if (mode === "cut") {
    await cut(Number(arg));
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}

// A run's raw stream, cut by the client after k events; then HttpAgent re-attaches with
// Last-Event-ID through its own fetch option (GET /proto/agui?thread=&run=).
async function cut(k) {
  const runId = `run-cut-${Date.now()}`;
  const controller = new AbortController();
  const response = await fetch(endpoint, {
    method: "POST", signal: controller.signal,
    headers: { ...headers, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ threadId: thread, runId, messages: [user("slow")], tools: [],
                           context: [], state: {}, forwardedProps: {} }),
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let lastId = null;
  let got = 0;
  while (got < k) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while (got < k && (end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").find((l) => l.startsWith("data:"));
      const id = block.split("\n").find((l) => l.startsWith("id:"));
      if (!data) continue;
      if (id) lastId = id.slice(3).trim();
      got += 1;
      print({ kind: "event", run: 0, id: lastId, event: JSON.parse(data.slice(5)) });
    }
  }
  controller.abort();  // the client's side of the connection is gone, mid-run
  print({ kind: "cut", lastEventId: lastId });
  const reattach = (_input, init) => fetch(
    `${endpoint}?thread=${encodeURIComponent(thread)}&run=${encodeURIComponent(runId)}`,
    { method: "GET", signal: init.signal,
      headers: { ...headers, Accept: "text/event-stream", "Last-Event-ID": lastId } });
  const a = agent({ fetch: reattach });
  await runOnce(a, 1, { runId });
}

main().catch((err) => {
  print({ kind: "fatal", message: String(err && err.stack ? err.stack : err) });
  process.exit(1);
});

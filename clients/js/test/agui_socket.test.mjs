// ProtoSocketAgent (protoflask-client/agui) against a live protoflask: AG-UI runs over the
// native WebSocket (docs/AGUI.md, "AG-UI events on the WebSocket"), every event stream put
// through the published @ag-ui/client's verifyEvents; a connection cut mid-run resumes by
// itself and the subscriber sees exactly the events of an uncut run; stop(); native
// traffic on the same socket.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { lastValueFrom, toArray } from "rxjs";
import { verifyEvents } from "@ag-ui/client";
import { ProtoSocketAgent } from "../dist/agui.js";
import { AGUI_SERVER, startServer } from "./helpers.mjs";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "true";
let server;
const agents = [];

before(async () => {
  server = await startServer({}, AGUI_SERVER);
});

after(async () => {
  await Promise.all(agents.map((a) => a.close()));
  await server.stop();
});

function agent(threadId) {
  const a = new ProtoSocketAgent({ url: server.url, token: server.token, threadId, WebSocket });
  agents.push(a);
  return a;
}

let runs = 0;
/** One run's events as the agent's observable gives them, through verifyEvents. */
async function verified(a, text) {
  runs += 1;
  const input = { threadId: a.threadId, runId: `ws-run-${runs}`, state: {}, tools: [],
                  context: [], forwardedProps: {},
                  messages: [{ id: `u${runs}`, role: "user", content: text }] };
  return lastValueFrom(a.run(input).pipe(verifyEvents(false), toArray()));
}

const shape = (events) => events.map((e) => [e.type, e.delta ?? null, e.outcome?.type ?? null]);

test("a run over the socket: AG-UI events that pass verifyEvents", async () => {
  const events = await verified(agent("ws-echo"), "hi");
  assert.deepEqual(shape(events), [["RUN_STARTED", null, null], ["TEXT_MESSAGE_START", null, null],
    ["TEXT_MESSAGE_CONTENT", "echo: hi", null], ["TEXT_MESSAGE_END", null, null],
    ["RUN_FINISHED", null, null]]);
});

test("runAgent (AbstractAgent's pipeline) takes the agent as it takes HttpAgent", async () => {
  const a = agent("ws-runagent");
  a.addMessage({ id: "ra1", role: "user", content: "hello" });
  const { newMessages } = await a.runAgent({});
  assert.equal(newMessages.at(-1).content, "echo: hello");
  a.addMessage({ id: "ra2", role: "user", content: "again" });
  await a.runAgent({});  // a second run on the same socket
  assert.equal(a.messages.at(-1).content, "echo: again");
});

test("a connection cut mid-run resumes by itself: exactly the uncut run's events", async () => {
  const uncut = await verified(agent("ws-uncut"), "slow");
  const a = agent("ws-kick");
  const cut = await verified(a, "kick");
  assert.ok(a.client.reconnects >= 1, "the socket was reconnected");
  assert.deepEqual(shape(cut), shape(uncut));
  assert.deepEqual(cut.at(-1).result, { chunks: 12 });
});

test("stop() cancels the run: open constructs closed, outcome cancelled", async () => {
  const a = agent("ws-stop");
  const input = { threadId: "ws-stop", runId: "ws-run-stop", state: {}, tools: [], context: [],
                  forwardedProps: {}, messages: [{ id: "us", role: "user", content: "slow" }] };
  const events = [];
  await new Promise((resolve, reject) => {
    a.run(input).pipe(verifyEvents(false)).subscribe({
      next: (event) => {
        events.push(event);
        if (event.type === "TEXT_MESSAGE_CONTENT" && events.length === 3) a.stop();
      },
      error: reject, complete: resolve,
    });
  });
  assert.deepEqual(events.at(-1).outcome, { type: "cancelled" });
  assert.equal(events.filter((e) => e.type === "TEXT_MESSAGE_END").length, 1);
});

test("the socket carries native traffic beside the runs", async () => {
  const a = agent("ws-native");
  await verified(a, "hi");
  assert.ok(await a.client.ping() >= 0);
  const tools = await a.client.listTools();
  assert.ok(Array.isArray(tools));
});

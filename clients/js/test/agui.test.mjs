// ProtoAgent (protoflask-client/agui) against a live protoflask: a run, a stream broken
// mid-run and resumed by itself (the subscriber sees exactly an uncut run's events), a
// connectAgent re-attach after the run ended, and stop().
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { ProtoAgent } from "../dist/agui.js";
import { AGUI_SERVER, startServer } from "./helpers.mjs";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "true";
let server;

before(async () => {
  server = await startServer({}, AGUI_SERVER);
});

after(async () => {
  await server.stop();
});

function agent(threadId) {
  return new ProtoAgent({ url: `${server.url}/proto/agui`, threadId, retryDelayMs: 50,
                          headers: { Authorization: `Bearer ${server.token}` } });
}

async function run(a, text, params = {}) {
  const events = [];
  if (text !== null) a.addMessage({ id: `u${Math.random()}`, role: "user", content: text });
  const { result } = await a.runAgent(params, { onEvent: ({ event }) => { events.push(event); } });
  return { events, result };
}

const shape = (events) => events.map((e) => [e.type, e.delta ?? null, e.outcome?.type ?? null]);

test("a run streams the echo like HttpAgent", async () => {
  const { events } = await run(agent("p-echo"), "hi");
  assert.deepEqual(shape(events), [["RUN_STARTED", null, null], ["TEXT_MESSAGE_START", null, null],
    ["TEXT_MESSAGE_CONTENT", "echo: hi", null], ["TEXT_MESSAGE_END", null, null],
    ["RUN_FINISHED", null, null]]);
});

test("a stream broken mid-run resumes by itself: exactly the uncut run's events", async () => {
  const uncut = await run(agent("p-uncut"), "slow");
  const a = agent("p-kick");
  const cut = await run(a, "kick");
  assert.ok(a.reattached >= 1, "the stream was re-attached");
  assert.deepEqual(shape(cut.events), shape(uncut.events));
  assert.deepEqual(cut.result, { chunks: 12 });
  const ids = new Set(cut.events.filter((e) => e.messageId).map((e) => e.messageId));
  assert.equal(ids.size, 1);
});

test("connectAgent re-attaches to a run that ended: its events from the start", async () => {
  const a = agent("p-connect");
  const first = await run(a, "hello", { runId: "run-c1" });
  const b = agent("p-connect");
  const seen = [];
  await b.connectAgent({ runId: "run-c1" }, { onEvent: ({ event }) => { seen.push(event); } });
  assert.deepEqual(seen, first.events);
  assert.equal(b.messages.at(-1).content, "echo: hello");
});

test("stop() cancels the run server-side", async () => {
  const a = agent("p-stop");
  a.addMessage({ id: "u-stop", role: "user", content: "slow" });
  const events = [];
  let stopped = false;
  await a.runAgent({ runId: "run-stop" }, { onEvent: async ({ event }) => {
    events.push(event);
    if (event.type === "TEXT_MESSAGE_CONTENT" && !stopped) { stopped = true; await a.stop(); }
  } });
  assert.deepEqual(events.at(-1).outcome, { type: "cancelled" });
  assert.equal(events.filter((e) => e.type === "TEXT_MESSAGE_END").length, 1);
});

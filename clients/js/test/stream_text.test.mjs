// server.stream_text seen from the TypeScript client: a fast model's 2,000 tokens arrive as
// one START, a bounded number of PARTs and one END; a RUN_CANCEL stops a slow one within
// one part.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { makeClient, startServer, waitFor, TRANSPORTS } from "./helpers.mjs";

let server;
before(async () => { server = await startServer({ echoMessages: false }); });
after(async () => { await server.stop(); });

/** Every chunk of every text the client reads, as it arrives (until the client closes). */
function collect(client) {
  const chunks = [];
  const done = (async () => {
    for await (const chunk of client.texts()) chunks.push(chunk);
  })();
  return { chunks, done };
}

for (const transport of TRANSPORTS) {
  describe(transport, () => {
    test("2,000 tokens: one START, at most the documented number of PARTs, one END", async () => {
      const client = makeClient(server, transport);
      await client.connect();
      const { chunks } = collect(client);
      const started = Date.now();
      const result = await client.callTool("model", { tokens: 2000 });
      const elapsed = Date.now() - started;
      await waitFor(() => chunks.some((c) => c.kind === "end" && c.messageId === result.message_id),
        "the END of the streamed text");
      const mine = chunks.filter((c) => c.messageId === result.message_id);
      const kinds = mine.map((c) => c.kind);
      assert.equal(kinds.filter((k) => k === "start").length, 1);
      assert.equal(kinds.filter((k) => k === "end").length, 1);
      assert.equal(kinds[0], "start");
      assert.equal(kinds.at(-1), "end");
      const parts = mine.filter((c) => c.kind === "part");
      const text = parts.map((c) => c.content).join("");
      let expected = "";
      for (let i = 0; i < 2000; i++) expected += `t${i} `;
      assert.equal(text, expected);
      assert.equal(mine.at(-1).text, expected);
      assert.equal(parts.length, result.parts);
      // the budget (docs/PROTOCOL.md §12): a part per 2048 characters, plus one per 50 ms
      assert.ok(parts.length <= Math.ceil(expected.length / 2048) + Math.ceil(elapsed / 50) + 1,
        `${parts.length} parts for ${expected.length} characters in ${elapsed} ms`);
      assert.equal(result.stopped, null);
      await client.close();
    });

    test("RUN_CANCEL mid-stream stops it within one part, and the text still ends", async () => {
      const client = makeClient(server, transport);
      await client.connect();
      const { chunks } = collect(client);
      const seen = [];
      client.on("message", (msg) => seen.push(msg));
      const runId = await client.startRun();
      // tokens 30 ms apart (each its own part); the call is not the run's own, so only
      // stream_text's check of the run stops the stream
      const call = client.callTool("model", { tokens: 500, delay_ms: 30, run_id: runId });
      await waitFor(() => chunks.filter((c) => c.kind === "part").length >= 3, "three parts");
      await client.cancelRun(runId);
      const result = await call;
      assert.equal(result.stopped, "run_cancelled");
      await waitFor(() => chunks.some((c) => c.kind === "end" && c.messageId === result.message_id),
        "the END of the cancelled text");
      // every message in seq order (the wire's order): what came after RUN_FINISHED came
      // after the server had handled the cancel
      const finishedAt = seen.findIndex((m) => m.type === "RUN_FINISHED" && m.payload.run_id === runId);
      assert.ok(finishedAt >= 0);
      const late = seen.slice(finishedAt).filter((m) => m.type === "MESSAGE_PART");
      assert.ok(late.length <= 1, `${late.length} parts after RUN_FINISHED`);
      const parts = chunks.filter((c) => c.kind === "part" && c.messageId === result.message_id);
      assert.equal(parts.length, result.parts);
      assert.ok(result.parts < 500, "stopped long before the end");
      await client.close();
    });
  });
}

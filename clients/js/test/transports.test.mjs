// Each transport against a live protoflask: handshake, a streamed reply read with
// texts(), tools (progress, errors), runs, ping, tool list, state events.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ConnectionRefused, RunError, ServerError, ToolError } from "../dist/index.js";
import { makeClient, startServer, TRANSPORTS } from "./helpers.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

for (const transport of TRANSPORTS) {
  describe(transport, () => {
    test("handshake, echo text, tools, runs, ping", async () => {
      const client = makeClient(server, transport);
      const states = [];
      client.on("state", (state) => states.push(state));
      const hello = await client.connect();
      assert.equal(hello.session, client.session);
      assert.equal(hello.last_client_seq, "0");
      assert.deepEqual(states, ["connecting", "ready"]);

      client.sendText(["hello ", "from ", "typescript"]);
      const chunks = [];
      for await (const chunk of client.texts()) {
        chunks.push(chunk);
        if (chunk.kind === "end") break;
      }
      assert.equal(chunks[0].kind, "start");
      assert.equal(chunks.at(-1).text, "hello from typescript");
      assert.equal(chunks.filter((c) => c.kind === "part").map((c) => c.content).join(""), "hello from typescript");
      assert.equal(chunks[0].channel, "AGENT");

      assert.deepEqual(await client.callTool("add", { a: 2, b: 40 }), { result: 42 });
      const progress = [];
      assert.deepEqual(await client.callTool("slow", { steps: 4, delay_ms: 5 }, { onProgress: (p) => progress.push(p) }),
        { steps: 4 });
      assert.deepEqual(progress, [25, 50, 75, 100]);

      await assert.rejects(client.callTool("nope", {}), (e) => e instanceof ToolError && e.code === "TOOL_NOT_FOUND");
      await assert.rejects(client.callTool("fail", {}), (e) => e instanceof ToolError && e.code === "TOOL_EXECUTION_ERROR");
      await assert.rejects(client.callTool("add", { a: "x" }),
        (e) => e instanceof ToolError && e.code === "INVALID_MESSAGE" && Array.isArray(e.detail));

      const tools = await client.listTools();
      assert.ok(tools.some((t) => t.name === "stream_text"));

      const runId = await client.startRun({ threadId: "t1" });
      assert.deepEqual(await client.callTool("add", { a: 1, b: 1 }, { runId }), { result: 2 });
      const finished = await client.finishRun(runId, "done");
      assert.equal(finished.status, "finished");
      const other = await client.startRun();
      assert.equal((await client.cancelRun(other)).status, "cancelled");
      await assert.rejects(client.finishRun("no-such-run"), (e) => e instanceof ServerError && e.code === "RUN_NOT_FOUND");
      assert.ok(RunError);

      assert.ok((await client.ping()) >= 0);
      await client.close();
      assert.equal(client.state, "closed");
      assert.deepEqual(states.at(-1), "closed");
    });

    test("a bad token is refused with its code", async () => {
      const client = makeClient(server, transport, { token: "not-a-jwt" });
      await assert.rejects(client.connect(), (e) => e instanceof ConnectionRefused && e.status === 401 && e.code === "INVALID_TOKEN");
      assert.equal(client.state, "closed");
    });
  });
}

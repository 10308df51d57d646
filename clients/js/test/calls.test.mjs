// Tool calls at volume, cancellation through an AbortSignal, and credit both ways.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ToolCancelled } from "../dist/index.js";
import { makeClient, startServer, VARIANTS } from "./helpers.mjs";

let server;
let tight;
before(async () => {
  server = await startServer();
  // two upstream messages of credit, topped up only at zero: a three-part text must wait
  tight = await startServer({ flowControl: { initialCreditMessages: 2, creditThreshold: 0 } });
});
after(async () => {
  await server.stop();
  await tight.stop();
});

for (const { name, transport, options } of VARIANTS) {
  describe(name, () => {
    test("2,000 sequential calls", async () => {
      const client = makeClient(server, transport, options);
      const out = [];
      client.on("frame", (dir, raw, msg) => dir === "out" && out.push(msg.type));
      await client.connect();
      for (let i = 0; i < 2000; i++) {
        const { result } = await client.callTool("add", { a: i, b: 1 });
        assert.equal(result, i + 1);
      }
      // downstream credit was not asked for: the client never granted any
      assert.equal(out.filter((t) => t === "FLOW_UPDATE").length, 0);
      const hello = JSON.parse(JSON.stringify(client.serverHello));
      assert.equal(hello.session, client.session);
      await client.close();
    });

    test("aborting the signal sends TOOL_CANCEL and the call rejects CANCELLED", async () => {
      const client = makeClient(server, transport, options);
      const frames = [];
      client.on("frame", (dir, raw, msg) => frames.push([dir, msg.type, msg.payload]));
      await client.connect();
      const controller = new AbortController();
      const call = client.callTool("slow", { steps: 200, delay_ms: 20 }, {
        signal: controller.signal,
        onProgress: () => controller.abort(),
      });
      await assert.rejects(call, (e) => e instanceof ToolCancelled && e.code === "CANCELLED");
      const cancel = frames.find(([dir, type]) => dir === "out" && type === "TOOL_CANCEL");
      assert.ok(cancel, "TOOL_CANCEL was sent");
      const done = frames.find(([dir, type]) => dir === "in" && type === "TOOL_DONE");
      assert.equal(done[2].status, "CANCELLED");
      assert.equal(done[2].call_id, cancel[2].call_id);
      // an already aborted signal never sends the call
      await assert.rejects(client.callTool("add", { a: 1, b: 2 }, { signal: AbortSignal.abort() }), ToolCancelled);
      await client.close();
    });

    test("upstream credit is spent and refilled; downstream credit when asked", async () => {
      const client = makeClient(tight, transport, { ...options, downstream: { messages: 10 } });
      const frames = [];
      const errors = [];
      client.on("frame", (dir, raw, msg) => frames.push([dir, msg.type, msg.payload]));
      client.on("error", (e) => errors.push(String(e)));
      await client.connect();
      const hello = frames.find(([dir, type]) => dir === "out" && type === "HELLO");
      assert.equal(hello[2].capabilities.flow_control.downstream, true);
      for (let i = 0; i < 5; i++) client.sendText(["a", "b", `${i}`]);
      for (let i = 0; i < 5; i++) assert.equal((await client.nextText()).text, `ab${i}`);
      // 100 progress updates against 10 messages of downstream credit: the client grants more
      assert.deepEqual(await client.callTool("slow", { steps: 100, delay_ms: 0 }), { steps: 100 });
      const grants = frames.filter(([dir, type, p]) => dir === "out" && type === "FLOW_UPDATE" && p.channel === "AGENT");
      assert.ok(grants.length >= 10, `granted ${grants.length} times`);
      assert.ok(frames.some(([dir, type, p]) => dir === "in" && type === "FLOW_UPDATE" && p.channel === "USER"));
      assert.deepEqual(errors, []);
      await client.close();
    });
  });
}

// Drops and resumes: the server cuts every connection mid-text, or the client drops its
// own mid-upload; every message arrives exactly once, in order, both ways.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { makeClient, startServer, VARIANTS, waitFor } from "./helpers.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

for (const { name, transport, options } of VARIANTS) {
  describe(name, () => {
    test("the server drops the connection mid-stream: the text arrives whole, once", async () => {
      const client = makeClient(server, transport, options);
      const errors = [];
      client.on("error", (e) => errors.push(e));
      await client.connect();
      const session = client.session;
      const call = client.callTool("stream_text", { parts: 300, kick_at: 100 });
      const parts = [];
      let end;
      for await (const chunk of client.texts()) {
        if (chunk.kind === "part") parts.push(chunk.content);
        if (chunk.kind === "end") {
          end = chunk;
          break;
        }
      }
      const result = await call;
      assert.equal(end.messageId, result.message_id);
      assert.deepEqual(parts, Array.from({ length: 300 }, (_, i) => `p${i} `));
      assert.equal(end.text, parts.join(""));
      // The replay is written as soon as the socket is back, before the client's HELLO
      // gets its reply (docs/PROTOCOL.md §8), and `reconnects` counts that reply: the
      // whole text can be here a frame before the resume is counted.
      await waitFor(() => client.reconnects >= 1, "the client resumed");
      assert.equal(client.session, session, "the same session");
      assert.deepEqual(errors, []);
      await client.close();
    });

    test("the client drops mid-upload: every text reaches the server once", async () => {
      const client = makeClient(server, transport, options);
      const errors = [];
      client.on("error", (e) => errors.push(e));
      await client.connect();
      const sent = [];
      const send = (from, to) => {
        for (let i = from; i < to; i++) {
          client.sendText([`text `, `${i}`]);
          sent.push(`text ${i}`);
        }
      };
      send(0, 20);
      client.dropConnection(); // 20 texts written or queued, none confirmed yet
      send(20, 40); // queued while it reconnects
      await waitFor(() => client.reconnects === 1 && client.state === "ready", "the first resume");
      send(40, 60);
      client.dropConnection();
      const echoed = [];
      while (echoed.length < sent.length) echoed.push((await client.nextText({ timeoutMs: 15000 })).text);
      assert.deepEqual(echoed, sent);
      assert.ok(client.reconnects >= 2);
      // nothing more arrives (no duplicate echo), and the server saw no protocol error
      assert.equal(await client.ping() >= 0, true);
      await assert.rejects(client.nextText({ timeoutMs: 300 }), /TIMEOUT/);
      assert.deepEqual(errors.map(String), []);
      await client.close();
    });

    test("a message sent again after a drop keeps its seq (a late first copy is dropped)", async () => {
      // the HELLO reply's last_client_seq is what the server had seen when it answered: a
      // POST cut off by the drop may still reach it afterwards, so a resend goes under
      // the message's own seq and the server drops whichever copy comes second
      const client = makeClient(server, transport, options);
      const seqsById = new Map();
      client.on("frame", (dir, raw, msg) => {
        if (dir !== "out" || msg.type === "HELLO" || msg.type === "PING" || msg.type === "ACK") return;
        seqsById.set(msg.id, [...(seqsById.get(msg.id) ?? []), msg.seq]);
      });
      await client.connect();
      const sent = [];
      for (let round = 0; round < 3; round++) {
        for (let i = 0; i < 20; i++) {
          client.sendText([`r${round} `, `${i}`]);
          sent.push(`r${round} ${i}`);
        }
        client.dropConnection(); // written, none confirmed yet: sent again after the HELLO
        await waitFor(() => client.reconnects === round + 1 && client.state === "ready", "a resume");
      }
      const echoed = [];
      while (echoed.length < sent.length) echoed.push((await client.nextText({ timeoutMs: 15000 })).text);
      assert.deepEqual(echoed, sent);
      const resent = [...seqsById.values()].filter((seqs) => seqs.length > 1);
      assert.ok(resent.length > 0, "some message was sent again");
      for (const seqs of resent) assert.deepEqual(new Set(seqs).size, 1, `one seq: ${seqs}`);
      await client.close();
    });

    test("after a resume the client confirms what it sends again (idle PING)", async () => {
      // Over WebSocket and the duplex stream nothing confirms a message by itself: an
      // idle PING does. A drop while that PING's timer was pending left the timer's old
      // id behind, so it was never armed again: messages stayed unconfirmed, a resend
      // among them went again at every resume, and once 768 seqs old under a new seq,
      // which the server ran a second time (the soak's TypeScript call done twice).
      if (transport === "sse" || options.duplex === false) return; // (a POST confirms)
      const client = makeClient(server, transport, options);
      const confirms = [];
      client.on("frame", (dir, raw, msg) => {
        if (dir === "out" && msg.type === "PING" && String(msg.payload.nonce).startsWith("confirm-")) {
          confirms.push(client.reconnects);
        }
      });
      await client.connect();
      client.sendText(["before ", "the drop"]); // arms the idle PING's timer
      client.dropConnection(); // while it is pending
      await waitFor(() => client.reconnects === 1 && client.state === "ready", "the resume");
      client.sendText(["after ", "the drop"]);
      await waitFor(() => confirms.some((at) => at === 1), "an idle PING after the resume", 5000);
      assert.equal((await client.nextText({ timeoutMs: 15000 })).text, "before the drop");
      assert.equal((await client.nextText({ timeoutMs: 15000 })).text, "after the drop");
      await client.close();
    });
  });
}

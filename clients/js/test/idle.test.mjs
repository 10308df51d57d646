// An idle client sends nothing but its PONG to each server PING: counted on the live
// server (/stats totalMessages counts every upstream message it handled), per transport.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { makeClient, startServer, VARIANTS, waitFor } from "./helpers.mjs";

const PINGS = 6;
let server;
before(async () => {
  server = await startServer({ heartbeatInterval: 200, heartbeatTimeout: 5000 });
});
after(async () => {
  await server.stop();
});

async function received() {
  const stats = await (await fetch(`${server.url}/stats`)).json();
  return stats.totalMessages;
}

for (const variant of VARIANTS) {
  test(`${variant.name}: idle, one message per heartbeat at most`, async () => {
    const client = makeClient(server, variant.transport, variant.options);
    let pings = 0;
    client.on("message", (msg) => {
      if (msg.type === "PING") pings += 1;
    });
    await client.connect();
    // some traffic first, so anything it leaves to confirm or acknowledge is settled below
    assert.deepEqual(await client.callTool("add", { a: 1, b: 2 }), { result: 3 });
    await waitFor(() => pings >= 2, "two heartbeats after the call");
    const before = await received();
    const from = pings;
    await waitFor(() => pings >= from + PINGS, `${PINGS} heartbeats`);
    const sent = (await received()) - before;
    await client.close();
    // PINGS PONGs, one more for a PONG in flight when counting started or ended
    assert.ok(sent <= PINGS + 1, `${sent} upstream messages over ${PINGS} heartbeats`);
    assert.ok(sent >= PINGS - 1, `the client answers the heartbeat (${sent} over ${PINGS})`);
  });
}

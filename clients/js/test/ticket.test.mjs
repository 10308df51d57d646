// The connect ticket: the WebSocket URL carries a single-use ticket, never the token;
// an older server without POST /proto/ticket (404) gets `token=` instead.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import WebSocket from "ws";
import { makeClient, startServer } from "./helpers.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

function recordingWebSocket(urls) {
  return class extends WebSocket {
    constructor(url) {
      urls.push(new URL(url));
      super(url);
    }
  };
}

test("a server without /proto/ticket (404): the client falls back to token=", async () => {
  const urls = [];
  const tickets = [];
  const oldServer = (input, init) => {
    if (new URL(input).pathname.endsWith("/proto/ticket")) {
      tickets.push(input);
      return Promise.resolve(new Response('{"error": {"code": "NOT_FOUND", "message": "no"}}', { status: 404 }));
    }
    return fetch(input, init);
  };
  const client = makeClient(server, "websocket", { WebSocket: recordingWebSocket(urls), fetch: oldServer });
  await client.connect();
  client.dropConnection();
  assert.equal((await client.nextText({ timeoutMs: 1 }).catch(() => "none")), "none");
  client.sendText("after the drop");
  assert.equal((await client.nextText()).text, "after the drop");
  assert.equal(tickets.length, 1, "asked once, then remembered the server has none");
  assert.equal(urls.length, 2);
  for (const url of urls) {
    assert.equal(url.searchParams.get("token"), server.token);
    assert.equal(url.searchParams.has("ticket"), false);
  }
  assert.equal(urls[1].searchParams.get("session"), client.session);
  await client.close();
});

test("a server with /proto/ticket: every (re)connect uses a fresh ticket, never the token", async (t) => {
  const probe = await fetch(`${server.url}/proto/ticket`, {
    method: "POST", headers: { Authorization: `Bearer ${server.token}` },
  });
  await probe.body?.cancel();
  if (probe.status === 404) {
    t.skip("this server has no POST /proto/ticket yet");
    return;
  }
  assert.equal(probe.status, 200);
  const urls = [];
  const client = makeClient(server, "websocket", { WebSocket: recordingWebSocket(urls) });
  await client.connect();
  client.dropConnection();
  client.sendText("after the drop");
  assert.equal((await client.nextText()).text, "after the drop");
  assert.equal(urls.length, 2);
  assert.notEqual(urls[0].searchParams.get("ticket"), urls[1].searchParams.get("ticket"));
  for (const url of urls) {
    assert.ok(url.searchParams.get("ticket"));
    assert.equal(url.searchParams.has("token"), false);
    assert.equal(url.href.includes(server.token), false);
  }
  await client.close();
});

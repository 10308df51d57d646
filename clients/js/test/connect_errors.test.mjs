// "Could not connect" is one error class on every transport, with its cause; a refused
// upgrade keeps the server's 426 hint; a duplex stream behind a proxy that buffers request
// bodies says so. Against a live protoflask, through small proxies written here.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";
import { ConnectionFailed, ConnectionRefused, ProtoClient } from "../dist/index.js";
import { makeClient, startServer, VARIANTS } from "./helpers.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

/** A URL where nothing listens. */
async function deadUrl() {
  const probe = http.createServer();
  await new Promise((r) => probe.listen(0, "127.0.0.1", r));
  const { port } = probe.address();
  await new Promise((r) => probe.close(r));
  return `http://127.0.0.1:${port}`;
}

/** An HTTP proxy in front of the test server: `stripUpgrade` passes a WebSocket upgrade on
 * as a plain GET (a proxy that drops hop-by-hop headers); `bufferBodies` forwards a
 * request only once its whole body has arrived. */
async function proxy({ stripUpgrade = false, bufferBodies = false } = {}) {
  const target = new URL(server.url);
  const upstream = (method, url, headers, onResponse) =>
    http.request({ host: target.hostname, port: target.port, method, path: url, headers }, onResponse);
  const srv = http.createServer((req, res) => {
    const forward = (body) => {
      const up = upstream(req.method, req.url, req.headers, (r) => {
        res.writeHead(r.statusCode, r.headers);
        r.pipe(res);
      });
      up.on("error", () => res.destroy());
      if (body) up.end(body);
      else req.pipe(up);
    };
    if (!bufferBodies) return forward();
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => forward(Buffer.concat(chunks)));
  });
  if (stripUpgrade) {
    srv.on("upgrade", (req, socket) => {
      const headers = Object.fromEntries(Object.entries(req.headers)
        .filter(([k]) => !["upgrade", "connection"].includes(k) && !k.startsWith("sec-websocket")));
      upstream("GET", req.url, headers, (r) => {
        const chunks = [];
        r.on("data", (c) => chunks.push(c));
        r.on("end", () => {
          const body = Buffer.concat(chunks);
          socket.end(`HTTP/1.1 ${r.statusCode} ${r.statusMessage}\r\nContent-Type: ${r.headers["content-type"]}\r\n`
            + `Content-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
        });
      }).end();
    });
  }
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${srv.address().port}`,
    close: () => {
      srv.closeAllConnections();
      return new Promise((r) => srv.close(r));
    },
  };
}

for (const variant of VARIANTS) {
  test(`${variant.name}: no server is ConnectionFailed with its cause`, async () => {
    const url = await deadUrl();
    const client = makeClient({ ...server, url }, variant.transport, { ...variant.options, timeoutMs: 5000 });
    await assert.rejects(client.connect(), (e) => {
      assert.ok(e instanceof ConnectionFailed, `${e?.name}: ${e?.message}`);
      assert.equal(e.code, "UNREACHABLE");
      assert.ok(e.cause, "the cause is kept");
      assert.match(e.message, /127\.0\.0\.1/);
      return true;
    });
    assert.equal(client.state, "closed");
  });
}

test("websocket: an upgrade a proxy turned into a plain GET keeps the server's 426 hint", async () => {
  const front = await proxy({ stripUpgrade: true });
  try {
    const client = makeClient({ ...server, url: front.url }, "websocket", { timeoutMs: 5000 });
    await assert.rejects(client.connect(), (e) => {
      assert.ok(e instanceof ConnectionRefused, `${e?.name}: ${e?.message}`);
      assert.equal(e.status, 426);
      assert.equal(e.code, "UPGRADE_REQUIRED");
      assert.match(e.message, /proxy/i);
      return true;
    });
    // the same proxy passes everything else: SSE works through it
    const sse = makeClient({ ...server, url: front.url }, "sse");
    await sse.connect();
    await sse.close();
  } finally {
    await front.close();
  }
});

test("stream (duplex): a proxy that buffers request bodies is named, not a bare TIMEOUT", async () => {
  const front = await proxy({ bufferBodies: true });
  try {
    const client = makeClient({ ...server, url: front.url }, "stream", { duplex: true, timeoutMs: 1500 });
    await assert.rejects(client.connect(), (e) => {
      assert.ok(e instanceof ConnectionFailed, `${e?.name}: ${e?.message}`);
      assert.match(e.message, /proxy_request_buffering off/);
      assert.match(e.message, /duplex: false/);
      assert.equal(e.cause?.code, "TIMEOUT");
      return true;
    });
    // and what the message suggests works through the same proxy
    const posts = makeClient({ ...server, url: front.url }, "stream", { duplex: false });
    await posts.connect();
    assert.deepEqual(await posts.callTool("add", { a: 1, b: 2 }), { result: 3 });
    await posts.close();
  } finally {
    await front.close();
  }
});

test("duplex: true outside Node is refused at construction, with what to do instead", () => {
  const saved = Object.getOwnPropertyDescriptor(globalThis, "process");
  // what a browser looks like to the client: no process.versions.node
  Object.defineProperty(globalThis, "process", { value: undefined, configurable: true, writable: true });
  try {
    assert.throws(
      () => new ProtoClient({ url: server.url, token: server.token, transport: "stream", duplex: true }),
      (e) => e instanceof TypeError && /duplex: true needs Node/.test(e.message) && /leave duplex out/.test(e.message),
    );
  } finally {
    Object.defineProperty(globalThis, "process", saved);
  }
});

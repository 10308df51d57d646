// Shared by the tests: start a live protoflask (test/server.py) and make clients.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { ProtoClient } from "../dist/index.js";

const SERVER = fileURLToPath(new URL("./server.py", import.meta.url));
/** The AG-UI test server (test/agui_server.py): agents whose handlers stream, call tools, fail. */
export const AGUI_SERVER = fileURLToPath(new URL("./agui_server.py", import.meta.url));
export const TRANSPORTS = ["websocket", "sse", "stream"];
/** Every way the client can talk: the stream both full duplex (Node's default) and with
 * follow-up POSTs (what a browser does). */
export const VARIANTS = [
  { name: "websocket", transport: "websocket", options: {} },
  { name: "sse", transport: "sse", options: {} },
  { name: "stream (duplex)", transport: "stream", options: { duplex: true } },
  { name: "stream (follow-up POSTs)", transport: "stream", options: { duplex: false } },
];

/** Start a server (config overrides as in protoflask's config; `script`: test/server.py
 * unless given); resolves {url, token, stop}. */
export async function startServer(config = {}, script = SERVER) {
  const python = process.env.PROTOFLASK_PYTHON || "python";
  const child = spawn(python, [script, JSON.stringify(config)], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout });
  const info = await new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`test server exited with ${code}`)));
    lines.once("line", (line) => resolve(JSON.parse(line)));
  });
  child.removeAllListeners("exit");
  return {
    ...info,
    async stop() {
      const gone = new Promise((resolve) => child.once("exit", resolve));
      child.stdin.end();
      const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
      await gone;
      clearTimeout(timer);
    },
  };
}

export function makeClient(server, transport, options = {}) {
  return new ProtoClient({ url: server.url, token: server.token, transport, WebSocket, ...options });
}

/** Wait until fn() is truthy (polling); throws after `within` ms with `what`. */
export async function waitFor(fn, what, within = 10000) {
  const deadline = Date.now() + within;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

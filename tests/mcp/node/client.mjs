// The official MCP TypeScript SDK's client (@modelcontextprotocol/sdk: Client +
// StreamableHTTPClientTransport) against protoflask's /proto/mcp. Driven by
// tests/mcp/test_node_client.py, which reads one JSON object per stdout line:
//   node client.mjs calls <url> <token>    tools/list, add, echo, a schema error, the slow
//                                           tool with every progress notification, then
//                                           the waiting tool aborted (notifications/cancelled)
//   node client.mjs calls <url> <token> <url-b>   the same, every request but initialize
//                                           sent to <url-b> (another node of a cluster)
//   node client.mjs tasks <url> <token>    the SDK's experimental Tasks client: the slow
//                                           tool through callToolStream (task created,
//                                           polled, result), then the waiting tool as a
//                                           task cancelled with cancelTask
//   node client.mjs refused <url> <token>  connects with a refused token: prints the error
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, url, token, urlB] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

// With <url-b>: initialize to <url>, everything else to <url-b>.
const routed = (input, init) => {
  const body = typeof init?.body === "string" ? init.body : "";
  const initialize = body.includes('"method":"initialize"');
  return fetch(urlB && !initialize ? urlB : input, init);
};

const client = new Client({ name: "protoflask-node-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
  fetch: routed,
});

if (mode === "refused") {
  try {
    await client.connect(transport);
    out({ kind: "connected" });
  } catch (err) {
    out({ kind: "refused", code: err.code ?? null, message: String(err.message ?? err) });
  }
  process.exit(0);
}

if (mode === "tasks") {
  await client.connect(transport);
  await client.listTools(); // the SDK learns which tools may run as tasks
  const tasks = client.experimental.tasks;
  const seen = [];
  for await (const message of tasks.callToolStream({ name: "slow", arguments: { steps: 5 } })) {
    seen.push(message.type === "result" ? { type: "result", result: message.result }
      : message.type === "error" ? { type: "error", error: String(message.error) }
      : { type: message.type, task: message.task });
  }
  out({ kind: "stream", seen });
  const created = await client.request(
    { method: "tools/call", params: { name: "wait", arguments: {}, task: {} } },
    (await import("@modelcontextprotocol/sdk/types.js")).CreateTaskResultSchema);
  out({ kind: "created", task: created.task });
  out({ kind: "cancelled", task: await tasks.cancelTask(created.task.taskId) });
  out({ kind: "after", task: await tasks.getTask(created.task.taskId) });
  out({ kind: "list", tasks: (await tasks.listTasks()).tasks });
  await transport.terminateSession();
  await client.close();
  out({ kind: "end" });
  process.exit(0);
}

await client.connect(transport);
out({ kind: "connected", version: transport.protocolVersion ?? null,
      session: transport.sessionId });
out({ kind: "tools", tools: (await client.listTools()).tools });
out({ kind: "add", result: await client.callTool({ name: "add", arguments: { a: 2, b: 40 } }) });
out({ kind: "echo", result: await client.callTool({ name: "echo",
                                                     arguments: { message: "node" } }) });
out({ kind: "schema", result: await client.callTool({ name: "add",
                                                       arguments: { a: "x", b: 1 } }) });
const progress = [];
const slow = await client.callTool({ name: "slow", arguments: { steps: 5 } }, undefined,
                                   { onprogress: (p) => progress.push(p) });
out({ kind: "slow", result: slow, progress });

const abort = new AbortController();
const waiting = client.callTool({ name: "wait", arguments: {} }, undefined, {
  signal: abort.signal,
  onprogress: () => abort.abort("the test cancels it"),
});
try {
  await waiting;
  out({ kind: "wait", outcome: "finished" });
} catch (err) {
  out({ kind: "wait", outcome: "aborted", message: String(err.message ?? err) });
}
// the session still answers after a cancelled call
out({ kind: "after", result: await client.callTool({ name: "add", arguments: { a: 1, b: 1 } }) });
await transport.terminateSession();
await client.close();
out({ kind: "end" });

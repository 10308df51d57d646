// The TypeScript client (clients/js/dist) for tests/cluster/test_client_retry.py: connect
// (argv: url, token, transport), one call, print "ready", wait for a line on stdin (the
// test has killed Redis), then six calls (sse, or the stream with follow-up POSTs); print {"results", "reconnects"} and exit.
import { createInterface } from "node:readline";
import { ProtoClient } from "../../../clients/js/dist/index.js";

const [url, token, transport] = process.argv.slice(2);
const client = new ProtoClient({ url, token, transport, duplex: false });
await client.connect();
await client.callTool("add", { a: 1, b: 1 });
console.log("ready");
const lines = createInterface({ input: process.stdin });
await new Promise((resolve) => lines.once("line", resolve));
const results = [];
for (let n = 0; n < 6; n++) results.push((await client.callTool("add", { a: n, b: 1 })).result);
console.log(JSON.stringify({ results, reconnects: client.reconnects }));
await client.close();
process.exit(0);

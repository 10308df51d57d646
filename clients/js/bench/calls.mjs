// Sequential tool calls and a mid-stream drop per transport, timed (not a test: figures
// for docs/RELIABILITY.md). Usage: PROTOFLASK_PYTHON=python node bench/calls.mjs [calls]
import { makeClient, startServer, VARIANTS } from "../test/helpers.mjs";

const calls = Number(process.argv[2] || 2000);
const server = await startServer();
try {
  for (const { name, transport, options } of VARIANTS) {
    const client = makeClient(server, transport, options);
    await client.connect();
    let t0 = performance.now();
    for (let i = 0; i < calls; i++) await client.callTool("add", { a: i, b: 1 });
    const perCall = (performance.now() - t0) / calls;
    t0 = performance.now();
    const call = client.callTool("stream_text", { parts: 300, kick_at: 100 });
    let parts = 0;
    for await (const chunk of client.texts()) {
      if (chunk.kind === "part") parts += 1;
      if (chunk.kind === "end") break;
    }
    await call;
    const resumeMs = performance.now() - t0;
    console.log(`${name.padEnd(26)} ${calls} calls: ${perCall.toFixed(2)} ms/call; ` +
      `300-part text with a server-side drop at part 100: ${parts} parts in ${resumeMs.toFixed(0)} ms, ` +
      `${client.reconnects} resume(s)`);
    await client.close();
  }
} finally {
  await server.stop();
}

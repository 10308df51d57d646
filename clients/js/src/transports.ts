/**
 * The three transports, each reduced to a "link": one connection that carries raw
 * envelopes both ways and reports when it ends. Sessions, sequence numbers, credit and
 * resume are the client's (client.ts); a link only frames bytes.
 *
 * - websocket: GET /proto/websocket (text frames both ways)
 * - sse:       GET /proto/sse read with fetch streaming (so the Authorization and
 *              Last-Event-ID headers can be sent in every runtime), upstream
 *              POST /proto/sse?session=<id> (NDJSON batches, one POST at a time)
 * - stream:    POST /proto/stream, NDJSON both ways: full duplex (the request body is a
 *              stream the client keeps writing to) where the runtime can stream request
 *              bodies, else a body holding the HELLO plus follow-up POST /proto/stream?session=
 */

import { ConnectionFailed, ConnectionRefused, ProtoError } from "./errors.js";

export type TransportName = "websocket" | "sse" | "stream";

/** The subset of the WHATWG WebSocket the client uses (browsers, Node 22+, `ws`). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

export type WebSocketConstructor = new (url: string) => WebSocketLike;

export type FetchLike = (input: string, init?: RequestInit & { duplex?: "half" }) => Promise<Response>;

export interface CloseInfo {
  /** The WebSocket close code, or the code of an SSE `close` event; 1006: cut off. */
  code: number;
  reason: string;
  /** Set when the connection was refused before it opened. */
  error?: ProtoError;
}

export interface LinkHandlers {
  /** The link can carry the HELLO now. `session` is known for SSE and resumes. */
  open(session?: string): void;
  raw(raw: string): void;
  /** Called exactly once. */
  closed(info: CloseInfo): void;
  /** The server has surely received the upstream messages `first`..`last` (a 202). */
  confirmed(last: number, first: number): void;
  /** Something arrived (a keep-alive comment counts): the connection is alive. */
  activity(): void;
}

export interface LinkOptions {
  base: URL;
  /** Bearer token for headers (HTTP transports and POSTs). */
  token: string;
  /** WebSocket only: the query credential, `ticket=...` or `token=...`. */
  credential?: [string, string];
  session?: string;
  lastSeq?: number;
  fetch: FetchLike;
  WebSocket?: WebSocketConstructor;
  duplex: boolean;
  /** The first message to send on open (the HELLO), for transports that must send it
   * in the request that opens them. */
  hello: () => [string, number];
}

export interface Link {
  send(raw: string, seq: number): void;
  close(code?: number, reason?: string): void;
  /** True when the server confirms what a link carried with a 202 (POST upstream). */
  readonly confirmsByPost: boolean;
  /** Resolves once no upstream request of this link is in flight: the next connection
   * waits for it, so the server never reads an old POST after the resumed HELLO. */
  settled(): Promise<void>;
}

/** Read an HTTP error body `{"error": {"code", "message"}}` into a ConnectionRefused. */
export async function refusal(resp: Response): Promise<ConnectionRefused> {
  let code = "HTTP_" + resp.status;
  let message = resp.statusText || "refused";
  let detail: unknown;
  try {
    const body = await resp.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
      detail = body.error.detail;
    }
  } catch {
    /* not JSON */
  }
  return new ConnectionRefused(resp.status, code, message, detail);
}

function endpoint(opts: LinkOptions, path: string, extra: Record<string, string | undefined>): string {
  const url = new URL(path, opts.base);
  for (const [key, value] of Object.entries(extra)) {
    if (value !== undefined) url.searchParams.set(key, value);
  }
  return url.href;
}

function resumeQuery(opts: LinkOptions): Record<string, string | undefined> {
  return {
    session: opts.session,
    last_seq: opts.session !== undefined && opts.lastSeq !== undefined ? String(opts.lastSeq) : undefined,
  };
}

export function openLink(kind: TransportName, opts: LinkOptions, on: LinkHandlers): Link {
  if (kind === "websocket") return openWebSocket(opts, on);
  if (kind === "sse") return openSse(opts, on);
  return openStream(opts, on);
}

// -- WebSocket ---------------------------------------------------------------------------

function openWebSocket(opts: LinkOptions, on: LinkHandlers): Link {
  const Ctor = opts.WebSocket ?? (globalThis as any).WebSocket;
  if (!Ctor) {
    throw new ConnectionFailed("no WebSocket in this runtime: pass one in (options.WebSocket, e.g. from 'ws')");
  }
  const query: Record<string, string | undefined> = { ...resumeQuery(opts) };
  if (opts.credential) query[opts.credential[0]] = opts.credential[1];
  const url = new URL(endpoint(opts, "proto/websocket", query));
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const ws: WebSocketLike = new Ctor(url.href);
  let opened = false;
  let ended = false;
  let failure = ""; // what the runtime says went wrong (Node's ws: the HTTP status)
  const finish = (info: CloseInfo) => {
    if (ended) return;
    ended = true;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    on.closed(info);
  };
  ws.onopen = () => {
    opened = true;
    on.open(opts.session);
  };
  ws.onmessage = (ev) => {
    on.activity();
    if (typeof ev.data === "string") on.raw(ev.data);
  };
  ws.onclose = (ev) => {
    if (!opened) {
      // The browser hides the HTTP refusal of an upgrade: ask the same URL without one.
      diagnose(opts, url, failure).then((error) => finish({ code: ev.code || 1006, reason: ev.reason || "refused", error }));
      return;
    }
    finish({ code: ev.code || 1006, reason: ev.reason || "" });
  };
  ws.onerror = (ev: any) => {
    failure = String(ev?.message ?? ev?.error?.message ?? ""); // onclose follows
  };
  return {
    confirmsByPost: false,
    settled: () => Promise.resolve(),
    send(raw) {
      if (!ended && ws.readyState === 1) ws.send(raw);
    },
    close(code = 1000, reason = "bye") {
      try {
        const terminate = (ws as any).terminate;
        if (code === 1006 && typeof terminate === "function") terminate.call(ws); // ws: cut the TCP connection
        else ws.close(code === 1000 || (code >= 3000 && code <= 4999) ? code : 3000, reason);
      } catch {
        /* already closing */
      }
      finish({ code, reason });
    },
  };
}

/** After a WebSocket failed to open: the server's HTTP refusal, if it is one. Node's ws
 * names the status of a refused upgrade; a 426 (the upgrade arrived as a plain GET: a
 * proxy dropped its headers) is read again with a plain GET, whose JSON says so. A
 * browser hides the status, so the token is checked where the server checks one for any
 * client: POST /proto/ticket (an older server without it: /dashboard/data). */
async function diagnose(opts: LinkOptions, url: URL, failure: string): Promise<ProtoError> {
  try {
    if (/\b426\b/.test(failure)) {
      const plain = new URL(url.href);
      plain.protocol = plain.protocol === "wss:" ? "https:" : "http:";
      plain.searchParams.delete("ticket");
      const resp = await opts.fetch(plain.href, { headers: { Authorization: `Bearer ${opts.token}` } });
      if (resp.status === 426) return await refusal(resp);
      await resp.body?.cancel().catch(() => undefined);
    }
    const headers = { Authorization: `Bearer ${opts.token}` };
    let resp = await opts.fetch(new URL("proto/ticket", opts.base).href, { method: "POST", headers });
    if (resp.status === 404) {
      await resp.body?.cancel().catch(() => undefined);
      resp = await opts.fetch(new URL("dashboard/data", opts.base).href, { headers });
    }
    if (resp.status === 401 || resp.status === 403) return await refusal(resp);
    await resp.body?.cancel().catch(() => undefined);
    return new ConnectionFailed(
      "the WebSocket upgrade failed although the server answers HTTP and takes the token: "
        + "a proxy on the way may not pass WebSocket upgrades (it must forward the Upgrade and "
        + "Connection headers); transport \"sse\" or \"stream\" work without them",
      failure || undefined,
    );
  } catch (exc) {
    return new ConnectionFailed(`cannot reach ${opts.base.href}: ${exc}`, exc);
  }
}

// -- POST upstream (SSE, and the stream's follow-ups) ----------------------------------

/** One POST at a time, in seq order, so the server sees the upstream in order. */
/** The Link of a transport whose upstream is POSTs (SSE, the stream in a browser). */
function postedLink(poster: Poster, finish: (info: CloseInfo) => void): Link {
  return {
    confirmsByPost: true,
    settled: () => poster.idle(),
    send(raw, seq) {
      poster.push(raw, seq);
    },
    close(code = 1000, reason = "bye") {
      finish({ code, reason });
    },
  };
}

/** How long a POST answered 503 (a cluster that cannot route the session just now) is
 * posted again, and the longest Retry-After followed. */
const RETRY_503_MS = 60000;
const MAX_RETRY_AFTER_MS = 5000;

function retryAfterMs(resp: Response): number {
  const seconds = Number(resp.headers.get("Retry-After"));
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds * 1000, MAX_RETRY_AFTER_MS) : 1000;
}

class Poster {
  private queue: Array<[string, number]> = [];
  private busy = false;
  private dead = false;
  private retryingSince: number | undefined;

  constructor(
    private readonly opts: LinkOptions,
    private readonly path: string,
    private readonly session: () => string | undefined,
    private readonly on: LinkHandlers,
    private readonly fail: (info: CloseInfo) => void,
  ) {}

  push(raw: string, seq: number): void {
    if (this.dead) return;
    this.queue.push([raw, seq]);
    void this.pump();
  }

  private idleWaiters: Array<() => void> = [];

  stop(): void {
    this.dead = true;
    this.queue = [];
  }

  idle(): Promise<void> {
    if (!this.busy) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  pump = async (): Promise<void> => {
    const session = this.session();
    if (this.busy || this.dead || !this.queue.length || session === undefined) return;
    this.busy = true;
    const batch = this.queue.splice(0);
    // (a resend keeps its older seq: the batch's lowest and highest, not its ends)
    const seqs = batch.map(([, seq]) => seq);
    const first = Math.min(...seqs);
    const last = Math.max(...seqs);
    try {
      const resp = await this.opts.fetch(endpoint(this.opts, this.path, { session }), {
        method: "POST",
        headers: { Authorization: `Bearer ${this.opts.token}`, "Content-Type": "application/x-ndjson" },
        body: batch.map(([raw]) => raw).join("\n"),
      });
      if (resp.status === 202) {
        await resp.body?.cancel().catch(() => undefined);
        this.retryingSince = undefined;
        this.on.confirmed(last, first);
      } else if (resp.status === 503 && Date.now() - (this.retryingSince ??= Date.now()) < RETRY_503_MS) {
        // the cluster cannot route the session just now (its node reconnecting to
        // Redis, say): the same body again after Retry-After, the connection kept
        await resp.body?.cancel().catch(() => undefined);
        this.queue.unshift(...batch);
        await new Promise((resolve) => setTimeout(resolve, retryAfterMs(resp)));
      } else {
        const error = await refusal(resp);
        if (resp.status === 413) {
          // too large: the server also sent ERROR MESSAGE_TOO_LARGE downstream; the
          // body was dropped, its messages are not resent
          this.on.confirmed(last, first);
        } else {
          this.fail({ code: 1006, reason: `POST answered ${resp.status}`, error });
        }
      }
    } catch (exc) {
      this.fail({ code: 1006, reason: `POST failed: ${exc}` });
    } finally {
      this.busy = false;
      for (const wake of this.idleWaiters.splice(0)) wake();
    }
    void this.pump();
  };
}

// -- line readers ---------------------------------------------------------------------------

async function readLines(body: ReadableStream<Uint8Array>, line: (text: string) => void, chunk: () => void): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunk();
    buffer += decoder.decode(value, { stream: true });
    let at: number;
    while ((at = buffer.indexOf("\n")) >= 0) {
      let text = buffer.slice(0, at);
      buffer = buffer.slice(at + 1);
      if (text.endsWith("\r")) text = text.slice(0, -1);
      line(text);
    }
  }
  buffer += decoder.decode();
  if (buffer) line(buffer);
}

// -- SSE ----------------------------------------------------------------------------------

function openSse(opts: LinkOptions, on: LinkHandlers): Link {
  const abort = new AbortController();
  let session = opts.session;
  let ended = false;
  let closeEvent: CloseInfo | undefined;
  const finish = (info: CloseInfo) => {
    if (ended) return;
    ended = true;
    poster.stop();
    abort.abort();
    on.closed(info);
  };
  const poster = new Poster(opts, "proto/sse", () => session, on, finish);
  const headers: Record<string, string> = { Authorization: `Bearer ${opts.token}`, Accept: "text/event-stream" };
  if (opts.session !== undefined && opts.lastSeq !== undefined) headers["Last-Event-ID"] = `${opts.session}:${opts.lastSeq}`;

  (async () => {
    const resp = await opts.fetch(endpoint(opts, "proto/sse", resumeQuery(opts)), { headers, signal: abort.signal });
    if (resp.status !== 200 || !resp.body) {
      finish({ code: 1006, reason: `HTTP ${resp.status}`, error: await refusal(resp) });
      return;
    }
    let event = "";
    let data: string[] = [];
    await readLines(
      resp.body,
      (line) => {
        if (line === "") {
          const text = data.join("\n");
          const name = event || "message";
          event = "";
          data = [];
          if (!text) return;
          if (name === "session") {
            session = JSON.parse(text).session;
            on.open(session);
            void poster.pump();
          } else if (name === "close") {
            const info = JSON.parse(text);
            closeEvent = { code: Number(info.code) || 1000, reason: String(info.reason || "") };
          } else if (name === "message") {
            on.raw(text);
          }
          return;
        }
        if (line.startsWith(":")) return;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      },
      () => on.activity(),
    );
    finish(closeEvent ?? { code: 1006, reason: "the event stream ended" });
  })().catch((exc) => finish(closeEvent ?? { code: 1006, reason: `the event stream failed: ${exc}` }));

  return postedLink(poster, finish);
}

// -- NDJSON stream ----------------------------------------------------------------------------

function openStream(opts: LinkOptions, on: LinkHandlers): Link {
  return opts.duplex ? openDuplexStream(opts, on) : openPostStream(opts, on);
}

/** Browsers (and Node when asked): the HELLO as the body, follow-up POSTs upstream. */
function openPostStream(opts: LinkOptions, on: LinkHandlers): Link {
  const abort = new AbortController();
  let session = opts.session;
  let ended = false;
  const finish = (info: CloseInfo) => {
    if (ended) return;
    ended = true;
    poster.stop();
    abort.abort();
    on.closed(info);
  };
  const poster = new Poster(opts, "proto/stream", () => session, on, finish);
  const [hello] = opts.hello();

  (async () => {
    const resp = await opts.fetch(endpoint(opts, "proto/stream", resumeQuery(opts)), {
      method: "POST",
      headers: { Authorization: `Bearer ${opts.token}`, "Content-Type": "application/x-ndjson" },
      body: hello + "\n",
      signal: abort.signal,
    });
    if (resp.status !== 200 || !resp.body) {
      finish({ code: 1006, reason: `HTTP ${resp.status}`, error: await refusal(resp) });
      return;
    }
    session = resp.headers.get("Proto-Session") ?? session;
    on.open(session);
    void poster.pump();
    await readLines(resp.body, (line) => line.trim() && on.raw(line), () => on.activity());
    finish({ code: 1006, reason: "the stream ended" });
  })().catch((exc) => finish({ code: 1006, reason: `the stream failed: ${exc}` }));

  return postedLink(poster, finish);
}

/**
 * Full duplex in Node: one POST whose chunked body the client keeps writing while it
 * reads the response. Node's fetch does not do this over HTTP/1.1 (it hands over the
 * response only once the request body has ended), so this uses node:http(s), loaded
 * only here, only in Node.
 */
function openDuplexStream(opts: LinkOptions, on: LinkHandlers): Link {
  let ended = false;
  let req: any;
  const early: string[] = [];
  const finish = (info: CloseInfo) => {
    if (ended) return;
    ended = true;
    try {
      req?.destroy();
    } catch {
      /* gone */
    }
    on.closed(info);
  };
  const [hello] = opts.hello();
  const url = new URL(endpoint(opts, "proto/stream", resumeQuery(opts)));
  const modName = url.protocol === "https:" ? "node:https" : "node:http";
  (async () => {
    const mod: any = await import(/* webpackIgnore: true */ modName);
    if (ended) return;
    req = mod.request(url, {
      method: "POST",
      headers: {
        Authorization: `Bearer ${opts.token}`,
        "Content-Type": "application/x-ndjson",
        "Transfer-Encoding": "chunked",
      },
    });
    req.setNoDelay?.(true);
    req.on("error", (exc: Error) => finish({ code: 1006, reason: `the stream failed: ${exc.message}` }));
    req.on("response", (res: any) => {
      if (res.statusCode !== 200) {
        const chunks: Uint8Array[] = [];
        res.on("data", (d: Uint8Array) => chunks.push(d));
        res.on("end", async () => {
          const text = chunks.map((c) => new TextDecoder().decode(c)).join("");
          const resp = new Response(text, { status: res.statusCode });
          finish({ code: 1006, reason: `HTTP ${res.statusCode}`, error: await refusal(resp) });
        });
        return;
      }
      on.open(res.headers["proto-session"] ?? opts.session);
      const decoder = new TextDecoder();
      let buffer = "";
      res.on("data", (d: Uint8Array) => {
        on.activity();
        buffer += decoder.decode(d, { stream: true });
        let at: number;
        while ((at = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, at).trim();
          buffer = buffer.slice(at + 1);
          if (line && !ended) on.raw(line);
        }
      });
      res.on("end", () => finish({ code: 1006, reason: "the stream ended" }));
      res.on("error", () => finish({ code: 1006, reason: "the stream failed" }));
    });
    req.write(hello + "\n");
    for (const raw of early.splice(0)) req.write(raw + "\n");
  })().catch((exc) => finish({ code: 1006, reason: `the stream failed: ${exc}` }));

  return {
    confirmsByPost: false,
    settled: () => Promise.resolve(),
    send(raw) {
      if (ended) return;
      if (req) req.write(raw + "\n");
      else early.push(raw);
    },
    close(code = 1000, reason = "bye") {
      finish({ code, reason });
    },
  };
}

/**
 * ProtoClient: one protoflask session over any transport, kept across dropped
 * connections. See README.md for the API and the resume semantics; the wire protocol is
 * docs/PROTOCOL.md in the protoflask repository.
 */

import {
  ClientTimeout,
  ConnectionFailed,
  ConnectionLost,
  ConnectionRefused,
  ProtoError,
  RunError,
  ServerError,
  ToolCancelled,
  ToolError,
} from "./errors.js";
import {
  CloseInfo,
  FetchLike,
  Link,
  openLink,
  refusal,
  TransportName,
  WebSocketConstructor,
} from "./transports.js";

export const PROTO_VERSION = "1.1.2";

export type Channel = "SYSTEM" | "USER" | "AGENT" | "AUDIO_IN" | "AUDIO_OUT";

/** One protocol message (docs/PROTOCOL.md section 2). */
export interface Envelope<P = Record<string, any>> {
  id: string;
  session: string;
  seq: string;
  ts: string;
  type: string;
  channel: string;
  payload: P;
}

export type ConnectionState = "idle" | "connecting" | "ready" | "reconnecting" | "closed";

export interface ServerHello {
  proto_version: string;
  accept_major: number[];
  accept_events: string[];
  session: string;
  last_client_seq: string;
  capabilities: {
    flow_control?: { enabled: boolean; initial_credit_messages: number; initial_credit_bytes: number };
    max_concurrent_runs?: number;
    replay_window?: { size: number; time_ms: number };
    heartbeat_interval_ms?: number;
    max_message_size?: number;
    connect_ticket?: boolean;
    [key: string]: unknown;
  };
}

export interface ProtoClientOptions {
  /** The server's base URL (`https://host:8080`, or `/` in a page it serves). */
  url: string;
  /** The JWT, or a function returning a fresh one before each (re)connect. */
  token?: string;
  getToken?: () => string | Promise<string>;
  /** Default `"websocket"`. */
  transport?: TransportName;
  /** A WebSocket class where the runtime has none (Node 20: `import WebSocket from "ws"`). */
  WebSocket?: WebSocketConstructor;
  /** A fetch implementation (default: the global one). */
  fetch?: FetchLike;
  /**
   * Downstream credit: off unless asked. `true` (or `{messages, bytes}` per channel,
   * default 1000 / 16 MiB) announces `downstream: true` in HELLO; the client then grants
   * the server more with FLOW_UPDATE each time half of a channel's credit is used.
   */
  downstream?: boolean | { messages?: number; bytes?: number };
  /** A non-empty list limits what the server sends (the client adds what it needs). */
  acceptEvents?: string[];
  /** Protocol extensions asked for in the first HELLO (capabilities.extensions), e.g.
   * ["agui"]: AG-UI events on the socket (docs/AGUI.md; ProtoSocketAgent uses it). */
  extensions?: string[];
  /** Resume after a dropped connection (default true). */
  reconnect?: boolean;
  /** How long to keep trying to resume, ms (default: the server's replay window time). */
  reconnectTimeoutMs?: number;
  /** Handshake and request timeout, ms (default 10000; tool calls have none by default). */
  timeoutMs?: number;
  /** WebSocket: fetch a single-use connect ticket so the token never goes in a URL
   * (default true; falls back to `token=` when the server has no /proto/ticket). */
  ticket?: boolean;
  /** Stream transport: send upstream on the request body (default: true in Node, where
   * fetch can stream a request body over HTTP/1.1; false in browsers). */
  duplex?: boolean;
}

/** A piece of a streamed text, as it arrives. */
export interface TextChunk {
  kind: "start" | "part" | "end";
  messageId: string;
  channel: string;
  contentType: string;
  /** The PART's content ("" for start and end). */
  content: string;
  /** At `end`: the whole text. */
  text?: string;
}

/** A whole text (from {@link ProtoClient.nextText}). */
export interface Text {
  messageId: string;
  channel: string;
  contentType: string;
  text: string;
}

export interface ToolInfo {
  name: string;
  description: string;
  inputSchema: Record<string, unknown>;
  outputSchema?: Record<string, unknown> | null;
}

export interface CallToolOptions {
  /** Each TOOL_UPDATE: progress 0-100 when the tool reported one, status, partial. */
  onProgress?: (progress: number | undefined, status: string, partial: unknown) => void;
  /** Aborting sends TOOL_CANCEL; the call then rejects with ToolCancelled. */
  signal?: AbortSignal;
  runId?: string;
  callId?: string;
  timeoutMs?: number;
}

export interface RunResult {
  run_id: string;
  status: "finished" | "cancelled" | "error";
  summary?: unknown;
  error?: { code: string; message: string };
}

type Events = {
  state: (state: ConnectionState, detail: string) => void;
  /** Every server message, once, in seq order (replays already dropped). */
  message: (msg: Envelope) => void;
  /** Every frame both ways, as written or read (a resent message appears twice). */
  frame: (dir: "in" | "out", raw: string, msg: Envelope) => void;
  /** An ERROR no request was waiting for (REPLAY_UNAVAILABLE, RATE_LIMITED ...). */
  error: (error: ServerError) => void;
};

const CONTROL = new Set([
  "HELLO", "PING", "PONG", "ACK", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL", "REPLAY_REQUEST", "ERROR",
]);
/** Sent for the link of the moment, never again after a resume: nothing waits for their
 * confirmation (so they never cause a confirming PING, which would bring a PONG, an ACK ...). */
const NOT_RESENT = new Set(["PONG", "ACK", "FLOW_UPDATE"]);
/** The heartbeat (and a PING's answer): not acknowledged by themselves, so an idle client
 * sends nothing but its PONG to each server PING. */
const HEARTBEAT = new Set(["PING", "PONG"]);
const NEEDED_EVENTS = ["HELLO", "ERROR", "PING", "PONG", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL"];
/** Announced when the application did not ask for downstream credit: an older server
 * that counts downstream credit for every client then never holds messages back. */
const UNLIMITED = Number.MAX_SAFE_INTEGER;
const ACK_EVERY = 32;
const IDLE_MS = 100;
const BACKOFF_FIRST_MS = 20;
const BACKOFF_MAX_MS = 1000;
/** A resend older than this many seqs below the newest gets a new seq (the server
 * remembers 1024 seqs below its highest individually; room for one batch on top). */
const SEEN_WINDOW = 1024 - 256;
const encoder = new TextEncoder();
const byteLength = (text: string) => encoder.encode(text).length;

interface Outgoing {
  id: string;
  type: string;
  channel: string;
  payload: Record<string, any>;
  /** Sent again after a reconnect under this, its own seq: if the first copy still
   * reaches the server (a POST cut off by the reset, arriving after the HELLO), one of
   * the two is dropped as a retransmission, so a TOOL_CALL never runs twice. */
  resendSeq?: number;
}

interface Sent extends Outgoing {
  seq: number;
  bytes: number;
  spent: boolean;
}

interface Pending {
  resolve: (value: any) => void;
  reject: (error: Error) => void;
  timer?: ReturnType<typeof setTimeout>;
}

interface ToolPending extends Pending {
  callId: string;
  envelopeId: string;
  onProgress?: CallToolOptions["onProgress"];
}

function randomId(): string {
  const c = (globalThis as any).crypto;
  if (c && typeof c.randomUUID === "function") return c.randomUUID().replace(/-/g, "").slice(0, 16);
  return Math.random().toString(36).slice(2, 18);
}

function isNode(): boolean {
  const p = (globalThis as any).process;
  return !!(p && p.versions && typeof p.versions.node === "string");
}

export class ProtoClient {
  readonly transport: TransportName;
  private readonly opts: ProtoClientOptions;
  private readonly base: URL;
  private readonly fetchImpl: FetchLike;
  private readonly listeners: { [K in keyof Events]: Set<Events[K]> } = {
    state: new Set(), message: new Set(), frame: new Set(), error: new Set(),
  };
  private readonly tag = randomId().slice(0, 6);

  private _state: ConnectionState = "idle";
  private _session: string | undefined;
  private _hello: ServerHello | undefined;
  private token = "";
  private ticketsUnsupported = false;
  private link: Link | undefined;
  private lastLink: Link | undefined;
  private linkReady = false;
  private helloSeq = 0;
  private connectWaiter: Pending | undefined;
  private fatal: ProtoError | undefined;
  private closedByUser = false;
  private reconnectStarted = 0;
  private backoff = 0;
  private reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  private watchdog: ReturnType<typeof setTimeout> | undefined;
  private _reconnects = 0;

  // upstream
  private seq = 0;
  private counter = 0;
  private outbox: Outgoing[] = [];
  private unconfirmed: Sent[] = [];
  private refused: Sent[] = [];
  private upCredit: Map<string, { messages: number; bytes: number }> | null = null;
  private upInitial = { messages: 0, bytes: 0 };
  private paused = new Set<string>();
  private confirmPing: { nonce: string; seq: number } | undefined;
  private confirmTimer: ReturnType<typeof setTimeout> | undefined;

  // downstream
  private lastSeq = 0;
  private ackedSeq = 0;
  private sinceAck = 0;
  private ackTimer: ReturnType<typeof setTimeout> | undefined;
  private down = new Map<string, { messages: number; bytes: number }>();
  private readonly downCredit: { messages: number; bytes: number } | null;
  private openTexts = new Map<string, { channel: string; contentType: string; parts: string[] }>();
  private textQueue: TextChunk[] = [];
  private textWaiters: Array<() => void> = [];

  // requests
  private calls = new Map<string, ToolPending>();
  private byEnvelope = new Map<string, { kind: string; key: string }>();
  private failing = new Map<string, () => void>();
  private lastFailed = new Map<string, ToolPending>();
  private runs = new Map<string, Pending & { kind: "start" | "end"; envelopeId: string }>();
  private toolLists: Array<Pending & { envelopeId: string }> = [];
  private pings = new Map<string, Pending & { sent: number; seq: number; envelopeId: string }>();

  constructor(options: ProtoClientOptions) {
    if (!options || !options.url) throw new TypeError("ProtoClient: options.url is required");
    if (options.token === undefined && !options.getToken) {
      throw new TypeError("ProtoClient: give options.token or options.getToken");
    }
    this.opts = options;
    this.transport = options.transport ?? "websocket";
    if (!["websocket", "sse", "stream"].includes(this.transport)) {
      throw new TypeError(`ProtoClient: unknown transport ${JSON.stringify(this.transport)}`);
    }
    if (options.duplex === true && this.transport === "stream" && !isNode()) {
      throw new TypeError("ProtoClient: duplex: true needs Node (its node:http): a browser's fetch "
        + "cannot write a request body while reading the response; leave duplex out (follow-up POSTs)");
    }
    const here = (globalThis as any).location?.href;
    const base = new URL(options.url, here);
    if (!base.pathname.endsWith("/")) base.pathname += "/";
    this.base = base;
    const f = options.fetch ?? (globalThis as any).fetch;
    if (!f) throw new TypeError("ProtoClient: no fetch in this runtime: pass options.fetch");
    this.fetchImpl = options.fetch ? options.fetch : (input, init) => f(input, init);
    const ds = options.downstream;
    this.downCredit = ds
      ? {
          messages: (typeof ds === "object" && ds.messages) || 1000,
          bytes: (typeof ds === "object" && ds.bytes) || 16 * 1024 * 1024,
        }
      : null;
  }

  // -- public state ----------------------------------------------------------------------

  get state(): ConnectionState {
    return this._state;
  }

  /** The session id, once the server named it. */
  get session(): string | undefined {
    return this._session;
  }

  /** The server's HELLO reply (its capabilities). */
  get serverHello(): ServerHello | undefined {
    return this._hello;
  }

  /** How many times the client resumed the session after a drop. */
  get reconnects(): number {
    return this._reconnects;
  }

  /** Listen to `state`, `message`, `frame` or `error`; returns a function that stops it. */
  on<K extends keyof Events>(event: K, fn: Events[K]): () => void {
    this.listeners[event].add(fn);
    return () => this.off(event, fn);
  }

  off<K extends keyof Events>(event: K, fn: Events[K]): void {
    this.listeners[event].delete(fn);
  }

  private emit<K extends keyof Events>(event: K, ...args: Parameters<Events[K]>): void {
    for (const fn of [...this.listeners[event]]) {
      try {
        (fn as (...a: unknown[]) => void)(...args);
      } catch (exc) {
        console.error(exc);
      }
    }
  }

  private setState(state: ConnectionState, detail = ""): void {
    this._state = state;
    this.emit("state", state, detail);
  }

  // -- connecting ------------------------------------------------------------------------

  /** Open the connection and complete the handshake; resolves with the server's HELLO. */
  connect(): Promise<ServerHello> {
    if (this._state !== "idle") return Promise.reject(new ProtoError("INVALID_STATE", `connect() in state ${this._state}`));
    this.setState("connecting");
    return new Promise<ServerHello>((resolve, reject) => {
      const waiter: Pending = { resolve, reject };
      waiter.timer = setTimeout(() => {
        if (this.connectWaiter !== waiter) return;
        this.connectWaiter = undefined;
        const error = this.transport === "stream" && (this.opts.duplex ?? isNode()) && !this.linkOpened
          ? new ConnectionFailed(`no response to the duplex stream within ${this.timeoutMs} ms: a proxy on `
            + "the way probably holds the request body until it ends (nginx: proxy_request_buffering off), "
            + "which a duplex stream never does; pass duplex: false to send follow-up POSTs instead",
          new ClientTimeout(`no handshake within ${this.timeoutMs} ms`))
          : new ClientTimeout(`no handshake within ${this.timeoutMs} ms`);
        this.shutdown(error);
        reject(error);
      }, this.timeoutMs);
      this.connectWaiter = waiter;
      this.openConnection().catch((error) => this.connectionFailed(error));
    });
  }

  private get timeoutMs(): number {
    return this.opts.timeoutMs ?? 10000;
  }

  private async freshToken(): Promise<string> {
    this.token = this.opts.getToken ? await this.opts.getToken() : (this.opts.token as string);
    return this.token;
  }

  /** WebSocket only: `ticket=` from POST /proto/ticket, else `token=` (an older server). */
  private async credential(token: string): Promise<[string, string]> {
    if (this.opts.ticket === false || this.ticketsUnsupported) return ["token", token];
    let resp: Response;
    try {
      resp = await this.fetchImpl(new URL("proto/ticket", this.base).href, {
        method: "POST",
        headers: { Authorization: `Bearer ${token}` },
      });
    } catch (exc) {
      throw new ConnectionFailed(`cannot reach ${this.base.href}: ${exc}`, exc);
    }
    if (resp.status === 404 || resp.status === 405) {
      await resp.body?.cancel().catch(() => undefined);
      this.ticketsUnsupported = true;
      return ["token", token];
    }
    if (resp.status !== 200) throw await refusal(resp);
    const body = await resp.json();
    return ["ticket", String(body.ticket)];
  }

  private async openConnection(): Promise<void> {
    const previous = this.lastLink;
    if (previous) await previous.settled();
    const token = await this.freshToken();
    const credential = this.transport === "websocket" ? await this.credential(token) : undefined;
    if (this._state === "closed") return;
    this.linkReady = false;
    this.linkOpened = false;
    this.helloSeq = 0;
    let link: Link | undefined = undefined;
    const current = () => link !== undefined && this.link === link;
    link = openLink(
      this.transport,
      {
        base: this.base,
        token,
        credential,
        session: this._session,
        lastSeq: this._session !== undefined ? this.lastSeq : undefined,
        fetch: this.fetchImpl,
        WebSocket: this.opts.WebSocket,
        duplex: this.opts.duplex ?? isNode(),
        hello: () => {
          const raw = this.buildHello();
          return [raw, this.helloSeq];
        },
      },
      {
        open: (session) => {
          if (!current()) return;
          this.linkOpened = true;
          if (session) this._session = session;
          if (!this.helloSeq) this.write(this.buildHello());
          this.kickWatchdog();
        },
        raw: (raw) => {
          if (current()) this.receive(raw);
        },
        closed: (info) => {
          if (current()) this.linkClosed(info);
        },
        confirmed: (last, first) => {
          if (current()) this.confirm(last, first);
        },
        activity: () => {
          if (current()) this.kickWatchdog();
        },
      },
    );
    this.link = link;
    this.lastLink = link;
    // the stream transport puts the HELLO in the request that opens it
    if (this.helloSeq) this.frameOut(this.lastHelloRaw);
  }

  private lastHelloRaw = "";
  /** The current connection's response (or upgrade) came: the server answers. */
  private linkOpened = false;

  private buildHello(): string {
    const accept = this.opts.acceptEvents?.length
      ? [...new Set([...this.opts.acceptEvents, ...NEEDED_EVENTS])]
      : [];
    const fc = this.downCredit
      ? { downstream: true, initial_credit_messages: this.downCredit.messages, initial_credit_bytes: this.downCredit.bytes }
      : { initial_credit_messages: UNLIMITED, initial_credit_bytes: UNLIMITED };
    this.seq += 1;
    this.helloSeq = this.seq;
    const raw = this.envelope(`${this.tag}-h${this.seq}`, this.seq, "HELLO", "SYSTEM", {
      proto_version: PROTO_VERSION,
      accept_major: [1],
      accept_events: accept,
      capabilities: this.opts.extensions?.length
        ? { flow_control: fc, extensions: this.opts.extensions }
        : { flow_control: fc },
    });
    this.lastHelloRaw = raw;
    this.down.clear(); // a HELLO starts downstream credit over
    return raw;
  }

  private envelope(id: string, seq: number, type: string, channel: string, payload: Record<string, any>): string {
    return JSON.stringify({
      id, session: this._session ?? "", seq: String(seq), ts: String(Date.now()), type, channel, payload,
    });
  }

  private write(raw: string, seq = this.seq): void {
    const link = this.link;
    if (!link) return;
    this.frameOut(raw);
    link.send(raw, seq);
  }

  private frameOut(raw: string): void {
    if (this.listeners.frame.size) this.emit("frame", "out", raw, JSON.parse(raw));
  }

  private connectionFailed(error: ProtoError): void {
    if (this._state === "closed") return;
    if (this.connectWaiter) {
      const waiter = this.connectWaiter;
      this.connectWaiter = undefined;
      clearTimeout(waiter.timer);
      this.shutdown(error);
      waiter.reject(error);
      return;
    }
    this.linkClosed({ code: 1006, reason: error.message, error });
  }

  private linkClosed(info: CloseInfo): void {
    this.link = undefined;
    this.linkReady = false;
    clearTimeout(this.watchdog);
    clearTimeout(this.confirmTimer);
    this.confirmTimer = undefined; // (else scheduleConfirm never arms it again)
    this.confirmPing = undefined;
    if (this.closedByUser || this._state === "closed") return;
    const detail = `${info.code}${info.reason ? " " + info.reason : ""}`;
    if (this.connectWaiter) {
      // the first connection: no retries, the caller hears why
      this.connectionFailed(info.error ?? new ConnectionFailed(`cannot connect to ${this.base.href}: ${detail}`, info.reason));
      return;
    }
    let fatal: ProtoError | undefined;
    if (info.code === 4002) fatal = new ConnectionLost("SUPERSEDED", "another connection resumed this session");
    else if (info.code === 4001) fatal = new ConnectionLost("UNSUPPORTED_VERSION", "the server does not speak protocol 1");
    else if (info.error instanceof ConnectionRefused && [401, 403, 404].includes(info.error.status)) fatal = info.error;
    else if (this.opts.reconnect === false) fatal = new ConnectionLost("CLOSED", `connection closed ${detail}`);
    if (fatal) {
      this.shutdown(fatal);
      return;
    }
    const now = Date.now();
    if (this._state !== "reconnecting") {
      this.reconnectStarted = now;
      this.backoff = 0;
      this.setState("reconnecting", detail);
    }
    const limit = this.opts.reconnectTimeoutMs ?? this._hello?.capabilities.replay_window?.time_ms ?? 60000;
    if (now - this.reconnectStarted > limit) {
      this.shutdown(info.error ?? new ConnectionLost("UNREACHABLE", `could not resume within ${limit} ms (${detail})`));
      return;
    }
    const delay = this.backoff;
    this.backoff = Math.min(BACKOFF_MAX_MS, this.backoff ? this.backoff * 2 : BACKOFF_FIRST_MS);
    this.reconnectTimer = setTimeout(() => {
      this.openConnection().catch((error) => this.connectionFailed(error));
    }, delay);
  }

  /** The server sends a PING every heartbeat interval: silence much longer than that
   * means a connection that died without a FIN (a sleeping laptop, a lost route). */
  private kickWatchdog(): void {
    clearTimeout(this.watchdog);
    const interval = this._hello?.capabilities.heartbeat_interval_ms;
    if (!interval) return;
    const link = this.link;
    this.watchdog = setTimeout(() => {
      if (link && this.link === link) link.close(4000, "no heartbeat from the server");
      if (link === this.link) this.linkClosed({ code: 4000, reason: "no heartbeat from the server" });
    }, 2 * interval + 5000);
  }

  /** Cut the connection abruptly, as a network failure would; the client resumes. */
  dropConnection(): void {
    const link = this.link;
    if (!link) return;
    this.link = undefined;
    link.close(1006, "dropped");
    this.linkClosed({ code: 1006, reason: "dropped by the application" });
  }

  /** Close the session: pending requests reject with ConnectionLost("CLOSED"). */
  async close(): Promise<void> {
    if (this._state === "closed") return;
    this.closedByUser = true;
    const link = this.link;
    this.shutdown(new ConnectionLost("CLOSED", "the client was closed"));
    link?.close(1000, "bye");
  }

  private shutdown(error: ProtoError): void {
    this.fatal = error;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.ackTimer);
    clearTimeout(this.watchdog);
    clearTimeout(this.confirmTimer);
    this.confirmTimer = undefined;
    const link = this.link;
    this.link = undefined;
    if (link && !this.closedByUser) link.close(1000, "bye");
    if (this.connectWaiter) {
      const waiter = this.connectWaiter;
      this.connectWaiter = undefined;
      clearTimeout(waiter.timer);
      waiter.reject(error);
    }
    for (const call of this.calls.values()) {
      clearTimeout(call.timer);
      call.reject(error);
    }
    this.calls.clear();
    for (const run of this.runs.values()) run.reject(error);
    this.runs.clear();
    for (const list of this.toolLists) list.reject(error);
    this.toolLists = [];
    for (const ping of this.pings.values()) ping.reject(error);
    this.pings.clear();
    this.outbox = [];
    this.setState("closed", error.message);
    for (const wake of this.textWaiters.splice(0)) wake();
  }

  // -- sending ---------------------------------------------------------------------------

  /**
   * Send any message; returns its envelope id. Messages that need credit wait (in order)
   * until their channel has some; nothing is sent while the connection is down.
   */
  send(type: string, channel: Channel | string, payload: Record<string, any> = {}): string {
    if (this.fatal) throw this.fatal;
    this.counter += 1;
    const id = `${this.tag}-${this.counter}`;
    const item = { id, type, channel, payload };
    const max = this._hello?.capabilities.max_message_size;
    if (max && byteLength(JSON.stringify(item)) + 120 > max) {
      throw new ProtoError("MESSAGE_TOO_LARGE", `the message is larger than the server's max_message_size (${max} bytes)`);
    }
    this.outbox.push(item);
    this.flush();
    return id;
  }

  private flush(): void {
    if (!this.linkReady || !this.link) return;
    let index = 0;
    while (index < this.outbox.length) {
      const item = this.outbox[index];
      const control = CONTROL.has(item.type);
      if (!control) {
        // data messages keep their order: the first one that cannot go holds the rest
        if (this.paused.has(item.channel) || !this.canSpend(item)) {
          index += 1;
          while (index < this.outbox.length && !CONTROL.has(this.outbox[index].type)) index += 1;
          continue;
        }
      }
      this.outbox.splice(index, 1);
      this.transmit(item, !control);
    }
    this.scheduleConfirm();
  }

  private estimate(item: Outgoing): number {
    // the envelope as it will be written, with room for a longer seq and timestamp
    return byteLength(this.envelope(item.id, this.seq + 1, item.type, item.channel, item.payload)) + 8;
  }

  private account(channel: string): { messages: number; bytes: number } | null {
    if (!this.upCredit) return null;
    let acct = this.upCredit.get(channel);
    if (!acct) {
      acct = { ...this.upInitial };
      this.upCredit.set(channel, acct);
    }
    return acct;
  }

  private canSpend(item: Outgoing): boolean {
    const acct = this.account(item.channel);
    return !acct || (acct.messages >= 1 && acct.bytes >= this.estimate(item));
  }

  private transmit(item: Outgoing, spend: boolean): void {
    // a resend keeps its seq, unless the server would no longer tell it from one it has
    // seen (it remembers the 1024 seqs below its highest one by one)
    const again = item.resendSeq !== undefined && item.resendSeq > this.seq - SEEN_WINDOW;
    const seq = again ? item.resendSeq! : (this.seq += 1);
    const raw = this.envelope(item.id, seq, item.type, item.channel, item.payload);
    const bytes = byteLength(raw);
    const acct = spend ? this.account(item.channel) : null;
    if (acct) {
      acct.messages -= 1;
      acct.bytes -= bytes;
    }
    const confirming = item.type === "PING" && String(item.payload.nonce).startsWith("confirm-");
    if (!NOT_RESENT.has(item.type) && !confirming) {
      this.unconfirmed.push({ ...item, seq, bytes, spent: !!acct, resendSeq: again ? seq : undefined });
    }
    this.write(raw, seq);
  }

  /** The server has seen the upstream messages `first`..`last`. (A POST confirms only
   * what it carried: messages of a dropped connection before it are not confirmed.) */
  private confirm(last: number, first = 0): void {
    if (first <= (this.unconfirmed[0]?.seq ?? 0)) {
      let n = 0;
      while (n < this.unconfirmed.length && this.unconfirmed[n].seq <= last) n += 1;
      if (n) this.unconfirmed.splice(0, n);
      return;
    }
    this.unconfirmed = this.unconfirmed.filter((m) => m.seq < first || m.seq > last);
  }

  /** Over WebSocket and a duplex stream nothing confirms a message by itself: a PING
   * does (its PONG means everything before it was read), sent when the client falls idle. */
  private scheduleConfirm(): void {
    if (this.link?.confirmsByPost || this.confirmPing || !this.unconfirmed.length) return;
    const ping = () => {
      this.confirmTimer = undefined;
      if (!this.linkReady || this.confirmPing || !this.unconfirmed.length) return;
      const nonce = `confirm-${this.tag}-${this.seq + 1}`;
      this.confirmPing = { nonce, seq: this.seq + 1 };
      this.transmit({ id: `${this.tag}-p${this.seq + 1}`, type: "PING", channel: "SYSTEM", payload: { nonce } }, false);
    };
    if (this.unconfirmed.length >= 256) ping();
    else if (this.confirmTimer === undefined) this.confirmTimer = setTimeout(ping, IDLE_MS);
  }

  /** Send a text: MESSAGE_START, one PART per chunk, MESSAGE_END. Returns its message_id. */
  sendText(text: string | Iterable<string>, options: { contentType?: string; messageId?: string } = {}): string {
    const messageId = options.messageId ?? `${this.tag}-m${++this.counter}`;
    const parts = typeof text === "string" ? [text] : [...text];
    this.send("MESSAGE_START", "USER", { message_id: messageId, content_type: options.contentType ?? "text/plain" });
    for (const content of parts) this.send("MESSAGE_PART", "USER", { message_id: messageId, content });
    this.send("MESSAGE_END", "USER", { message_id: messageId });
    return messageId;
  }

  // -- receiving -------------------------------------------------------------------------

  private receive(raw: string): void {
    let msg: Envelope;
    try {
      msg = JSON.parse(raw);
    } catch {
      return;
    }
    if (msg.seq === undefined) {
      // an event an extension made up (an AG-UI run's closing END): no seq of its own, so
      // nothing to acknowledge; its listener tells a copy resent after a resume
      this.emit("message", msg);
      return;
    }
    const seq = Number(msg.seq);
    if (!(seq > this.lastSeq)) return; // replayed after a resume: already delivered
    this.lastSeq = seq;
    if (this.listeners.frame.size) this.emit("frame", "in", raw, msg);
    const p = msg.payload || {};
    if (this.failing.size) this.flushFailing(msg.type === "ERROR" ? p.related_id : undefined);
    if (!CONTROL.has(msg.type)) this.spendDown(msg.channel, byteLength(raw));
    if (!HEARTBEAT.has(msg.type)) this.scheduleAck();
    switch (msg.type) {
      case "HELLO":
        this.onHello(p as ServerHello);
        break;
      case "PING":
        this.send("PONG", "SYSTEM", { nonce: p.nonce });
        break;
      case "PONG":
        this.onPong(String(p.nonce));
        break;
      case "FLOW_UPDATE": {
        const acct = this.account(p.channel);
        if (acct) {
          acct.messages += Number(p.add_messages) || 0;
          acct.bytes += Number(p.add_bytes) || 0;
        }
        this.requeueRefused();
        this.flush();
        break;
      }
      case "PAUSE_CHANNEL":
        this.paused.add(p.channel);
        break;
      case "RESUME_CHANNEL":
        this.paused.delete(p.channel);
        this.requeueRefused();
        this.flush();
        break;
      case "ERROR":
        this.onError(p);
        break;
      case "MESSAGE_START":
      case "MESSAGE_PART":
      case "MESSAGE_END":
        this.onText(msg);
        break;
      case "TOOL_UPDATE": {
        const call = this.calls.get(p.call_id);
        if (call?.onProgress) {
          try {
            call.onProgress(typeof p.progress === "number" ? p.progress : undefined, p.status, p.partial);
          } catch (exc) {
            console.error(exc);
          }
        }
        break;
      }
      case "TOOL_DONE":
        this.onToolDone(p);
        break;
      case "TOOL_LIST": {
        const waiter = this.toolLists.shift();
        if (waiter) {
          clearTimeout(waiter.timer);
          this.byEnvelope.delete(waiter.envelopeId);
          waiter.resolve(p.tools ?? []);
        }
        break;
      }
      case "RUN_STARTED":
      case "RUN_FINISHED":
        this.onRun(msg.type, p);
        break;
      default:
        break;
    }
    this.emit("message", msg);
  }

  private onHello(p: ServerHello): void {
    const first = !this._hello;
    this._hello = p;
    this._session = p.session;
    const fc = p.capabilities?.flow_control;
    if (first) {
      if (fc && fc.enabled !== false) {
        this.upInitial = { messages: fc.initial_credit_messages, bytes: fc.initial_credit_bytes };
        this.upCredit = new Map();
      } else {
        this.upCredit = null;
      }
    }
    // What the server surely saw before this HELLO is confirmed; the rest (sent on the
    // connection that dropped, after its last_client_seq) goes again, first, under its
    // own seq: a copy that still arrives is then dropped as a retransmission. A message
    // that was itself a resend has a seq below the HELLO before it, which last_client_seq
    // may cover without it having arrived: it goes again too. Refused ones (their seq
    // counts as seen) get new seqs.
    const seen = Number(p.last_client_seq) || 0;
    const lost = this.unconfirmed.filter(
      (m) => (m.seq > seen || m.resendSeq !== undefined) && m.seq < this.helloSeq,
    );
    this.unconfirmed = this.unconfirmed.filter((m) => m.seq >= this.helloSeq);
    const resend: Outgoing[] = [];
    for (const m of lost) {
      this.refund(m);
      resend.push({ id: m.id, type: m.type, channel: m.channel, payload: m.payload, resendSeq: m.seq });
    }
    this.outbox.unshift(...this.refused.map((m) => ({ id: m.id, type: m.type, channel: m.channel, payload: m.payload })), ...resend);
    this.refused = [];
    this.confirmPing = undefined;
    this.linkReady = true;
    if (first) {
      this.setState("ready", p.session);
    } else {
      this._reconnects += 1;
      this.setState("ready", `${p.session} resumed`);
    }
    this.kickWatchdog();
    if (this.connectWaiter) {
      const waiter = this.connectWaiter;
      this.connectWaiter = undefined;
      clearTimeout(waiter.timer);
      waiter.resolve(p);
    }
    this.flush();
  }

  private refund(m: Sent): void {
    if (!m.spent) return;
    const acct = this.account(m.channel);
    if (acct) {
      acct.messages += 1;
      acct.bytes += m.bytes;
    }
    m.spent = false;
  }

  private requeueRefused(): void {
    if (!this.refused.length) return;
    const again = this.refused.filter((m) => !this.paused.has(m.channel));
    this.refused = this.refused.filter((m) => this.paused.has(m.channel));
    this.outbox.unshift(...again.map((m) => ({ id: m.id, type: m.type, channel: m.channel, payload: m.payload })));
  }

  private onPong(nonce: string): void {
    if (this.confirmPing && this.confirmPing.nonce === nonce) {
      this.confirm(this.confirmPing.seq);
      this.confirmPing = undefined;
      this.scheduleConfirm();
      return;
    }
    const ping = this.pings.get(nonce);
    if (ping) {
      this.pings.delete(nonce);
      clearTimeout(ping.timer);
      this.byEnvelope.delete(ping.envelopeId);
      this.confirm(ping.seq);
      ping.resolve(Date.now() - ping.sent);
    }
  }

  private onError(p: Record<string, any>): void {
    const related: string | undefined = p.related_id;
    const code = String(p.code);
    const message = String(p.message ?? "");
    if (related !== undefined) {
      const failing = this.failing.get(related);
      if (failing) {
        // the ERROR that follows a TOOL_DONE ERROR: its detail goes on the ToolError
        this.failing.delete(related);
        const owner = this.byEnvelope.get(related);
        this.byEnvelope.delete(related);
        if (owner && owner.kind === "call") {
          const call = this.lastFailed.get(related);
          if (call) {
            this.lastFailed.delete(related);
            call.reject(new ToolError(call.callId, code, message, p.detail));
            return;
          }
        }
        failing();
        return;
      }
      if (code === "CHANNEL_PAUSED" || code === "INSUFFICIENT_CREDITS") {
        // refused unread: sent again after RESUME_CHANNEL / the next FLOW_UPDATE
        const at = this.unconfirmed.findIndex((m) => m.id === related);
        if (at >= 0) {
          const [m] = this.unconfirmed.splice(at, 1);
          this.refund(m);
          this.refused.push(m);
          if (code === "CHANNEL_PAUSED") this.paused.add(m.channel);
          return;
        }
      }
      const owner = this.byEnvelope.get(related);
      if (owner) {
        this.byEnvelope.delete(related);
        this.failRequest(owner, code, message, p.detail, related);
        return;
      }
    }
    this.emit("error", new ServerError(code, message, p.detail, related));
  }

  private failRequest(owner: { kind: string; key: string }, code: string, message: string, detail: unknown, related: string): void {
    if (owner.kind === "call") {
      const call = this.calls.get(owner.key);
      if (call) {
        this.calls.delete(owner.key);
        clearTimeout(call.timer);
        call.reject(new ToolError(call.callId, code, message, detail));
      }
    } else if (owner.kind === "run") {
      const run = this.runs.get(owner.key);
      if (run) {
        this.runs.delete(owner.key);
        clearTimeout(run.timer);
        run.reject(new ServerError(code, message, detail, related));
      }
    } else if (owner.kind === "tools") {
      const at = this.toolLists.findIndex((w) => w.envelopeId === related);
      if (at >= 0) {
        const [w] = this.toolLists.splice(at, 1);
        clearTimeout(w.timer);
        w.reject(new ServerError(code, message, detail, related));
      }
    } else if (owner.kind === "ping") {
      const ping = this.pings.get(owner.key);
      if (ping) {
        this.pings.delete(owner.key);
        clearTimeout(ping.timer);
        ping.reject(new ServerError(code, message, detail, related));
      }
    }
  }

  private onText(msg: Envelope): void {
    const p = msg.payload;
    const id = String(p.message_id);
    let chunk: TextChunk;
    if (msg.type === "MESSAGE_START") {
      const contentType = String(p.content_type ?? "text/plain");
      this.openTexts.set(id, { channel: msg.channel, contentType, parts: [] });
      chunk = { kind: "start", messageId: id, channel: msg.channel, contentType, content: "" };
    } else {
      let open = this.openTexts.get(id);
      if (!open) {
        open = { channel: msg.channel, contentType: "text/plain", parts: [] };
        this.openTexts.set(id, open);
      }
      if (msg.type === "MESSAGE_PART") {
        const content = String(p.content ?? "");
        open.parts.push(content);
        chunk = { kind: "part", messageId: id, channel: open.channel, contentType: open.contentType, content };
      } else {
        this.openTexts.delete(id);
        chunk = {
          kind: "end", messageId: id, channel: open.channel, contentType: open.contentType, content: "",
          text: open.parts.join(""),
        };
      }
    }
    this.textQueue.push(chunk);
    for (const wake of this.textWaiters.splice(0)) wake();
  }

  private spendDown(channel: string, nbytes: number): void {
    const credit = this.downCredit;
    if (!credit) return;
    let acct = this.down.get(channel);
    if (!acct) {
      acct = { ...credit };
      this.down.set(channel, acct);
    }
    acct.messages -= 1;
    acct.bytes -= nbytes;
    if (acct.messages <= credit.messages / 2 || acct.bytes <= credit.bytes / 2) {
      this.send("FLOW_UPDATE", "SYSTEM", {
        channel, add_messages: credit.messages - acct.messages, add_bytes: credit.bytes - acct.bytes,
      });
      acct.messages = credit.messages;
      acct.bytes = credit.bytes;
    }
  }

  /** ACK after every 32 messages and whenever the downstream falls idle (the heartbeat
   * itself is acknowledged only along with other messages). */
  private scheduleAck(): void {
    this.sinceAck += 1;
    const ack = () => {
      this.ackTimer = undefined;
      if (this.linkReady && this.lastSeq > this.ackedSeq) {
        this.ackedSeq = this.lastSeq;
        this.sinceAck = 0;
        this.send("ACK", "SYSTEM", { seq: String(this.lastSeq) });
      }
    };
    if (this.sinceAck >= ACK_EVERY) {
      clearTimeout(this.ackTimer);
      ack();
    } else if (this.ackTimer === undefined) {
      this.ackTimer = setTimeout(ack, IDLE_MS);
    }
  }

  // -- texts -----------------------------------------------------------------------------

  /**
   * Every text the server streams (any channel), chunk by chunk as its messages arrive:
   * `start`, each `part`, `end` (with the whole `text`). Texts are buffered from the
   * moment the client connects; one reader at a time. Ends when the client closes.
   */
  async *texts(): AsyncGenerator<TextChunk, void, undefined> {
    for (;;) {
      const chunk = this.textQueue.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this._state === "closed") return;
      await new Promise<void>((wake) => this.textWaiters.push(wake));
    }
  }

  /** The next whole text (its chunks are consumed from {@link texts}' buffer). */
  async nextText(options: { timeoutMs?: number } = {}): Promise<Text> {
    const deadline = Date.now() + (options.timeoutMs ?? this.timeoutMs);
    for (;;) {
      const at = this.textQueue.findIndex((c) => c.kind === "end");
      if (at >= 0) {
        const end = this.textQueue[at];
        this.textQueue = this.textQueue.filter((c, i) => i > at || c.messageId !== end.messageId);
        return { messageId: end.messageId, channel: end.channel, contentType: end.contentType, text: end.text ?? "" };
      }
      if (this._state === "closed") throw this.fatal ?? new ConnectionLost("CLOSED", "closed");
      const left = deadline - Date.now();
      if (left <= 0) throw new ClientTimeout("no text arrived in time");
      await new Promise<void>((wake) => {
        const timer = setTimeout(wake, left);
        this.textWaiters.push(() => {
          clearTimeout(timer);
          wake();
        });
      });
    }
  }

  // -- tools -----------------------------------------------------------------------------

  /** Call a tool; resolves with its result, rejects with ToolError / ToolCancelled. */
  callTool<R = any>(name: string, params: Record<string, unknown> = {}, options: CallToolOptions = {}): Promise<R> {
    const callId = options.callId ?? `${this.tag}-call-${++this.counter}`;
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(new ToolCancelled(callId, "aborted before it was sent"));
    return new Promise<R>((resolve, reject) => {
      const payload: Record<string, unknown> = { call_id: callId, tool: name, params };
      if (options.runId) payload.run_id = options.runId;
      let envelopeId: string;
      try {
        envelopeId = this.send("TOOL_CALL", "USER", payload);
      } catch (exc) {
        reject(exc);
        return;
      }
      const onAbort = () => {
        if (this.calls.has(callId) && !this.fatal) this.send("TOOL_CANCEL", "USER", { call_id: callId });
      };
      const cleanup = () => signal?.removeEventListener("abort", onAbort);
      const call: ToolPending = {
        callId,
        envelopeId,
        onProgress: options.onProgress,
        resolve: (v) => {
          cleanup();
          resolve(v);
        },
        reject: (e) => {
          cleanup();
          reject(e);
        },
      };
      if (options.timeoutMs) {
        call.timer = setTimeout(() => {
          if (!this.calls.delete(callId)) return;
          this.byEnvelope.delete(envelopeId);
          if (!this.fatal) this.send("TOOL_CANCEL", "USER", { call_id: callId });
          call.reject(new ClientTimeout(`${name} did not finish within ${options.timeoutMs} ms`));
        }, options.timeoutMs);
      }
      this.calls.set(callId, call);
      this.byEnvelope.set(envelopeId, { kind: "call", key: callId });
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  private onToolDone(p: Record<string, any>): void {
    const call = this.calls.get(p.call_id);
    if (!call) return;
    this.calls.delete(p.call_id);
    clearTimeout(call.timer);
    if (p.status !== "OK" && p.status !== "CANCELLED") this.lastFailed.set(call.envelopeId, call);
    else this.byEnvelope.delete(call.envelopeId);
    if (p.status === "OK") {
      call.resolve(p.result);
    } else if (p.status === "CANCELLED") {
      call.reject(new ToolCancelled(call.callId));
    } else {
      // The ERROR that follows (related_id: the TOOL_CALL) carries the detail (schema
      // errors): reject when it arrives, or at the next other message.
      const error = p.error ?? {};
      this.failing.set(call.envelopeId, () => {
        this.lastFailed.delete(call.envelopeId);
        this.byEnvelope.delete(call.envelopeId);
        call.reject(new ToolError(call.callId, error.code ?? "TOOL_EXECUTION_ERROR", error.message ?? "", error.detail));
      });
    }
  }

  private flushFailing(except?: string): void {
    for (const [id, reject] of [...this.failing]) {
      if (id === except) continue;
      this.failing.delete(id);
      reject();
    }
  }

  /** The server's tools: name, description, inputSchema, outputSchema. */
  listTools(): Promise<ToolInfo[]> {
    return new Promise((resolve, reject) => {
      const envelopeId = this.send("TOOL_LIST", "SYSTEM", {});
      const waiter = { resolve, reject, envelopeId } as Pending & { envelopeId: string };
      waiter.timer = setTimeout(() => {
        const at = this.toolLists.indexOf(waiter);
        if (at >= 0) this.toolLists.splice(at, 1);
        reject(new ClientTimeout("no TOOL_LIST reply in time"));
      }, this.timeoutMs);
      this.toolLists.push(waiter);
      this.byEnvelope.set(envelopeId, { kind: "tools", key: envelopeId });
    });
  }

  /** Round trip of a PING, in ms. */
  ping(): Promise<number> {
    return new Promise((resolve, reject) => {
      const nonce = `${this.tag}-ping-${++this.counter}`;
      const envelopeId = this.send("PING", "SYSTEM", { nonce });
      const waiter = { resolve, reject, sent: Date.now(), seq: this.seq, envelopeId } as Pending & {
        sent: number; seq: number; envelopeId: string;
      };
      waiter.timer = setTimeout(() => {
        this.pings.delete(nonce);
        reject(new ClientTimeout("no PONG in time"));
      }, this.timeoutMs);
      this.pings.set(nonce, waiter);
      this.byEnvelope.set(envelopeId, { kind: "ping", key: nonce });
    });
  }

  // -- runs ------------------------------------------------------------------------------

  /** Start a run (RUN_STARTED); resolves with its run_id once the server answered. */
  startRun(options: { runId?: string; threadId?: string; metadata?: Record<string, unknown> } = {}): Promise<string> {
    const runId = options.runId ?? `${this.tag}-run-${++this.counter}`;
    const payload: Record<string, unknown> = { run_id: runId };
    if (options.threadId !== undefined) payload.thread_id = options.threadId;
    if (options.metadata !== undefined) payload.metadata = options.metadata;
    return this.runRequest("start", runId, "RUN_STARTED", payload).then(() => runId);
  }

  /** Finish a run (RUN_FINISHED); resolves with the server's RUN_FINISHED payload. */
  finishRun(runId: string, summary?: unknown): Promise<RunResult> {
    const payload: Record<string, unknown> = { run_id: runId };
    if (summary !== undefined) payload.summary = summary;
    return this.runRequest("end", runId, "RUN_FINISHED", payload);
  }

  /** Cancel a run and its tool calls (RUN_CANCEL); resolves with status "cancelled". */
  cancelRun(runId: string): Promise<RunResult> {
    return this.runRequest("end", runId, "RUN_CANCEL", { run_id: runId });
  }

  private runRequest(kind: "start" | "end", runId: string, type: string, payload: Record<string, unknown>): Promise<any> {
    return new Promise((resolve, reject) => {
      const key = `${kind}:${runId}`;
      if (this.runs.has(key)) {
        reject(new ProtoError("INVALID_STATE", `a ${type} for ${runId} is already waiting`));
        return;
      }
      const envelopeId = this.send(type, "USER", payload);
      const waiter = { resolve, reject, kind, envelopeId } as Pending & { kind: "start" | "end"; envelopeId: string };
      waiter.timer = setTimeout(() => {
        if (this.runs.get(key) !== waiter) return;
        this.runs.delete(key);
        this.byEnvelope.delete(envelopeId);
        reject(new ClientTimeout(`no answer to ${type} in time`));
      }, this.timeoutMs);
      this.runs.set(key, waiter);
      this.byEnvelope.set(envelopeId, { kind: "run", key });
    });
  }

  private onRun(type: string, p: Record<string, any>): void {
    const key = `${type === "RUN_STARTED" ? "start" : "end"}:${p.run_id}`;
    const run = this.runs.get(key);
    if (!run) return;
    this.runs.delete(key);
    clearTimeout(run.timer);
    this.byEnvelope.delete(run.envelopeId);
    if (type === "RUN_FINISHED" && p.status === "error") {
      const error = p.error ?? {};
      run.reject(new RunError(p.run_id, error.code ?? "RUN_ERROR", error.message ?? "the run failed", error.detail));
    } else {
      run.resolve(p);
    }
  }
}

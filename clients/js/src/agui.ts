// ProtoAgent: an AG-UI agent (an AbstractAgent of @ag-ui/client) for protoflask's
// /proto/agui (docs/AGUI.md), a drop-in for HttpAgent that also resumes.
//
// `run` posts the RunAgentInput and reads the SSE stream, keeping the last event id (the
// session seq). When the stream breaks before the run's terminal event, it re-attaches by
// itself (GET /proto/agui?thread=&run= with Last-Event-ID, backing off between tries) and
// drops the join prelude: an id-less START of something already open, an id-less END of
// something not open, a second RUN_STARTED. The subscriber therefore sees each event
// once, as in an uncut run. `connect` (connectAgent({runId})) re-attaches to a run from its
// start, which HttpAgent leaves unimplemented; `stop()` cancels the run server-side.
//
// Imported as "protoflask-client/agui"; it is kept out of the main entry (and the bundle
// protoflask serves) because @ag-ui/client is a peer dependency.
import { AbstractAgent, type AgentConfig, type BaseEvent, type RunAgentInput } from "@ag-ui/client";
import { Observable, type Subscriber } from "rxjs";
import { ProtoClient, type Envelope, type ProtoClientOptions } from "./client.js";
import { ServerError } from "./errors.js";

export interface ProtoAgentConfig extends AgentConfig {
  /** The endpoint, as for HttpAgent: "<server>/proto/agui". */
  url: string;
  /** Sent with every request, e.g. { Authorization: `Bearer ${token}` }. */
  headers?: Record<string, string>;
  /** Re-attach attempts after a broken stream before the run fails (default 5). */
  maxRetries?: number;
  /** First pause before a re-attach, doubled after each failed attempt (ms, default 200). */
  retryDelayMs?: number;
  fetch?: typeof fetch;
}

/** An HTTP error answer of /proto/agui (its JSON body's code); a 4xx is never retried. */
export class ProtoAgentError extends Error {
  constructor(readonly status: number, readonly code: string, message: string) {
    super(message);
    this.name = "ProtoAgentError";
  }
}

const TERMINAL = new Set(["RUN_FINISHED", "RUN_ERROR"]);
const OPENS: Record<string, [string, string]> = {
  TEXT_MESSAGE_START: ["text", "messageId"],
  TOOL_CALL_START: ["tool", "toolCallId"],
};
const CLOSES: Record<string, [string, string]> = {
  TEXT_MESSAGE_END: ["text", "messageId"],
  TOOL_CALL_END: ["tool", "toolCallId"],
};

interface SseEvent {
  id: string | null;
  data: string;
}

export class ProtoAgent extends AbstractAgent {
  url: string;
  headers: Record<string, string>;
  maxRetries: number;
  retryDelayMs: number;
  /** The id of the last event received (Last-Event-ID of a re-attach). */
  lastEventId: string | null = null;
  /** How many times the current run's stream was re-attached. */
  reattached = 0;
  private fetchFn: typeof fetch;
  private controller: AbortController | null = null;
  private runId: string | null = null;

  constructor(config: ProtoAgentConfig) {
    super(config);
    this.url = config.url;
    this.headers = { ...(config.headers ?? {}) };
    this.maxRetries = config.maxRetries ?? 5;
    this.retryDelayMs = config.retryDelayMs ?? 200;
    this.fetchFn = config.fetch ?? ((input, init) => fetch(input, init));
  }

  run(input: RunAgentInput): Observable<BaseEvent> {
    return this.events(input, true);
  }

  /** connectAgent({ runId }): the run's events from its start (also after it ended). */
  protected override connect(input: RunAgentInput): Observable<BaseEvent> {
    return this.events(input, false);
  }

  /** Leave the run's stream (the run goes on server-side; connectAgent re-attaches). */
  override abortRun(): void {
    this.controller?.abort();
    super.abortRun();
  }

  /** Cancel the current run server-side: its stream ends with outcome cancelled. */
  async stop(runId: string | null = this.runId): Promise<void> {
    if (runId === null) return;
    const response = await this.fetchFn(`${this.url}/stop`, {
      method: "POST",
      headers: { ...this.headers, "Content-Type": "application/json" },
      body: JSON.stringify({ threadId: this.threadId, runId }),
    });
    if (!response.ok) throw await httpError(response);
  }

  private events(input: RunAgentInput, post: boolean): Observable<BaseEvent> {
    return new Observable<BaseEvent>((subscriber) => {
      const controller = new AbortController();
      this.controller = controller;
      this.runId = input.runId;
      this.lastEventId = null;
      this.reattached = 0;
      void this.pump(input, post, controller, subscriber);
      return () => controller.abort();
    });
  }

  private async pump(input: RunAgentInput, post: boolean, controller: AbortController,
                     subscriber: Subscriber<BaseEvent>): Promise<void> {
    const open = new Set<string>();
    let runOpen = false;
    let failures = 0;
    for (;;) {
      try {
        const response = post ? await this.post(input, controller) :
          await this.reattach(input, controller);
        post = false;  // never a second POST: that would be a second run
        if (!response.ok) throw await httpError(response);
        for await (const { id, data } of sseEvents(response, controller.signal)) {
          const event = JSON.parse(data) as BaseEvent & Record<string, unknown>;
          if (id === null && isPrelude(event, open, runOpen)) continue;
          track(event, open);
          if (event.type === "RUN_STARTED") runOpen = true;
          if (id !== null) this.lastEventId = id;
          failures = 0;
          subscriber.next(event);
          if (TERMINAL.has(event.type)) {
            subscriber.complete();
            return;
          }
        }
        throw new Error("the stream ended before the run's terminal event");
      } catch (err) {
        if (controller.signal.aborted) {
          subscriber.complete();
          return;
        }
        post = false;
        failures += 1;
        if ((err instanceof ProtoAgentError && err.status < 500) || failures > this.maxRetries) {
          subscriber.error(err);
          return;
        }
        await sleep(this.retryDelayMs * 2 ** (failures - 1), controller.signal);
        this.reattached += 1;
      }
    }
  }

  private post(input: RunAgentInput, controller: AbortController): Promise<Response> {
    return this.fetchFn(this.url, {
      method: "POST",
      headers: { ...this.headers, "Content-Type": "application/json",
                 Accept: "text/event-stream" },
      body: JSON.stringify(input),
      signal: controller.signal,
    });
  }

  private reattach(input: RunAgentInput, controller: AbortController): Promise<Response> {
    const query = `thread=${encodeURIComponent(input.threadId)}&run=${encodeURIComponent(input.runId)}`;
    const headers: Record<string, string> = { ...this.headers, Accept: "text/event-stream" };
    if (this.lastEventId !== null) headers["Last-Event-ID"] = this.lastEventId;
    return this.fetchFn(`${this.url}?${query}`, { method: "GET", headers,
                                                 signal: controller.signal });
  }
}

export interface ProtoSocketAgentConfig extends AgentConfig {
  /** A ProtoClient of its own is made from these (transport "websocket", the "agui"
   * extension); or pass `client`. */
  client?: ProtoClient;
  url?: string;
  token?: string;
  getToken?: ProtoClientOptions["getToken"];
  WebSocket?: ProtoClientOptions["WebSocket"];
}

/**
 * An AG-UI agent over protoflask's native WebSocket (docs/AGUI.md, "AG-UI events on the
 * WebSocket"): one socket carries its runs (a RunAgentInput in a native RUN_STARTED, each
 * event an AGUI_EVENT envelope) and any native traffic. The ProtoClient underneath resumes
 * a lost connection from its last seq by itself, so the run's subscriber sees each event
 * once, as in an uncut run; a closing END the server resends after a resume is dropped.
 */
export class ProtoSocketAgent extends AbstractAgent {
  readonly client: ProtoClient;
  private runId: string | null = null;
  private connecting: Promise<unknown> | null = null;

  constructor(config: ProtoSocketAgentConfig) {
    super(config);
    if (config.client) {
      this.client = config.client;
    } else {
      if (!config.url) throw new TypeError("ProtoSocketAgent: give url (and token) or client");
      this.client = new ProtoClient({ url: config.url, token: config.token, getToken: config.getToken,
                                      WebSocket: config.WebSocket, transport: "websocket",
                                      extensions: ["agui"] });
    }
  }

  run(input: RunAgentInput): Observable<BaseEvent> {
    return new Observable<BaseEvent>((subscriber) => {
      this.runId = input.runId;
      const open = new Set<string>();
      let started = false;
      let envelopeId: string | undefined;
      const off = this.client.on("message", (msg: Envelope) => {
        if (msg.type === "ERROR" && envelopeId !== undefined
            && msg.payload?.related_id === envelopeId) {
          off();
          subscriber.error(new ServerError(msg.payload.code, msg.payload.message,
                                           msg.payload.detail, envelopeId));
          return;
        }
        if (msg.type !== "AGUI_EVENT") return;
        const event = msg.payload as BaseEvent & Record<string, unknown>;
        if (!started) {
          if (event.type !== "RUN_STARTED" || event.runId !== input.runId) return;
          started = true;
        } else if (msg.seq === undefined && isPrelude(event, open, true)) {
          return;  // a made-up END resent after a resume: the subscriber has it
        }
        track(event, open);
        subscriber.next(event);
        if (TERMINAL.has(event.type)) {
          off();
          subscriber.complete();
        }
      });
      this.ready().then(() => {
        envelopeId = this.client.send("RUN_STARTED", "USER", {
          run_id: input.runId, thread_id: input.threadId, metadata: { agui: input } });
      }).catch((err) => { off(); subscriber.error(err); });
      return () => off();
    });
  }

  /** Cancel the current run server-side (a native RUN_CANCEL): it ends with outcome cancelled. */
  stop(runId: string | null = this.runId): void {
    if (runId !== null) this.client.send("RUN_CANCEL", "USER", { run_id: runId });
  }

  /** Close the socket (a run in progress goes on server-side). */
  close(): Promise<void> {
    return this.client.close();
  }

  private ready(): Promise<unknown> {
    if (this.client.state === "idle") this.connecting = this.client.connect();
    return this.connecting ?? Promise.resolve();
  }
}

/** An id-less event the client has already seen the like of: the join prelude. */
function isPrelude(event: Record<string, unknown>, open: Set<string>, runOpen: boolean): boolean {
  if (event.type === "RUN_STARTED") return runOpen;
  const opens = OPENS[event.type as string];
  if (opens) return open.has(`${opens[0]}:${String(event[opens[1]])}`);
  const closes = CLOSES[event.type as string];
  if (closes) return !open.has(`${closes[0]}:${String(event[closes[1]])}`);
  return false;
}

function track(event: Record<string, unknown>, open: Set<string>): void {
  const opens = OPENS[event.type as string];
  if (opens) open.add(`${opens[0]}:${String(event[opens[1]])}`);
  const closes = CLOSES[event.type as string];
  if (closes) open.delete(`${closes[0]}:${String(event[closes[1]])}`);
}

async function* sseEvents(response: Response, signal: AbortSignal): AsyncGenerator<SseEvent> {
  if (!response.body) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let id: string | null = null;
        const data: string[] = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("id:")) id = line.slice(3).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (data.length) yield { id, data: data.join("\n") };
      }
    }
  } finally {
    if (!signal.aborted) reader.cancel().catch(() => undefined);
  }
}

async function httpError(response: Response): Promise<ProtoAgentError> {
  let code = `HTTP_${response.status}`;
  let message = response.statusText;
  try {
    const body = await response.json();
    code = body?.error?.code ?? code;
    message = body?.error?.message ?? message;
  } catch {
    // not JSON: the status says it
  }
  return new ProtoAgentError(response.status, code, message);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

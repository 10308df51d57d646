/**
 * Typed errors. Every error the client raises is a {@link ProtoError} with the protocol's
 * error `code` (docs/PROTOCOL.md section 5), a `message` and, when the server gave one,
 * `detail`. The subclasses say where it came from.
 */

/** The codes protoflask puts on the wire, plus the client's own (`CLOSED` ... `TIMEOUT`). */
export type ErrorCode =
  | "INVALID_MESSAGE"
  | "UNSUPPORTED_TYPE"
  | "HANDSHAKE_REQUIRED"
  | "UNSUPPORTED_VERSION"
  | "MESSAGE_TOO_LARGE"
  | "TOOL_NOT_FOUND"
  | "TOOL_EXECUTION_ERROR"
  | "DUPLICATE_CALL_ID"
  | "INSUFFICIENT_CREDITS"
  | "CHANNEL_PAUSED"
  | "MISSING_RUN_ID"
  | "RUN_NOT_FOUND"
  | "MAX_RUNS_EXCEEDED"
  | "REPLAY_UNAVAILABLE"
  | "RATE_LIMITED"
  | "MISSING_TOKEN"
  | "INVALID_TOKEN"
  | "ORIGIN_NOT_ALLOWED"
  | "SESSION_NOT_FOUND"
  | "MAX_CONNECTIONS"
  | "SHUTTING_DOWN"
  | "CLUSTER_UNAVAILABLE"
  | "CANCELLED"
  | "CLOSED"
  | "SUPERSEDED"
  | "UNREACHABLE"
  | "TIMEOUT"
  // a newer server may send codes this client does not know yet
  | (string & {});

export class ProtoError extends Error {
  readonly code: ErrorCode;
  readonly detail: unknown;

  constructor(code: ErrorCode, message: string, detail?: unknown) {
    super(message ? `${code}: ${message}` : code);
    this.name = new.target.name;
    this.code = code;
    this.detail = detail;
  }
}

/** The server refused the connection with an HTTP status (401, 403, 404, 503 ...). */
export class ConnectionRefused extends ProtoError {
  readonly status: number;

  constructor(status: number, code: ErrorCode, message: string, detail?: unknown) {
    super(code, `HTTP ${status} ${message}`, detail);
    this.status = status;
  }
}

/**
 * The server could not be reached (`UNREACHABLE`), the same on every transport: no
 * server at the URL, a network failure, or something on the way (a proxy) that keeps the
 * protocol from starting. `cause` holds the underlying error or reason.
 */
export class ConnectionFailed extends ProtoError {
  override readonly cause: unknown;

  constructor(message: string, cause?: unknown) {
    super("UNREACHABLE", message);
    this.cause = cause;
  }
}

/**
 * The session is over: closed by the application (`CLOSED`), taken over by another
 * connection (`SUPERSEDED`, close code 4002), refused by version (`UNSUPPORTED_VERSION`,
 * 4001), or the server could not be reached again in time to resume (`UNREACHABLE`).
 */
export class ConnectionLost extends ProtoError {}

/** No answer in time (`TIMEOUT`). */
export class ClientTimeout extends ProtoError {
  constructor(message: string) {
    super("TIMEOUT", message);
  }
}

/** A tool call ended with `TOOL_DONE ERROR`, or the server refused it with `ERROR`. */
export class ToolError extends ProtoError {
  readonly callId: string;

  constructor(callId: string, code: ErrorCode, message: string, detail?: unknown) {
    super(code, message, detail);
    this.callId = callId;
  }
}

/** A tool call ended with `TOOL_DONE CANCELLED` (for instance after its signal aborted). */
export class ToolCancelled extends ToolError {
  constructor(callId: string, message = "the tool call was cancelled") {
    super(callId, "CANCELLED", message);
  }
}

/** An `ERROR` message answering a request that is not a tool call (runs, tool list ...). */
export class ServerError extends ProtoError {
  /** The `id` of the message the server refused, when it named one. */
  readonly relatedId: string | undefined;

  constructor(code: ErrorCode, message: string, detail?: unknown, relatedId?: string) {
    super(code, message, detail);
    this.relatedId = relatedId;
  }
}

/** A run ended with `RUN_FINISHED {status: "error"}`. */
export class RunError extends ProtoError {
  readonly runId: string;

  constructor(runId: string, code: ErrorCode, message: string, detail?: unknown) {
    super(code, message, detail);
    this.runId = runId;
  }
}

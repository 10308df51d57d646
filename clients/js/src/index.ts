/**
 * protoflask-client: a TypeScript client for protoflask (browsers and Node 20+, no
 * runtime dependencies). See README.md.
 */
export { ProtoClient, PROTO_VERSION } from "./client.js";
export type {
  CallToolOptions,
  Channel,
  ConnectionState,
  Envelope,
  ProtoClientOptions,
  RunResult,
  ServerHello,
  Text,
  TextChunk,
  ToolInfo,
} from "./client.js";
export type { TransportName, WebSocketConstructor, WebSocketLike, FetchLike } from "./transports.js";
export {
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
export type { ErrorCode } from "./errors.js";

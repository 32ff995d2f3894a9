// A retrying wrapper around the MCP TypeScript SDK's `Client.callTool`, through
// either SDK major (`mcp/sdk.ts`): v2 (`@modelcontextprotocol/client` ^2.4,
// negotiating: 2026-07-28, else the 2025-11-25 handshake) or v1
// (`@modelcontextprotocol/sdk` ^1.32, up to 2025-11-25); the `sdk` option of
// `McpConnection` picks one, else v2 if installed, else v1.
//
//   const connection = McpConnection.http(url);            // or McpConnection.stdio({ command, args })
//   const caller = new RetryingToolCaller(connection, run, { statusCheck: checkRefunds });
//   const result = await caller.callTool('issue_refund', { order_id: 'A1', amount: 500 });
//   await connection.close();
//
// For each call the wrapper derives the idempotency key once (sent only if the
// tool's input schema has the key argument), asks the policy to begin the call,
// waits the admission delay, sends, reports what happened (a success, an
// empty result, or a failure as a raw `observation`) and does what the verdict
// says. All policy is in the component; this module only observes and obeys.
//
// The connection is the wrapper's (`McpConnection`): it connects over streamable
// HTTP with the capturing fetch (`mcp/capture.ts`), or over stdio by starting
// the server, and connects again when the policy says so (a retry with
// `reconnect`) or its own pipe or transport closed. Connecting
// (`initialize`, the process start included; with v2 the `server/discover`
// probe and, for a 2025 server, the handshake after it) and `tools/list` go through the
// policy as calls of the pseudo-tools `initialize` and `tools/list`
// (read-only, idempotent, no key): retried, escalated or (replan)
// `SessionLost` as the policy decides, each (re-)connection a step of the run.
// A caller built on a bare `Client` works the same but cannot re-establish a
// lost session (`SessionLost`).
//
// The wrapper decides nothing about what a failure means (contract 0.7.0): it
// reports what it observed, raw, and the policy decides. An HTTP answer is
// `http-status(status)` with the headers and body as received; a JSON-RPC error
// is `protocol-error(code)` with its message as the body and its `data` as
// structured content (SDK v1's own ConnectionClosed / RequestTimeout share
// -32000 / -32001 with servers: only whether the answer arrived tells them
// apart); a network error is the transport error its socket code names, and
// where it came (a failed TLS handshake `tls`, a bad record after it
// `connection-reset`; ENOTFOUND / EAI_AGAIN `name-resolution`). Every observation says whether the request carried an
// `Mcp-Session-Id` (`session-id-sent`) and how far it got (`delivery`:
// `answer-started` when an answer arrived, `not-sent` when nothing left the
// host, `sent` when it was written and no answer came, else `unknown`). A lost
// session (a 404, or a 400 saying the session is unknown, to a request that
// carried one) or a server refusing the client's revision (-32022) is the
// policy's to recognise: its verdict is a retry with `reconnect`, and the
// wrapper connects again (negotiating anew) before sending it. A stdio pipe that
// closed is `stream-closed`; the wrapper starts the server again before the
// next attempt, since its own pipe is dead.
//
// An answer to v2's `server/discover` probe that is not a discovery result is
// read by the policy (`read-probe-answer`): its `failure` is the connect
// attempt's failure, reported with its status, headers and body (the capturing
// fetch fails the probe, so the SDK does not fall back); an `older-server` is
// how a 2025 server says "use initialize", and the SDK falls back: it is the
// attempt's failure only if the connect then fails. A network error or a cut
// answer to the probe is the attempt's failure.
//
// What the SDK hides: a POST answered with a non-2xx status becomes a
// `StreamableHTTPError` with the status and body text but no headers (so no
// Retry-After), and an answer stream cut before the response is not an error at
// all (the request waits for its timeout). `createCapturingFetch` wraps `fetch`
// for the transport's `fetch` option and records, for the attempt in progress
// (AsyncLocalStorage, which follows the SDK's request into its fetch), the
// status, headers and body of a failed POST, the network error of one that got
// no response, and an answer (JSON or SSE) that ended before the JSON-RPC
// response: `stream-closed`, at once (the attempt is aborted). A failure from an
// HTTP transport without it is logged once (`agent_retry.capture_missing`) and
// every decision on such a failure says so at the end of its `reason`.
//
// A tool result with `isError: true` is passed as `tool-error(none)` with its text
// content blocks (joined with "\n") as the body and its `structuredContent` as
// JSON text: the policy itself reads an upstream status, a provider's error type
// or a wait hint there. A JSON-RPC error passes its `data` the same way. The
// wrapper reads no status of its own from either.
//
// When the policy itself fails (a `PolicyTrap`: a trap, fuel or memory exhausted,
// a value outside the contract; or `InstanceUnusable` after one), the wrapper
// takes the safe fallback: no retry, and `Escalated` (reason
// `unclassified-failure`, `policyFailure` set) with a note saying that the policy
// failed and what the last attempt saw. Serve the next run from a fresh instance.
//
// The wrapper does not trust the policy for a few invariants (src/guard.ts,
// built from the configuration text the run's policy was loaded with): a
// 400/401/403/404/409/422 or a JSON-RPC -32600/-32601/-32602 is not retried as
// it was, an unkeyed write whose outcome is unknown is not resent without a
// status check, the key never changes, no wait exceeds the configuration's caps,
// no attempt exceeds its budgets, and `lastDecision` says what the verdict said.
// A verdict that breaks one is not acted on: the call ends with the same
// policy-failure escalation (a `PolicyBoundaryViolation`, "invariant <name>:
// <detail>"), its line carries `invariant`, and every later call of the run
// escalates with the same note, nothing sent. The wrapper acts on the verdict
// only; the words (`lastDecision`) are read for the log and the model, their
// texts cut to `MAX_LIFTED_TEXT_BYTES` (` … [cut: N bytes]`).
//
// Deadlines and cancellation: `callTimeoutMs` (from the start of `callTool`),
// `runTimeoutMs` (the run deadline: from the caller's construction; 30 minutes,
// `DEFAULT_RUN_TIMEOUT_MS`, unless given; `null` turns it off) and
// `callTool`'s `signal`. With a deadline, every failure and status check
// reports the time left to the nearer one (`time-left-ms`, 0 once passed), so
// the policy cuts a retry's delay to it or fails the call now
// (`deadline-too-near`); without one, none. When one passes, the wrapper stops waiting at once (the request in flight or
// the sleep is aborted; a backoff that would end past the limit is not slept),
// logs one line (outcome `call-timeout`, `run-timeout` or `cancelled`, action
// `stop`) and throws `CallTimedOut` or `CallCancelled`, which say whether an
// attempt may have been applied.
//
// Every attempt (and every call escalated before it is sent) logs one JSON
// line with these fields in this order, the same in the Rust and Python hosts:
// `event` ("agent_retry.attempt"), `ts` (seconds since the epoch), `run`,
// `policy`, `step` (the N of the `step-N` the call's key is derived from: this
// caller's count of the model's calls, the same for every attempt of a call;
// null for the pseudo-calls `initialize` and `tools/list`),
// `call` (null when the call was not admitted), `tool`, `attempt` (0 when not
// sent), `key` (the idempotency key sent, null when the tool takes none),
// `outcome`, `class`, `rule`, `action`, `delay_ms` (null unless retry),
// `hint_ms`, `escalation` (null unless escalate) and `reason`.
//
// Every attempt line says which policy decided (`policy`): the instance's
// identity (`agent-retry:policy@0.9.0 wasm 0c1b894cf1b1`, the contract version
// and the .wasm's SHA-256 prefix), or the `policyIdentity` option (a LivePolicy
// host passes `loaded.identity.toString()`: generation, wasm and config digests).
//
// A run the policy escalates during a call (or at its begin) is snapshotted
// (contract 0.9.0, `run.snapshot` with the call's arguments as compact JSON):
// `Escalated.snapshot`. `caller.resume(snapshot, answer)` resumes it under the
// caller's policy (`policy.resume-run`), makes it the caller's run, writes an
// `agent_retry.resume` line and does what `run.resumed-call()` says: `send`
// (the call's next attempt, the same key, through the same loop as every
// call), `succeed`, `replan` or `escalate`.
//
// The module re-exports the wrapper's public names from its parts:
// `mcp/capture.ts` (the capturing fetch and the watching of answer bodies),
// `mcp/connection.ts` (`McpConnection`) and `mcp/caller.ts` (`RetryingToolCaller`).
export { CallCancelled, CallStopped, CallTimedOut, ConnectionConfigError, Escalated, SessionLost, SnapshotError, type StopCause, type Stopped } from './errors.js';
export { ResumeAnswer } from './component.js';
export {
  ProbeAnswerFailed, classifyNetworkError, createCapturingFetch, deliveryOfNetworkError, jsonRpcErrorCode, type AttemptCapture, type FetchLike,
  type ProbeFailure,
} from './mcp/capture.js';
export {
  McpConnection, type McpClientInfo, type McpHttpOptions, type McpReconnectionOptions, type McpStdioOptions,
} from './mcp/connection.js';
export { SDK_PACKAGES, type McpClient, type McpClientOptions, type McpSdkName } from './mcp/sdk.js';
export {
  CAPTURE_MISSING_SUFFIX, DEFAULT_MAX_RECONNECTS_PER_RUN, DEFAULT_RUN_TIMEOUT_MS, MAX_TIMER_MS, RetryingToolCaller, defaultEmptyCheck, jsonRpcMessage, structuredText, textOf,
  type CallToolOptions, type RetryingToolCallerOptions, type Outcome, type ProgressEvent, type StatusCheck, type StatusCheckRequest, type VerdictEvent,
} from './mcp/caller.js';
export type { RetryHooks } from './hooks.js';
export { RetryMetrics } from './metrics.js';

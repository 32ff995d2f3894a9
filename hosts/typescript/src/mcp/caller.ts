// The retrying wrapper (`RetryingToolCaller`): one call of the model through the
// policy, and what only MCP has: sessions, the capture, tasks, pseudo-calls
// (`../mcp.ts`'s module comment says how it observes and obeys). Asking the
// policy, the guard, waits, stops and the events are the call core's
// (`../call-core.ts`), the same as `withPolicy`'s.
import { performance } from 'node:perf_hooks';

// Types only: the SDKs are optional, loaded at run time (`./sdk.ts`).
import type { CallToolResult, Tool } from '@modelcontextprotocol/sdk/types.js';

import type * as Wit from '../../generated/interfaces/agent-retry-policy-types.js';
import {
  CallCore, CallScope, StopNow, outcomeWords, type Answer, type Deadline, type Outcome, type RunState, type StatusCheckAnswer,
} from '../call-core.js';
import { nowMs, type ResumeAnswer, type Run } from '../component.js';
import { OsEntropy, type EntropySource } from '../entropy.js';
import type { RetryHooks } from '../hooks.js';
import type { RetryMetrics } from '../metrics.js';
import { loadOtel } from '../otel.js';
import { Telemetry, type CallTrace } from '../telemetry.js';
import { AgentRetryError, ConnectionConfigError, Escalated, SessionLost, SnapshotError } from '../errors.js';
import { RunGuard, type CallGuard, type PollOutcome } from '../guard.js';
import { MAX_BODY_BYTES, MAX_ID_BYTES, MAX_SERVER_BYTES, cutUtf8, joinedHeaders, utf8Length } from '../limits.js';
import { MAX_TIMER_MS } from '../timers.js';
import {
  adoptProbeFailure, classifyNetworkError, currentAttempt, deliveryOfNetworkError, describeError, hasFailure, watchAnswers, type AttemptCapture,
} from './capture.js';
import { McpConnection } from './connection.js';
import { loadSdk, sdkOfClient, type McpClient, type McpSdk } from './sdk.js';
import { answerInputRequests, errorCodeOf, questionsOf, taskAnswerOf, taskReportOf, type TaskAnswer } from './tasks.js';

export type { Outcome };
export { MAX_TIMER_MS };

/** The run deadline when the `runTimeoutMs` option is left out: 30 minutes
 *  (a policy that waits an hour, or 30 days, cannot hold a run past it). */
export const DEFAULT_RUN_TIMEOUT_MS = 1_800_000;

/** The new sessions a run may set up after its first (a verdict's `reconnect`,
 *  a session suspect after a cut stream or a refused connection, a stdio server
 *  started again), unless `maxReconnectsPerRun` says otherwise: the same in every host. */
export const DEFAULT_MAX_RECONNECTS_PER_RUN = 3;

/** Transport faults after which an HTTP session is suspect: the next request goes
 *  on a new one (transport state, as a pool drops a broken connection; the policy
 *  still decides whether there is a next request). */
const SUSPECT_AFTER: ReadonlySet<string> = new Set(['connection-reset', 'connection-refused', 'stream-closed']);

/** What the logged `reason` of a decision on a failure from a non-capturing HTTP transport ends with. */
export const CAPTURE_MISSING_SUFFIX = ' [no HTTP status or headers: the transport is not the wrapper\'s capturing one]';

/** What a status check is asked about: a write that may have been applied. */
export interface StatusCheckRequest {
  /** The connected client (of the connection's SDK major: `connection.sdk`). */
  client: McpClient;
  tool: string;
  arguments: Record<string, unknown>;
  idempotencyKey?: string;
  callId: number;
  /** Aborted when the call is stopped (its limit passed, or it was cancelled). */
  signal?: AbortSignal;
}

/** Async or plain, bounded by the call's deadline; what throws (or answers anything else) is `unknown`. */
export type StatusCheck = (request: StatusCheckRequest) => StatusCheckAnswer | Promise<StatusCheckAnswer>;

function isEmptyValue(value: unknown): boolean {
  if (value === undefined || value === null || value === '') return true;
  if (Array.isArray(value)) return value.length === 0;
  if (typeof value === 'object') return Object.values(value as object).every(isEmptyValue);
  return false;
}

/** What is wrong with a successful result, or undefined if it is usable: no
 *  content (or only blank text) and no structured content is empty. */
export function defaultEmptyCheck(result: CallToolResult): string | undefined {
  const blank = (result.content ?? []).every((block) => block.type === 'text' && !block.text.trim());
  return blank && isEmptyValue(result.structuredContent) ? 'the tool returned an empty result' : undefined;
}

export interface RetryingToolCallerOptions {
  /** The server's name for the circuit breakers (contract 0.8.0), the same in
   *  every worker. Default: the connection's (`McpConnection.serverName`: the
   *  URL, or `stdio:` and the command line; the policy normalises a URL);
   *  none for a bare client (then no breaker applies). */
  serverName?: string;
  /** Reads state after an ambiguous write; per tool or one for all. None: `unknown` (the policy escalates). */
  statusCheck?: StatusCheck | Record<string, StatusCheck>;
  /** The tool argument that carries the idempotency key (default `idempotency_key`).
   *  A key the call's arguments already carry there is never replaced: a
   *  non-empty string of at most 256 UTF-8 bytes is the call's key; any other
   *  value (but undefined or null, which are none) is sent as it is and the
   *  call counts as an unkeyed write. With none, one is derived. */
  keyArgument?: string;
  /** Jitter entropy passed to `record-failure` and `record-status-check` (default: the OS). */
  entropy?: EntropySource;
  /** The most one attempt may go without an answer or a progress notification,
   *  if you set it: it caps the policy's per-tool `idle-timeout-ms` (default:
   *  none of the host's, the policy's value rules; each attempt takes its
   *  `idle-timeout-ms` and `attempt-timeout-ms` from `beginCall`). */
  attemptTimeoutMs?: number;
  /** The most one `callTool` may take, from its start, retries and reconnections included (default: none). */
  callTimeoutMs?: number;
  /** The run deadline: the most all calls of this caller may take, from its
   *  construction (default `DEFAULT_RUN_TIMEOUT_MS`, 30 minutes; `null`: none).
   *  With it (or `callTimeoutMs`), every failure and status check reports the
   *  time left (`time-left-ms`), and the wrapper stops waiting at the deadline. */
  runTimeoutMs?: number | null;
  /** The server's tools, if already listed (default: `tools/list` on first use,
   *  and again on the call after each new session). */
  tools?: Tool[];
  /** The most new sessions the run may set up after its first, whatever sets
   *  them up: a verdict's `reconnect`, a session suspect after a cut stream or
   *  a refused connection over HTTP, a stdio server started again (default
   *  `DEFAULT_MAX_RECONNECTS_PER_RUN`, 3). Once spent, an attempt that needs a
   *  new session is not sent: it is reported as `transport(other)`,
   *  `not-sent`, "reconnections spent: ...", which the policy escalates. */
  maxReconnectsPerRun?: number;
  emptyCheck?: (result: CallToolResult) => string | undefined;
  clock?: () => bigint;
  sleep?: (ms: number) => Promise<void>;
  /** One JSON line per attempt (default: stderr); `null`: no lines at all (then
   *  a decision's prose is asked of the policy only when the model or a person
   *  needs it: a replan's message, an escalation, a success's note). */
  log?: ((line: string) => void) | null;
  /** Which policy makes the decisions, logged as `policy` on every attempt line.
   *  Default: the run's instance's `policyIdentity` (`agent-retry:policy@0.9.0 wasm
   *  0c1b894cf1b1`). A host serving a `LivePolicy` passes the run's `Loaded`
   *  identity: `loaded.identity.toString()` (`generation 3 (wasm …, config …)`). */
  policyIdentity?: string;
  /** Called with every verdict the wrapper acts on, before it acts (for tests
   *  and metrics; an exception it throws is ignored). */
  onVerdict?: (event: VerdictEvent) => void;
  /** Called with every progress notification of an attempt (each also starts
   *  the attempt's idle timeout again); an exception it throws is ignored. */
  onProgress?: (event: ProgressEvent) => void;
  /** Typed callbacks on the events (docs/events.md "Hooks"): observers, run
   *  before the wrapper acts; one that throws is logged once (`agent_retry.hook_failed`). */
  hooks?: RetryHooks;
  /** Counts the events (docs/events.md "Metrics"); share one across callers to sum them. */
  metrics?: RetryMetrics;
}

/** A `notifications/progress` the server sent for an attempt of a call. */
export interface ProgressEvent {
  tool: string;
  callId: number;
  attempt: number;
  /** The server's `progress`, `total` and `message`, as sent. */
  progress: number;
  total?: number;
  message?: string;
}

/** How long an attempt may wait (ms): without an answer or progress (`idleMs`), and in all (`totalMs`). */
interface AttemptTimeouts {
  idleMs: number;
  totalMs: number;
}

/** A verdict the wrapper acted on, with what it reported to get it. */
export interface VerdictEvent {
  /** The tool, or the pseudo-tool `initialize` / `tools/list`. */
  tool: string;
  callId: number;
  /** The attempt the report named. */
  attempt: number;
  /** What was reported: `success`, `empty-result`, `failure` (with the
   *  observation), `status-check`, `task` (with the task report) or
   *  `poll-failure` (a `tasks/get` that failed, with the observation). */
  reported: Outcome;
  verdict: Wit.Verdict;
  /** `rule-names()[verdict.ruleIndex]`. */
  rule: string;
}

/** `callTool`'s third argument (a string is the `actionId`, as before). */
export interface CallToolOptions {
  /** Names the call's place in the run for its idempotency key (default `step-N`). */
  actionId?: string;
  /** Stops the call at once when aborted (`CallCancelled`). */
  signal?: AbortSignal;
}

/** What an answer says to do. */
const kindOf = (answer: Answer): Wit.ActionKind => answer.verdict.action;

/** A retry's wait, the attempt it sends, and whether a new session comes first. */
function retryOf(answer: Answer): { delayMs: bigint; attempt: number; reconnect: boolean } {
  const verdict = answer.verdict;
  return { delayMs: verdict.delayMs, attempt: verdict.attempt + 1, reconnect: verdict.reconnect };
}

interface Observed {
  outcome: Outcome;
  result?: CallToolResult;
  /** The connection is lost: why. */
  lost?: string;
  /** The failure came from an HTTP transport without the capturing fetch. */
  captureMissing?: boolean;
  /** The server's task for the call, when it answered with one (or a poll of it answered). */
  task?: TaskAnswer;
}

/** A call of the model: its core, and its task while it lives. */
interface CallState {
  core: CallCore;
  /** The id of the call's task while it lives (as last reported): cancelled if the call stops. */
  liveTask?: string;
}

/** Connections (an `McpConnection` or a bare client) already warned of tools without annotations. */
const WARNED_CONNECTIONS = new WeakSet<object>();
/** The most tool names the warning lists (`count` gives them all). */
const MAX_WARNED_TOOLS = 20;

/** The most a `tasks/cancel` is waited for (ms), whatever the attempt's timeouts. */
const CANCEL_TIMEOUT_MS = 5_000;

/** A result's text content blocks, joined with "\n" (the tool error's body). */
export const textOf = (result: CallToolResult): string =>
  (result.content ?? []).flatMap((block) => (block.type === 'text' ? [block.text] : [])).join('\n');

/** The server's JSON-RPC error message, without the prefix SDK v1 adds (`MCP error -32603: `). */
export function jsonRpcMessage(error: { code: number; message: string }): string {
  const prefix = `MCP error ${error.code}: `;
  return error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
}

/** A JSON value as the contract's `structured-content`: JSON text, or none when
 *  there is nothing (undefined, null) or it cannot be written as JSON. */
export function structuredText(value: unknown): string | undefined {
  if (value === undefined || value === null) return undefined;
  try {
    return JSON.stringify(value);
  } catch {
    return undefined; // a cycle or a BigInt: not JSON
  }
}

/** The pseudo-tools: requests outside the model's calls, made through the policy as calls. */
const PSEUDO_TOOLS: ReadonlySet<string> = new Set(['initialize', 'tools/list']);

/** A resumed call's arguments (`arguments-json`, as the snapshot kept them):
 *  an object, or undefined when the snapshot kept none, or not an object. */
function argumentsOf(text: string | undefined): Record<string, unknown> | undefined {
  if (text === undefined) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  return typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
}

/** The hints of the pseudo-tools `initialize` and `tools/list`. */
const PSEUDO_HINTS: Wit.ToolHints = { readOnly: true, destructive: false, idempotent: true };

/** Calls MCP tools through one run of the policy. One caller per run, one call at a time. */
export class RetryingToolCaller {
  private tools?: Map<string, Tool>;
  /** The wrapper lists the tools itself (none were given): again after each new session. */
  private readonly listsTools: boolean;
  private readonly maxReconnectsPerRun: number;
  /** New sessions this caller set up after the first. */
  private reconnects = 0;
  private calls = 0;
  private readonly keyArgument: string;
  private readonly entropy: EntropySource;
  /** The `attemptTimeoutMs` option, if set: a cap on the policy's idle timeout. */
  private readonly attemptTimeoutCapMs?: number;
  private readonly callTimeoutMs?: number;
  private readonly runTimeoutMs?: number;
  private readonly startedAt = performance.now();
  private readonly clock: () => bigint;
  private readonly log: (line: string) => void;
  /** The events' fan-out: lines, hooks, metrics, OpenTelemetry. */
  private readonly telemetry: Telemetry;
  /** The connection, when the caller was built on one (it can be re-established). */
  readonly connection?: McpConnection;
  private readonly bare?: McpClient;
  /** The SDK major's adapter, loaded on the first call. */
  private sdk?: McpSdk;
  /** Why a bare client's session is lost (it cannot be re-established). */
  private bareLost?: string;
  private captureWarned = false;
  /** What every attempt line logs as `policy`: which policy made the decision. */
  readonly policyIdentity: string;
  /** The server's name for the circuit breakers (undefined: none applies). */
  readonly serverName?: string;
  /** The run-time guard (the invariants the wrapper enforces whatever the policy
   *  says), and the escalation of the call that broke one: every later call of the run ends with it, nothing sent. */
  private runState: RunState;
  /** The caller's run: the one it was made with, or the one `resume` resumed. */
  private current: Run;

  constructor(source: McpConnection | McpClient, run: Run, private readonly options: RetryingToolCallerOptions = {}) {
    this.current = run;
    if (source instanceof McpConnection) this.connection = source;
    else this.bare = source;
    this.keyArgument = options.keyArgument ?? 'idempotency_key';
    this.entropy = options.entropy ?? new OsEntropy();
    this.attemptTimeoutCapMs = options.attemptTimeoutMs;
    for (const [name, value] of [['attemptTimeoutMs', options.attemptTimeoutMs], ['callTimeoutMs', options.callTimeoutMs],
      ['runTimeoutMs', options.runTimeoutMs]] as const) {
      if (value !== undefined && value !== null && !(typeof value === 'number' && value >= 0 && Number.isFinite(value))) {
        throw new TypeError(`${name} must be a finite number of ms, not ${String(value)}`);
      }
    }
    const budget = options.maxReconnectsPerRun ?? DEFAULT_MAX_RECONNECTS_PER_RUN;
    if (!Number.isSafeInteger(budget) || budget < 0) {
      throw new TypeError(`maxReconnectsPerRun must be a non-negative integer, not ${typeof budget === 'string' ? JSON.stringify(budget) : String(budget)}`);
    }
    this.maxReconnectsPerRun = budget;
    this.callTimeoutMs = options.callTimeoutMs;
    this.runTimeoutMs = options.runTimeoutMs === undefined ? DEFAULT_RUN_TIMEOUT_MS : options.runTimeoutMs ?? undefined;
    this.clock = options.clock ?? nowMs;
    this.log = options.log ?? (options.log === null ? () => {} : (line) => process.stderr.write(`${line}\n`));
    this.telemetry = new Telemetry({ log: options.log === null ? null : this.log, hooks: options.hooks, metrics: options.metrics });
    const identity: unknown = options.policyIdentity ?? run.instance.policyIdentity;
    if (typeof identity !== 'string' || identity === '') {
      throw new TypeError(`policyIdentity must be a non-empty string (e.g. loaded.identity.toString()), not ${
        identity === '' ? 'an empty string' : typeof identity}`);
    }
    this.policyIdentity = identity;
    const serverName: unknown = options.serverName;
    if (serverName !== undefined && (typeof serverName !== 'string' || serverName === '' || cutUtf8(serverName, MAX_SERVER_BYTES) !== serverName)) {
      throw new TypeError(`serverName must be a non-empty string of at most ${MAX_SERVER_BYTES} UTF-8 bytes, not ${
        typeof serverName === 'string' ? (serverName === '' ? 'an empty string' : 'a longer one') : typeof serverName}`);
    }
    this.serverName = serverName ?? this.connection?.serverName;
    // The configuration the host loaded the policy with, parsed here: not the component's report of itself.
    this.runState = { guard: new RunGuard(run.configText) };
    if (options.tools) this.tools = new Map(options.tools.map((t) => [t.name, t]));
    this.listsTools = !options.tools;
  }

  /** The run the caller's calls go to: the one it was made with, or (after
   *  `resume`) the run resumed from a snapshot. */
  get run(): Run {
    return this.current;
  }

  /** An attempt's timeouts: the policy's for the call (`beginCall`), the idle
   *  one capped by the `attemptTimeoutMs` option if it was set. The SDK sets
   *  timers of them: past 2^31 - 1 ms one would fire at once. */
  private timeoutsOf(start: Wit.CallStart): AttemptTimeouts {
    const idle = Math.min(Number(start.idleTimeoutMs), this.attemptTimeoutCapMs ?? Infinity, MAX_TIMER_MS);
    return { idleMs: idle, totalMs: Math.min(Number(start.attemptTimeoutMs), MAX_TIMER_MS) };
  }

  /** The client requests go through now (the connection's current one). */
  get client(): McpClient {
    const client = this.connection ? this.connection.client : this.bare;
    if (!client) throw new AgentRetryError('the McpConnection is not connected yet: the caller connects it on its first call (or call connection.connect())');
    return client;
  }

  /** Makes one intended call, retrying as the policy says. Resolves to what the
   *  model should see: the result, or (replan) an `isError` result carrying the
   *  policy's message. Rejects with `Escalated` when the run must stop,
   *  `SessionLost` when the session is lost for good, `CallTimedOut` or
   *  `CallCancelled` when it was stopped. `actionId` (or `options.actionId`)
   *  names the call's place in the run for its idempotency key (default:
   *  `step-N`, N counting this caller's calls from 1, as the Rust host does, so
   *  all hosts derive the same key for the same run and call). */
  async callTool(name: string, args: Record<string, unknown> = {}, options?: string | CallToolOptions): Promise<CallToolResult> {
    const { actionId, signal } = typeof options === 'string' ? { actionId: options, signal: undefined } : (options ?? {});
    this.calls += 1;
    const step = this.calls;
    // OpenTelemetry, if its API is installed: imported once per process.
    if (this.telemetry.otel === undefined) this.telemetry.otel = await loadOtel();
    const scope = this.scope(signal, true);
    const state: CallState = { core: this.core(name, step, scope, 'mcp') };
    try {
      return await this.call(name, args, actionId ?? `step-${step}`, state);
    } catch (e) {
      if (e instanceof Escalated) throw this.withSnapshot(e, e.tool === name ? args : undefined);
      if (e instanceof StopNow || (scope.cause && !(e instanceof AgentRetryError))) {
        // The call stops waiting for a task that still lives: the server is told, in the background (the deadline is past).
        if (state.liveTask !== undefined) this.cancelTaskInBackground(name, state.liveTask);
        throw state.core.stopped(state.liveTask !== undefined, e instanceof StopNow ? e.ended?.tool : undefined);
      }
      throw e;
    } finally {
      scope.dispose();
      state.core.trace.end();
    }
  }

  /** Resumes an escalated run from its snapshot (`Escalated.snapshot`, taken
   *  by this host or any other) with a person's answer (contract 0.9.0), and
   *  acts on it. The run is resumed under this caller's policy (the one its
   *  run came from) and becomes this caller's run: later `callTool` calls go
   *  to it (their `step-N` keys go on past every call the run made). One
   *  `agent_retry.resume` line, then, as `run.resumedCall()` says:
   *  - `send` (`retry`): the call that stopped the run is sent again as its
   *    next attempt, the same tool, arguments and idempotency key, with the
   *    ticket's timeouts and delay, and goes on as any call (retries, status
   *    checks, escalation): resolves or rejects as `callTool` does;
   *  - `succeed` (`done`): resolves to a result with one text item, the
   *    person's result (`''` if none);
   *  - `replan` (`skip`): resolves to the `isError` result a replan gives, with
   *    the policy's message;
   *  - `escalate` (`abort`, or the account budget refused the retry): rejects
   *    with `Escalated` (with a new snapshot, unless the run was aborted: it is over).
   *  A snapshot refused (`malformed`, `tampered`, `other-contract`,
   *  `too-large`) rejects with `SnapshotError`: nothing was sent and the
   *  caller's run is unchanged. `signal` stops the resumed call as `callTool`'s does. */
  async resume(snapshot: string, answer: ResumeAnswer, options: { signal?: AbortSignal } = {}): Promise<CallToolResult> {
    if (typeof snapshot !== 'string') throw new TypeError(`a snapshot is the text Escalated.snapshot carries, not ${snapshot === null ? 'null' : typeof snapshot}`);
    const policy = this.current.policy;
    if (policy === undefined) {
      throw new AgentRetryError("this caller's run was not started by Policy.startRun: there is no policy to resume a snapshot under");
    }
    if (this.telemetry.otel === undefined) this.telemetry.otel = await loadOtel();
    // A refused snapshot throws here (SnapshotError): nothing changed, nothing is sent.
    const run = policy.resumeRun(snapshot, answer, this.clock());
    const call = run.resumedCall();
    if (call === undefined) {
      run.close();
      throw run.instance.violation('resumed-call', 'the component resumed a run but names no call');
    }
    this.current = run;
    // The resumed run's guard starts again, as a new run's (the invariants are checked from here).
    this.runState = { guard: new RunGuard(run.configText) };
    // The keys of later calls are derived from `step-N`: N goes past every call the run
    // made (pseudo-calls included), so that no later call takes an earlier call's key.
    this.calls = Math.max(this.calls, run.report().calls);
    const scope = this.scope(options.signal, true);
    const state: CallState = { core: this.core(call.tool, null, scope, PSEUDO_TOOLS.has(call.tool) ? 'none' : 'mcp') };
    state.core.resumedFrom(call, answer.kind);
    try {
      switch (call.action) {
        case 'succeed':
          return { content: [{ type: 'text', text: call.resultText ?? '' }], isError: false };
        case 'replan':
          return { content: [{ type: 'text', text: state.core.resumedReplan(call) }], isError: true };
        case 'escalate':
          throw state.core.resumedEscalation(call);
        case 'send':
          return await this.resumeSend(call, state);
      }
    } catch (e) {
      if (e instanceof Escalated) throw this.withSnapshot(e, e.tool === call.tool ? call.argumentsJson : undefined);
      if (e instanceof StopNow && e.ended) throw e.ended.error;
      if (e instanceof StopNow || (scope.cause && !(e instanceof AgentRetryError))) {
        if (state.liveTask !== undefined) this.cancelTaskInBackground(call.tool, state.liveTask);
        throw state.core.stopped(state.liveTask !== undefined, e instanceof StopNow ? e.ended?.tool : undefined);
      }
      throw e;
    } finally {
      scope.dispose();
      state.core.trace.end();
    }
  }

  /** A resumed call's next attempt (`send`): its tool, its arguments as
   *  stored, the same key (sent as every call's is: when the tool's input
   *  schema has the key argument), the ticket's timeouts and delay; then the
   *  call's loop from that attempt. A resumed `initialize` or `tools/list`
   *  (the connection escalated) connects or lists again, and resolves to an
   *  empty text result: the model's call is made again with `callTool`. */
  private async resumeSend(call: Wit.ResumedCall, state: CallState): Promise<CallToolResult> {
    const core = state.core;
    const scope = core.scope;
    const ticket = call.ticket;
    if (ticket === undefined) throw this.run.instance.violation('resumed-call', `resumed call ${call.callId} is to be sent, and has no ticket`);
    this.sdk ??= await scope.race(this.connection ? this.connection.loadSdk() : loadSdk(sdkOfClient(this.bare as McpClient)));
    if (call.tool === 'initialize' || call.tool === 'tools/list') {
      const resumed = { core, call, ticket };
      if (call.tool === 'initialize') {
        const connection = this.connection;
        if (!connection) throw new SessionLost('a resumed initialize needs a caller built on an McpConnection', call.tool);
        await this.pseudoCall('initialize', scope, call.tool, false, (signal, timeouts) => connection.connect({ signal, timeoutMs: timeouts.idleMs }), resumed);
      } else {
        await this.ensureConnected(scope, call.tool);
        await this.pseudoCall('tools/list', scope, call.tool, true,
          (signal, timeouts) => (this.sdk as McpSdk).listTools(this.client, undefined, { signal, timeout: timeouts.idleMs, maxTotalTimeout: timeouts.totalMs }), resumed);
        if (this.listsTools) this.tools = undefined; // listed in full on the next call
      }
      return { content: [{ type: 'text', text: '' }], isError: false };
    }
    const args = argumentsOf(call.argumentsJson);
    if (args === undefined) {
      // Never a write with no arguments: the person's retry cannot be made from this snapshot.
      this.run.abandonCall(call.callId, call.attempt, false, 'cancelled');
      const message = `the snapshot keeps no arguments for call ${call.callId} (${call.tool}): it cannot be sent again; nothing was sent`;
      throw new SnapshotError({ kind: 'malformed', message });
    }
    let tool: Awaited<ReturnType<typeof this.tool>>;
    try {
      tool = await this.tool(call.tool, scope);
    } catch (e) {
      // The tools could not be listed: the resumed call was never sent, and is closed so that
      // the run's snapshot is not refused for it (calls-open); an escalation's is taken again.
      try {
        this.run.abandonCall(call.callId, call.attempt, false, 'cancelled');
      } catch {
        // already closed
      }
      if (e instanceof Escalated && e.snapshotError?.kind === 'calls-open') {
        e.snapshotError = undefined;
        throw this.withSnapshot(e, undefined);
      }
      throw e;
    }
    const sendArgs: Record<string, unknown> = { ...args };
    const properties = tool?.inputSchema?.properties;
    if (call.idempotencyKey !== undefined && properties && typeof properties === 'object' && this.keyArgument in properties) {
      sendArgs[this.keyArgument] = call.idempotencyKey;
    }
    const begun = await core.resumeSend(call, ticket);
    if (begun.replan) throw this.run.instance.violation('resumed-call', 'a resumed call to send was refused as a replan');
    return this.attempts(state, sendArgs, begun.start, begun.guard);
  }

  /** `escalated` with the escalated run's snapshot (`run.snapshot`, with the
   *  stopped call's arguments: JSON text, or an object written as compact
   *  JSON). A snapshot refused (another call of the run in flight:
   *  `calls-open`) leaves `snapshot` undefined and `snapshotError` set, and
   *  writes one `agent_retry.snapshot_refused` line. None after a policy
   *  failure (the run did not escalate in the policy). */
  private withSnapshot(escalated: Escalated, args: Record<string, unknown> | string | undefined): Escalated {
    if (escalated.policyFailure !== undefined || escalated.snapshot !== undefined || escalated.snapshotError !== undefined) return escalated;
    // A person's abort is final: the run gives no snapshot, and nothing needs saying.
    if (escalated.reason === 'aborted') return escalated;
    let argumentsJson: string | undefined;
    try {
      argumentsJson = typeof args === 'string' || args === undefined ? args : JSON.stringify(args);
    } catch {
      argumentsJson = undefined; // a cycle or a BigInt: not JSON
    }
    try {
      escalated.snapshot = this.run.snapshot(argumentsJson, this.clock());
    } catch (e) {
      const refusal = e instanceof SnapshotError ? e : undefined;
      if (refusal) escalated.snapshotError = refusal;
      this.telemetry.line({
        event: 'agent_retry.snapshot_refused', ts: Date.now() / 1000, run: this.run.runId, policy: this.policyIdentity, tool: escalated.tool ?? null,
        kind: refusal?.kind ?? null, reason: cutUtf8(refusal ? refusal.message : `${(e as Error)?.name}: ${(e as Error)?.message ?? String(e)}`, MAX_BODY_BYTES),
      });
    }
    return escalated;
  }

  /** The server's tools, listed through the policy as the calls list them (the
   *  `tools/list` pseudo-call, every page: retried, or escalated, as the policy
   *  decides), connecting first if need be. Kept for the calls that follow: a
   *  tool's annotations and input schema are what its calls are made with.
   *  Rejects as `callTool` does (a stop: at the run deadline or `signal`). */
  async listTools(options: { signal?: AbortSignal } = {}): Promise<Tool[]> {
    if (this.telemetry.otel === undefined) this.telemetry.otel = await loadOtel();
    const scope = this.scope(options.signal, false);
    try {
      this.sdk ??= await scope.race(this.connection ? this.connection.loadSdk() : loadSdk(sdkOfClient(this.bare as McpClient)));
      return [...(await this.listed(scope, 'tools/list')).values()];
    } catch (e) {
      if (e instanceof Escalated) throw this.withSnapshot(e, undefined);
      if (e instanceof StopNow && e.ended) throw e.ended.error; // the pseudo-call in progress wrote its stop
      if (e instanceof StopNow || (scope.cause && !(e instanceof AgentRetryError))) throw this.core('tools/list', null, scope, 'none').stopped();
      throw e;
    } finally {
      scope.dispose();
    }
  }

  /** A call's scope: its deadline (the nearer of the call's, if `withCallLimit`, and the run's) and `signal`. */
  private scope(signal: AbortSignal | undefined, withCallLimit: boolean): CallScope {
    const now = performance.now();
    const call: Deadline | undefined = withCallLimit && this.callTimeoutMs !== undefined
      ? { at: now + this.callTimeoutMs, cause: 'call-timeout', limitMs: this.callTimeoutMs } : undefined;
    const run: Deadline | undefined = this.runTimeoutMs === undefined
      ? undefined : { at: this.startedAt + this.runTimeoutMs, cause: 'run-timeout', limitMs: this.runTimeoutMs };
    const deadline = call && run ? (call.at <= run.at ? call : run) : call ?? run;
    return new CallScope({ now: () => performance.now(), deadline, timer: true, signal, sleep: (ms) => this.options.sleep?.(ms) });
  }

  /** One call of the policy: the model's (`step`), or a pseudo-call's (events only: no span of its own). */
  private core(tool: string, step: number | null, scope: CallScope, spans: 'mcp' | 'none'): CallCore {
    return new CallCore({
      run: this.run, tool, server: this.serverName, step, policy: this.policyIdentity, trace: this.telemetry.call(tool, { run: this.run.runId, policy: this.policyIdentity, step }, spans),
      runState: this.runState, scope, entropy: this.entropy, policyNow: this.clock,
    });
  }

  private async call(name: string, args: Record<string, unknown>, action: string, state: CallState): Promise<CallToolResult> {
    const core = state.core;
    const scope = core.scope;
    scope.check();
    core.checkTripped();
    // A missing SDK is the caller's to fix: thrown as it is, not a failure for the policy.
    this.sdk ??= await scope.race(this.connection ? this.connection.loadSdk() : loadSdk(sdkOfClient(this.bare as McpClient)));
    const tool = await this.tool(name, scope);
    const sendArgs: Record<string, unknown> = { ...args };
    const properties = tool?.inputSchema?.properties;
    if (properties && typeof properties === 'object' && this.keyArgument in properties) {
      if (sendArgs[this.keyArgument] !== undefined && sendArgs[this.keyArgument] !== null) {
        // A key the application (or a proxy's client) already put in the arguments
        // (undefined or null is none) names the effect it means: sent unchanged, never
        // replaced (as in every host). One the policy cannot be told still goes as
        // it is: the call is an unkeyed write.
        const given = sendArgs[this.keyArgument];
        if (givenKeyFits(given)) core.keepKey(given);
      } else {
        sendArgs[this.keyArgument] = core.deriveKey(action);
      }
    }
    const annotations = tool?.annotations;
    const hints: Wit.ToolHints | undefined = annotations
      ? { readOnly: annotations.readOnlyHint, destructive: annotations.destructiveHint, idempotent: annotations.idempotentHint }
      : undefined;
    const begun = await core.begin(hints);
    // A circuit breaker of the server is open: nothing sent, the model told as for a replan verdict.
    if (begun.replan) return { content: [{ type: 'text', text: begun.replan.message }], isError: true };
    return this.attempts(state, sendArgs, begun.start, begun.guard);
  }

  /** A call's attempts from `core.attempt` (1 for a call begun, the resumed
   *  attempt for a call a resumed run sends again), as the verdicts say: the
   *  one loop every call of the model goes through. */
  private async attempts(state: CallState, sendArgs: Record<string, unknown>, start: Wit.CallStart, guard: CallGuard): Promise<CallToolResult> {
    const core = state.core;
    const scope = core.scope;
    const name = core.tool;
    const callId = start.callId;
    const timeouts = this.timeoutsOf(start);

    // The attempt each outcome reports: 1, then each retry plan's (since contract 0.3.0).
    for (;;) {
      await this.ensureConnected(scope, name);
      const attempt = core.attempt;
      core.sending(attempt);
      let observed = await this.attemptTool(name, sendArgs, scope, timeouts, callId, attempt, core.trace);
      core.inFlight = false;
      guard.attempted(failureOf(observed), observed.outcome.tag === 'task' ? observed.outcome.val : undefined);
      this.taskPolled(core, attempt, observed);
      let answer = this.record(core, attempt, observed, guard, true);
      // The call's task, while it lives: polled, answered and cancelled as the
      // verdicts say, by the id the last task report named (the poll plan's).
      let taskId = this.noteTask(state, observed);
      for (;;) {
        if (answer.verdict.cancelTask && taskId !== undefined) await this.cancelTask(taskId, state, scope, timeouts);
        if (kindOf(answer) === 'poll' && taskId !== undefined) {
          // A poll is neither an attempt nor a step: the tool is not called again while its task lives.
          if (answer.verdict.reconnect) this.markLost(`the policy's verdict on the poll of task ${taskId} (${answer.words}) says to reconnect`);
          await core.wait('poll', attempt, answer.verdict.delayMs, answer.verdict.hintMs, answer.decision);
          await this.ensureConnected(scope, name);
          observed = await this.pollTask(name, taskId, scope, timeouts);
          this.taskPolled(core, attempt, observed, taskId);
          // Every poll's outcome to the guard: a status, the task's end (its result or error), or the poll's failure.
          guard.polled(pollOutcomeOf(observed));
          taskId = this.noteTask(state, observed) ?? taskId;
          answer = this.record(core, attempt, observed, guard, false);
          continue;
        }
        if (kindOf(answer) !== 'check-status') break;
        await this.ensureConnected(scope, name);
        const check = this.statusCheckOf(name);
        const request: StatusCheckRequest = { client: this.client, tool: name, arguments: sendArgs, idempotencyKey: core.key, callId, signal: scope.signal };
        const found = await core.checkStatus(check && (() => check(request)));
        // A status check reports the attempt whose effect it checked: the current one.
        answer = core.statusChecked(attempt, guard, check ? check.name || null : null, found);
      }
      switch (kindOf(answer)) {
        case 'retry': {
          const retry = retryOf(answer);
          // The policy says the session is gone (or the revision refused): a new one before the retry.
          if (retry.reconnect) this.markLost(`the policy's verdict on attempt ${attempt} (${outcomeWords(observed.outcome)}) says to reconnect`);
          core.attempt = retry.attempt; // the call's attempt now, for a stop during the wait (`abandonCall`)
          await core.wait('retry', retry.attempt, retry.delayMs, answer.verdict.hintMs, answer.decision);
          continue;
        }
        case 'replan':
          return { content: [{ type: 'text', text: core.replan(answer) }], isError: true };
        case 'succeed': {
          if (observed.result && observed.outcome.tag === 'success') return observed.result;
          const action = answer.verdict.hasNote === false ? undefined : core.words(answer).action;
          return { content: [{ type: 'text', text: (action?.tag === 'succeed' ? action.val : undefined) ?? 'done' }], isError: false };
        }
        case 'escalate':
          throw core.escalate(answer);
        case 'poll':
          // A poll of a call without a task: the policy broke its contract.
          core.noTask(answer);
      }
    }
  }

  /** Reports one outcome through the call's core (`onVerdict` told, a
   *  decision on a failure from a non-capturing transport saying so). */
  private record(core: CallCore, attempt: number, observed: Observed, guard: CallGuard, ownOutcome: boolean): Answer {
    const hook = this.options.onVerdict;
    return core.record(attempt, observed.outcome, guard, ownOutcome, {
      reasonSuffix: observed.captureMissing ? CAPTURE_MISSING_SUFFIX : undefined,
      onVerdict: hook && ((verdict) => {
        try {
          hook({ tool: core.tool, callId: core.callId as number, attempt, reported: observed.outcome, verdict, rule: this.run.instance.ruleNames()[verdict.ruleIndex] });
        } catch {
          // an observer's failure changes nothing
        }
      }),
    });
  }

  /** The tool's description, listing the server's tools on first use. */
  private async tool(name: string, scope: CallScope): Promise<Tool | undefined> {
    return (await this.listed(scope, name)).get(name);
  }

  /** The server's tools: listed (the `tools/list` pseudo-call, a page a call) unless they are known. */
  private async listed(scope: CallScope, forTool: string): Promise<Map<string, Tool>> {
    if (!this.tools) {
      await this.ensureConnected(scope, forTool);
      const tools = new Map<string, Tool>();
      let cursor: string | undefined;
      do {
        const page = await this.pseudoCall('tools/list', scope, forTool, true,
          (signal, timeouts) => (this.sdk as McpSdk).listTools(this.client, cursor, { signal, timeout: timeouts.idleMs, maxTotalTimeout: timeouts.totalMs }));
        for (const t of page.tools) tools.set(t.name, t);
        cursor = page.nextCursor;
      } while (cursor);
      this.tools = tools;
      this.warnToolsWithoutHints(tools);
    }
    return this.tools;
  }

  /** Once per connection: the tools listed without annotations, which the
   *  policy treats by `default-effect` (an unkeyed write unless configured). */
  private warnToolsWithoutHints(tools: Map<string, Tool>): void {
    const source: object | undefined = this.connection ?? this.bare;
    if (source === undefined || WARNED_CONNECTIONS.has(source)) return;
    const bare = [...tools.values()].filter((tool) => tool.annotations === undefined || tool.annotations === null).map((tool) => tool.name);
    if (bare.length === 0) return;
    WARNED_CONNECTIONS.add(source);
    this.telemetry.line({
      event: 'agent_retry.tools_without_hints', ts: Date.now() / 1000, run: this.run.runId, policy: this.policyIdentity,
      count: bare.length, tools: bare.slice(0, MAX_WARNED_TOOLS).map((name) => cutUtf8(name, MAX_ID_BYTES)),
      reason: 'these tools carry no annotations: the policy treats each as its default-effect (an unkeyed write by default, never '
        + 'retried after an unknown outcome); describe them in the configuration\'s tools or have the server annotate them. '
        + 'See docs/users.md#a-tool-without-annotations-is-an-unkeyed-write',
    });
  }

  /** Before a request: (re-)establishes a lost connection through the policy
   *  (the `initialize` pseudo-call). A bare client's lost session cannot be. */
  private async ensureConnected(scope: CallScope, tool: string): Promise<void> {
    const connection = this.connection;
    if (!connection) {
      if (this.bareLost !== undefined) {
        throw new SessionLost(`the MCP session is lost (${this.bareLost}) and a caller built on a bare Client cannot re-establish it: `
          + 'build the caller on an McpConnection (McpConnection.http(url) or McpConnection.stdio({ command, args }))', tool);
      }
      return;
    }
    const lost = connection.lost;
    if (lost === undefined) return;
    const again = connection.connections > 0;
    // Not connected again: the attempt that needs it is reported as the budget's end (`spent`).
    if (this.reconnectsSpent()) return;
    await this.pseudoCall('initialize', scope, tool, false, async (signal, timeouts) => {
      try {
        await connection.connect({ signal, timeoutMs: timeouts.idleMs });
      } catch (e) {
        // Say in the failure's text (and so in an escalation's note) that this was a re-connection.
        if (again) throw new ReconnectFailed(lost, e);
        throw e;
      }
    });
    if (again) {
      this.reconnects += 1;
      // A restarted server may describe its tools anew: listed again on the next call.
      if (this.listsTools) this.tools = undefined;
    }
  }

  /** Whether the next request needs a new session after the first, and none is left in the budget. */
  private reconnectsSpent(): boolean {
    const connection = this.connection;
    if (!connection || connection.lost === undefined || connection.connections === 0) return false;
    return this.reconnects >= this.maxReconnectsPerRun;
  }

  /** An attempt not sent because the reconnections are spent: `transport(other)`, which the policy escalates. */
  private spent(): Observed {
    const body = `reconnections spent: ${this.reconnects} new sessions in this run (maxReconnectsPerRun ${this.maxReconnectsPerRun})`;
    const observation: Wit.Observation = {
      kind: { tag: 'transport', val: 'other' }, headers: '', body, structuredContent: undefined, sessionIdSent: false, delivery: 'not-sent',
    };
    return { outcome: { tag: 'failure', val: observation } };
  }

  /** A request outside the model's call (`initialize`, `tools/list`) as a call
   *  of the policy: begun (a step), observed, retried or escalated as decided. */
  private async pseudoCall<T>(tool: 'initialize' | 'tools/list', scope: CallScope, forTool: string, needsConnection: boolean,
    send: (signal: AbortSignal, timeouts: AttemptTimeouts) => Promise<T>, resumed?: { core: CallCore; call: Wit.ResumedCall; ticket: Wit.CallStart }): Promise<T> {
    const core = resumed?.core ?? this.core(tool, null, scope, 'none');
    try {
      return await this.pseudoAttempts(core, scope, forTool, needsConnection, send, resumed);
    } catch (e) {
      if (!(e instanceof StopNow || (scope.cause && !(e instanceof AgentRetryError)))) throw e;
      // A stop abandons the pseudo-call in the run and writes its line; the call it served stops after it.
      throw new StopNow(scope.cause ?? 'cancelled', { tool, error: core.stopped() });
    }
  }

  private async pseudoAttempts<T>(core: CallCore, scope: CallScope, forTool: string, needsConnection: boolean,
    send: (signal: AbortSignal, timeouts: AttemptTimeouts) => Promise<T>, resumed?: { call: Wit.ResumedCall; ticket: Wit.CallStart }): Promise<T> {
    const tool = core.tool;
    const begun = resumed ? await core.resumeSend(resumed.call, resumed.ticket) : await core.begin(PSEUDO_HINTS);
    if (begun.replan) throw new SessionLost(`${tool} failed (not sent) and the policy answered replan: ${begun.replan.message}`, forTool);
    const { start, guard } = begun;
    const timeouts = this.timeoutsOf(start);
    for (;;) {
      if (needsConnection) await this.ensureConnected(scope, forTool);
      const attempt = core.attempt;
      let observed: Observed;
      let value: T | undefined;
      if (needsConnection && this.reconnectsSpent()) {
        observed = this.spent();
      } else {
        core.sending(attempt);
        const exchanged = await this.exchange(scope, (signal) => send(signal, timeouts));
        core.inFlight = false;
        value = exchanged.value;
        observed = exchanged.error === undefined && !hasFailure(exchanged.capture)
          ? { outcome: { tag: 'success' } }
          : this.observeFailure(exchanged.error, exchanged.capture, exchanged.client, tool);
      }
      guard.attempted(failureOf(observed));
      let answer = this.record(core, attempt, observed, guard, true);
      // Nobody can read whether a connection "applied": unknown (the policy escalates).
      while (kindOf(answer) === 'check-status') answer = core.statusChecked(attempt, guard, null, 'unknown');
      const words = outcomeWords(observed.outcome);
      switch (kindOf(answer)) {
        case 'retry': {
          const retry = retryOf(answer);
          // `initialize` connects anew on every attempt; `tools/list` needs a new session first.
          if (retry.reconnect && needsConnection) this.markLost(`the policy's verdict on ${tool} (${words}) says to reconnect`);
          core.attempt = retry.attempt;
          await core.wait('retry', retry.attempt, retry.delayMs, answer.verdict.hintMs, answer.decision);
          continue;
        }
        case 'succeed':
          if (observed.outcome.tag === 'success') return value as T;
          throw new SessionLost(`the policy answered succeed to a failed ${tool} (${words}): no session to go on with`, forTool);
        case 'replan':
          throw new SessionLost(`${tool} failed (${words}) and the policy answered replan: ${core.replan(answer)}`, forTool);
        case 'escalate':
          throw core.escalate(answer);
        case 'poll':
          // Connecting and listing make no task: the policy broke its contract.
          core.noTask(answer);
      }
    }
  }

  /** Sends one request of an attempt with its capture, ended at once when its
   *  answer stream is cut or the call stops. */
  private async exchange<T>(scope: CallScope, send: (signal: AbortSignal) => Promise<T>, keepAnswerText = false):
    Promise<{ value?: T; error?: unknown; capture: AttemptCapture; client?: McpClient }> {
    scope.check();
    const controller = new AbortController();
    const instance = this.run.instance;
    const capture: AttemptCapture = {
      headers: [], body: '', keepAnswerText, abort: () => controller.abort(new Error('the answer stream was cut')),
      // The policy reads a probe's answer; no rule of the host's own.
      readProbeAnswer: (httpStatus, jsonRpcCode) => instance.readProbeAnswer(httpStatus, jsonRpcCode),
    };
    // A bare client's transport (a connection's is watched when it is made).
    watchAnswers((this.connection ? this.connection.client : this.bare)?.transport);
    const onStop = () => controller.abort(scope.signal.reason);
    scope.signal.addEventListener('abort', onStop, { once: true });
    let value: T | undefined;
    let error: unknown;
    try {
      value = await scope.race(currentAttempt.run(capture, () => send(controller.signal)));
    } catch (e) {
      if (e instanceof StopNow || e instanceof ConnectionConfigError) throw e;
      error = e;
    } finally {
      capture.closed = true;
      scope.signal.removeEventListener('abort', onStop);
    }
    if (error !== undefined) adoptProbeFailure(capture);
    if (error !== undefined) scope.check(); // a failure that came as the call stopped is the stop (an answer that came is kept)
    const client = this.connection ? this.connection.client : this.bare;
    return { value, error, capture, client };
  }

  /** One attempt: `tools/call` with a progress token; each progress
   *  notification starts the idle timeout again (never past the attempt's
   *  total, nor the call's or run's deadline: the scope stops it) and goes to
   *  `onProgress`. */
  private async attemptTool(name: string, args: Record<string, unknown>, scope: CallScope, timeouts: AttemptTimeouts, callId: number,
    attempt: number, trace?: CallTrace): Promise<Observed> {
    const onprogress = (note: { progress: number; total?: number; message?: string }) => {
      try {
        this.options.onProgress?.({ tool: name, callId, attempt, progress: note.progress, total: note.total, message: note.message });
      } catch {
        // an observer's failure changes nothing
      }
    };
    if (this.reconnectsSpent()) return this.spent();
    const sdk = this.sdk as McpSdk;
    // The attempt span's W3C trace context, for a traced server to continue (MCP SEP-414).
    const meta = trace?.traceContext();
    const { value, error, capture, client } = await this.exchange(scope, (signal) => sdk.callTool(this.client, name, args,
      { timeout: timeouts.idleMs, maxTotalTimeout: timeouts.totalMs, resetTimeoutOnProgress: true, onprogress, signal }, meta));
    if (error !== undefined && !hasFailure(capture) && sdk.inputUnanswered(error)) {
      const answered = capture.lastResult;
      const task = answered?.resultType === 'task' ? taskAnswerOf(answered) : undefined;
      // The SDK drops a task answer (v2: UNSUPPORTED_RESULT_TYPE); the capture kept it.
      if (task !== undefined) return this.observeTask(name, task, scope);
      if (answered?.resultType === 'input_required') {
        // Input no handler of the application answered: the server's questions, for the policy.
        const questions = questionsOf(answered.inputRequests as Record<string, unknown> | undefined);
        const observation: Wit.Observation = {
          kind: { tag: 'input-required' }, headers: '', body: questions, structuredContent: undefined,
          sessionIdSent: this.sessionIdSent(capture, client), delivery: 'answer-started',
        };
        return { outcome: { tag: 'failure', val: observation } };
      }
    }
    if (error !== undefined || hasFailure(capture)) return this.observeFailure(error, capture, client, name);
    return this.observeResult(value as CallToolResult, this.sessionIdSent(capture, client));
  }

  /** A tool's result (an attempt's, or a completed task's) as its outcome: a
   *  tool error, an empty result, or a success. */
  private observeResult(result: CallToolResult, sessionIdSent: boolean): Observed {
    if (result.isError) {
      // No upstream status from the wrapper: the policy reads the text and the
      // structured content (a status, a provider's error type, a wait in prose).
      const observation: Wit.Observation = {
        kind: { tag: 'tool-error', val: undefined }, headers: '', body: textOf(result), structuredContent: structuredText(result.structuredContent),
        sessionIdSent, delivery: 'answer-started',
      };
      return { outcome: { tag: 'failure', val: observation }, result };
    }
    const what = (this.options.emptyCheck ?? defaultEmptyCheck)(result);
    if (what !== undefined) return { outcome: { tag: 'empty-result', val: what }, result };
    return { outcome: { tag: 'success' }, result };
  }

  /** The task id an outcome reports (a task report's), and whether the call's
   *  task still lives after it (`state.liveTask`): a task that completed,
   *  failed or was cancelled does not; a failed poll says nothing of it. */
  private noteTask(state: CallState, observed: Observed): string | undefined {
    const outcome = observed.outcome;
    if (outcome.tag === 'task') {
      state.liveTask = outcome.val.status === 'cancelled' ? undefined : outcome.val.taskId;
      return outcome.val.taskId;
    }
    if (observed.task !== undefined && outcome.tag !== 'poll-failure') state.liveTask = undefined;
    return undefined;
  }

  /** What the server said of the call's task, as its outcome. The `tools/call`
   *  answer (`polled` undefined) carries no result, error or questions: a task
   *  further along than `working` there is reported `working` (`cancelled` as
   *  it is), and the first poll tells the rest, as the Rust host does. A
   *  `tasks/get` answer (`polled`: its raw result): a task that completed or
   *  failed as an attempt's outcome (its result, or its JSON-RPC error);
   *  `input_required` answered through `tasks/update` when the application
   *  has a handler for every request (`input-answered`), else
   *  `input-required` with the questions; `working` and `cancelled` as they
   *  are; an answer it cannot use (`completed` without a result, `failed`
   *  without an error, a status the extension does not define) a poll
   *  failure, once: the policy decides whether to poll again. */
  private async observeTask(tool: string, task: TaskAnswer, scope: CallScope, polled?: { raw: unknown; sessionIdSent: boolean }): Promise<Observed> {
    const report = (status: Wit.TaskStatus, message: string): Observed =>
      ({ outcome: { tag: 'task', val: taskReportOf(task, status, message, this.clock()) }, task });
    if (polled === undefined) {
      if (task.status === 'cancelled') return report('cancelled', task.statusMessage ?? '');
      if (task.status !== 'input_required' || task.inputRequests === undefined) {
        return report('working', task.status === 'working' ? task.statusMessage ?? '' : `${task.status}${task.statusMessage ? `: ${task.statusMessage}` : ''}`);
      }
    }
    switch (task.status) {
      case 'completed':
        if (task.result === undefined || polled === undefined) return this.unusableTaskAnswer('completed without a result', polled, task);
        return { ...this.observeResult(task.result as CallToolResult, polled.sessionIdSent), task };
      case 'failed': {
        if (task.error === undefined || polled === undefined) return this.unusableTaskAnswer('failed without an error', polled, task);
        const code = errorCodeOf(task.error);
        const observation: Wit.Observation = {
          kind: { tag: 'protocol-error', val: code }, headers: '', body: typeof task.error.message === 'string' ? task.error.message : '',
          structuredContent: structuredText(task.error.data), sessionIdSent: polled.sessionIdSent, delivery: 'answer-started',
        };
        return { outcome: { tag: 'failure', val: observation }, task };
      }
      case 'input_required': {
        const questions = questionsOf(task.inputRequests);
        const sdk = this.sdk as McpSdk;
        const client = this.client;
        const responses = task.inputRequests === undefined ? undefined : await scope.race(answerInputRequests(task.inputRequests,
          (method) => sdk.inputHandler(client, method), scope.signal, (client.transport as { sessionId?: string } | undefined)?.sessionId));
        if (responses === undefined) return report('input-required', questions);
        const { error, capture } = await this.exchange(scope, (signal) =>
          sdk.request(this.client, 'tasks/update', { taskId: task.taskId, inputResponses: responses }, { signal }));
        // An answer the server did not take is a failed poll: the policy decides whether to poll again.
        if (error !== undefined || hasFailure(capture)) return this.pollFailure(this.observeFailure(error, capture, this.client, tool), task);
        return report('input-answered', questions);
      }
      case 'working':
        return report('working', task.statusMessage ?? '');
      case 'cancelled':
        return report('cancelled', task.statusMessage ?? '');
      default:
        return this.unusableTaskAnswer(`a task status the extension does not define (${task.status})`, polled, task);
    }
  }

  /** A `tasks/get` answer the wrapper cannot use, as the poll failure every
   *  host reports: `protocol-error(-32603)`, the raw answer (cut to the body
   *  limit) as its body, delivery `answer-started`. */
  private unusableTaskAnswer(what: string, polled: { raw: unknown; sessionIdSent: boolean } | undefined, task?: TaskAnswer): Observed {
    const raw = typeof polled?.raw === 'string' ? polled.raw : structuredText(polled?.raw) ?? '';
    const observation: Wit.Observation = {
      kind: { tag: 'protocol-error', val: -32603 }, headers: '', body: cutUtf8(raw, MAX_BODY_BYTES), structuredContent: undefined,
      sessionIdSent: polled?.sessionIdSent ?? this.connectionSessionSent(), delivery: 'answer-started',
    };
    return { outcome: { tag: 'poll-failure', val: observation }, task };
  }

  /** One `tasks/get` of the call's task `taskId`: its answer observed as the
   *  task's outcome, or its failure as a poll failure. */
  private async pollTask(tool: string, taskId: string, scope: CallScope, timeouts: AttemptTimeouts): Promise<Observed> {
    if (this.reconnectsSpent()) return this.pollFailure(this.spent());
    const sdk = this.sdk as McpSdk;
    const { value, error, capture, client } = await this.exchange(scope, (signal) => sdk.request(this.client, 'tasks/get', { taskId },
      { signal, timeout: timeouts.idleMs, maxTotalTimeout: timeouts.totalMs }), true);
    const sessionIdSent = this.sessionIdSent(capture, client);
    // A whole JSON answer that is no JSON-RPC response (its body does not parse): the server's answer, unusable.
    if (error !== undefined && !hasFailure(capture) && capture.answered !== true && capture.answerText) {
      return this.unusableTaskAnswer('a body that does not parse', { raw: capture.answerText, sessionIdSent });
    }
    if (error !== undefined || hasFailure(capture)) return this.pollFailure(this.observeFailure(error, capture, client, tool));
    const raw = capture.lastResult ?? value;
    const polled = { raw, sessionIdSent };
    const task = taskAnswerOf(raw);
    if (task === undefined) return this.unusableTaskAnswer('no task', polled);
    return this.observeTask(tool, task, scope, polled);
  }

  /** A failed `tasks/get` (or `tasks/update`), as the poll failure the contract takes. */
  private pollFailure(observed: Observed, task?: TaskAnswer): Observed {
    const outcome = observed.outcome;
    if (outcome.tag !== 'failure') return { ...observed, task };
    return { ...observed, outcome: { tag: 'poll-failure', val: outcome.val }, task };
  }

  /** `tasks/cancel` for the call's task, as a verdict asks before it is acted
   *  on: waited for at most 5 s, the attempt's idle timeout and the time left
   *  to the deadline (the scope stops it there; the call then stops and the
   *  cancel is sent again in the background). Its failure is logged, not
   *  reported: the verdict stands. */
  private async cancelTask(taskId: string, state: CallState, scope: CallScope, timeouts: AttemptTimeouts): Promise<void> {
    const sdk = this.sdk as McpSdk;
    const left = scope.timeLeftMs();
    const wait = Math.max(1, Math.min(CANCEL_TIMEOUT_MS, timeouts.idleMs, left === undefined ? Infinity : Number(left)));
    const { error, capture } = await this.exchange(scope, (signal) =>
      sdk.request(this.client, 'tasks/cancel', { taskId }, { signal, timeout: wait, maxTotalTimeout: wait }));
    if (state.liveTask === taskId) state.liveTask = undefined;
    if (error !== undefined || hasFailure(capture)) this.logCancelFailed(taskId, capture.status !== undefined ? `HTTP ${capture.status}` : capture.transportError ?? describeError(error));
  }

  /** `tasks/cancel` for the task of a call that stopped (its deadline passed,
   *  or it was cancelled): sent, not waited for (at most 5 s in the background). */
  private cancelTaskInBackground(tool: string, taskId: string): void {
    const sdk = this.sdk;
    const client = this.connection ? this.connection.client : this.bare;
    if (sdk === undefined || client === undefined) return;
    const signal = AbortSignal.timeout(CANCEL_TIMEOUT_MS);
    sdk.request(client, 'tasks/cancel', { taskId }, { signal, timeout: CANCEL_TIMEOUT_MS })
      .catch((e: unknown) => this.logCancelFailed(taskId, `${describeError(e)} (the call of ${tool} had stopped)`));
  }

  private logCancelFailed(taskId: string, error: string): void {
    this.log(JSON.stringify({
      event: 'agent_retry.task_cancel_failed', ts: Date.now() / 1000, run: this.run.runId, policy: this.policyIdentity, task: taskId, error,
    }));
  }

  /** Whether the connection's transport has a session id (to send with a request that is not captured). */
  private connectionSessionSent(): boolean {
    const client = this.connection ? this.connection.client : this.bare;
    return (client?.transport as { sessionId?: string } | undefined)?.sessionId !== undefined;
  }

  /** Whether the attempt's request carried `Mcp-Session-Id`: as the capturing
   *  fetch saw it, else whether the transport has a session id to send. */
  private sessionIdSent(capture: AttemptCapture, client: McpClient | undefined): boolean {
    if (capture.sessionIdSent !== undefined) return capture.sessionIdSent;
    return (client?.transport as { sessionId?: string } | undefined)?.sessionId !== undefined;
  }

  /** A failed request as the contract's observation, raw: the first case that
   *  fits, in the contract's order (HTTP status, transport, JSON-RPC error),
   *  with the headers and body as received, whether a session id was sent, and
   *  how far the request got. What it means is the policy's to say. A closed
   *  pipe or transport marks the connection lost (it is dead: I/O, not a decision). */
  private observeFailure(error: unknown, capture: AttemptCapture, client: McpClient | undefined, tool: string): Observed {
    let observed: Observed;
    const sdk = this.sdk as McpSdk;
    const reconnect = error instanceof ReconnectFailed ? error : undefined;
    const cause = reconnect ? reconnect.cause : error;
    const again = (detail: string) => (reconnect ? `${reconnect.message}: ${detail}` : detail);
    const said = sdk.readError(cause, capture.answered === true);
    const sessionIdSent = this.sessionIdSent(capture, client);
    const failure = (kind: Wit.FailureKind, headers: string, body: string, delivery: Wit.Delivery, structuredContent?: string): Outcome =>
      ({ tag: 'failure', val: { kind, headers, body, structuredContent, sessionIdSent, delivery } });
    const stdio = client?.transport === undefined || this.connection?.kind === 'stdio' || sdk.isStdioTransport(client.transport);
    // A request the transport took: written to the pipe, or handed to the capturing fetch.
    const written: Wit.Delivery = capture.answerStarted ? 'answer-started' : stdio || capture.fetched ? 'sent' : 'unknown';
    if (capture.status !== undefined) {
      observed = { outcome: failure({ tag: 'http-status', val: capture.status }, joinedHeaders(capture.headers), capture.body, 'answer-started') };
    } else if (capture.transportError !== undefined) {
      observed = { outcome: failure({ tag: 'transport', val: capture.transportError }, '', again(capture.transportDetail ?? ''), capture.delivery ?? 'unknown') };
    } else if (said?.kind === 'timeout') {
      observed = { outcome: failure({ tag: 'transport', val: 'timeout' }, '', again(said.message), written) };
    } else if (said?.kind === 'closed') {
      const lost = stdio ? 'the connection closed while the request was out (a stdio server that exited or closed its pipe)' : 'the connection closed';
      observed = { outcome: failure({ tag: 'transport', val: 'stream-closed' }, '', again(`${lost}: ${said.message}`), written), lost };
    } else if (said?.kind === 'json-rpc') {
      observed = { outcome: failure({ tag: 'protocol-error', val: said.code }, '', said.message, 'answer-started', structuredText(said.data)) };
    } else if (said?.kind === 'http') {
      // Only if the capturing fetch was not installed: the status without headers.
      observed = { outcome: failure({ tag: 'http-status', val: said.status }, '', said.message, 'answer-started') };
    } else if (said?.kind === 'not-connected') {
      // The pipe (or transport) was already closed: nothing was sent.
      const lost = 'the request could not be sent: not connected (the server process is gone)';
      observed = { outcome: failure({ tag: 'transport', val: 'stream-closed' }, '', again(lost), 'not-sent'), lost };
    } else if (cause !== undefined) {
      observed = { outcome: failure({ tag: 'transport', val: classifyNetworkError(cause) }, '', again(describeError(cause)), deliveryOfNetworkError(cause)) };
    } else {
      observed = { outcome: failure({ tag: 'transport', val: 'other' }, '', again('the request failed without an error'), 'unknown') };
    }
    if (observed.lost !== undefined) this.markLost(observed.lost);
    const kind = observed.outcome.tag === 'failure' ? observed.outcome.val.kind.tag : undefined;
    const fault = observed.outcome.tag === 'failure' && observed.outcome.val.kind.tag === 'transport' ? observed.outcome.val.kind.val : undefined;
    if (fault !== undefined && SUSPECT_AFTER.has(fault) && tool !== 'initialize' && this.connection?.kind === 'http') {
      // Not a decision: whether to send again is the policy's; where it goes is the transport's.
      this.markLost(`suspect after ${fault} on ${tool}`);
    }
    if ((kind === 'http-status' || kind === 'transport') && !capture.fetched && !reconnect && client !== undefined && sdk.isHttpTransport(client.transport)) {
      observed.captureMissing = true;
      if (!this.captureWarned) {
        this.captureWarned = true;
        this.log(JSON.stringify({
          event: 'agent_retry.capture_missing', ts: Date.now() / 1000, run: this.run.runId, policy: this.policyIdentity, tool,
          reason: 'a failure came from an HTTP transport that is not the wrapper\'s capturing one: no HTTP status headers '
            + '(Retry-After) are seen, and a cut answer stream waits for the attempt timeout; build the caller on McpConnection.http(url) '
            + 'or give the transport createCapturingFetch()',
        }));
      }
    }
    return observed;
  }

  private markLost(reason: string): void {
    if (this.connection) this.connection.markLost(reason);
    else this.bareLost ??= reason;
  }

  /** The status check configured for `tool`, if any. */
  private statusCheckOf(tool: string): StatusCheck | undefined {
    const configured = this.options.statusCheck;
    const check = typeof configured === 'function' ? configured : configured?.[tool];
    return typeof check === 'function' ? check : undefined;
  }

  /** A task's status read (the call answered with a task, or a poll of it answered): its event. */
  private taskPolled(core: CallCore, attempt: number, observed: Observed, polledId?: string): void {
    const outcome = observed.outcome;
    const taskId = outcome.tag === 'task' ? outcome.val.taskId : observed.task?.taskId ?? polledId;
    if (taskId === undefined || (outcome.tag !== 'task' && polledId === undefined)) return;
    const status = outcome.tag === 'task' ? outcome.val.status : outcome.tag === 'poll-failure' ? 'poll failed'
      : outcome.tag === 'failure' ? 'failed' : 'completed';
    core.taskPolled(attempt, taskId, status);
  }
}

/** What a poll of the call's task showed, for the guard (a poll never reports a status check). */
function pollOutcomeOf(observed: Observed): PollOutcome {
  const outcome = observed.outcome;
  return outcome.tag === 'status-check' ? { tag: 'poll-failure' } : outcome;
}

/** What failed in an attempt, for the guard: undefined for a tool result. */
function failureOf(observed: Observed): Wit.Observation | undefined {
  return observed.outcome.tag === 'failure' ? observed.outcome.val : undefined;
}

/** A re-connection that failed: its message says so (and why the session was lost). */
class ReconnectFailed extends Error {
  constructor(lost: string, override readonly cause: unknown) {
    super(`could not reach the server again (the session was lost: ${lost})`);
  }
}



/** Whether a key the application already put in the arguments can be told to
 *  the policy as the call's: a non-empty string of at most `MAX_ID_BYTES` UTF-8
 *  bytes (as Rust's `given_key_fits`). */
function givenKeyFits(key: unknown): key is string {
  return typeof key === 'string' && key.length > 0 && utf8Length(key) <= MAX_ID_BYTES;
}

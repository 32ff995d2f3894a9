// A retrying wrapper around the MCP TypeScript SDK's `Client.callTool`.
//
//   const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: createCapturingFetch() });
//   const client = new Client({ name: 'agent', version: '1.0.0' });
//   await client.connect(transport);
//   const caller = new RetryingToolCaller(client, run, { statusCheck: checkRefunds });
//   const result = await caller.callTool('issue_refund', { order_id: 'A1', amount: 500 });
//
// For each call the wrapper derives the idempotency key once (sent only if the
// tool's input schema has the key argument), asks the policy to begin the call,
// waits the admission delay, sends, turns what happened into the contract's
// `outcome`, records it and does what the decision says. All policy is in the
// component; this module only observes and obeys.
//
// What the SDK hides: a POST answered with a non-2xx status becomes a
// `StreamableHTTPError` with the status and body text but no headers (so no
// Retry-After). `createCapturingFetch` wraps `fetch` for the transport's `fetch`
// option and records, for the attempt in progress (AsyncLocalStorage, which
// follows the SDK's request into its fetch), the status, headers and body of a
// failed POST, or the network error of one that got no response.
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
// Every attempt (and every call escalated before it is sent) logs one JSON
// line with these fields in this order, the same in the Rust and Python hosts:
// `event` ("agent_retry.attempt"), `ts` (seconds since the epoch), `run`,
// `policy`, `step` (the N of the `step-N` the call's key is derived from: this
// caller's count of the model's calls, the same for every attempt of a call),
// `call` (null when the call was not admitted), `tool`, `attempt` (0 when not
// sent), `key` (the idempotency key sent, null when the tool takes none),
// `outcome`, `class`, `rule`, `action`, `delay_ms` (null unless retry),
// `hint_ms`, `escalation` (null unless escalate) and `reason`.
//
// Every attempt line says which policy decided (`policy`): the instance's
// identity (`agent-retry:policy@0.3.0 wasm 0c1b894cf1b1`, the contract version
// and the .wasm's SHA-256 prefix), or the `policyIdentity` option (a LivePolicy
// host passes `loaded.identity.toString()`: generation, wasm and config digests).
import { AsyncLocalStorage } from 'node:async_hooks';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError, type CallToolResult, type Tool } from '@modelcontextprotocol/sdk/types.js';

import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { nowMs, type Run } from './component.js';
import { OsEntropy, type EntropySource } from './entropy.js';
import { Escalated, InstanceUnusable, PolicyTrap } from './errors.js';

/** How much of a failed response's body is kept (the policy keeps at most `max-message-chars`). */
const MAX_CAPTURED_BODY = 64 * 1024;

/** What the HTTP layer saw for one attempt. */
export interface AttemptCapture {
  status?: number;
  headers: Array<[string, string]>;
  body: string;
  transportError?: Wit.TransportError;
  transportDetail?: string;
}

const currentAttempt = new AsyncLocalStorage<AttemptCapture>();

type FetchLike = (url: string | URL, init?: RequestInit) => Promise<Response>;

function errorCode(error: unknown): string | undefined {
  // undici reports the socket's error code on `cause` (sometimes inside an AggregateError).
  let cause: unknown = error;
  for (let depth = 0; depth < 5 && cause; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    const nested = (cause as { errors?: unknown[] }).errors;
    if (Array.isArray(nested) && nested.length) cause = nested[0];
    else cause = (cause as { cause?: unknown }).cause;
  }
  return undefined;
}

/** A network error from `fetch` as the contract's transport error. */
export function classifyNetworkError(error: unknown): Wit.TransportError {
  switch (errorCode(error)) {
    case 'ECONNREFUSED': case 'UND_ERR_CONNECT_TIMEOUT': case 'EHOSTUNREACH': case 'ENETUNREACH':
      return 'connection-refused'; // the request never reached the server
    case 'ECONNRESET': case 'EPIPE': case 'UND_ERR_SOCKET':
      return 'connection-reset';
    case 'UND_ERR_HEADERS_TIMEOUT': case 'UND_ERR_BODY_TIMEOUT': case 'ETIMEDOUT':
      return 'timeout';
    case 'UND_ERR_CLOSED':
      return 'stream-closed';
    default:
      return 'other'; // DNS, TLS, ...: not a blip, so the policy escalates
  }
}

/** A `fetch` for `StreamableHTTPClientTransport`'s `fetch` option that lets the
 *  wrapper see failed POSTs. Requests outside a wrapped call pass through untouched. */
export function createCapturingFetch(inner: FetchLike = fetch): FetchLike {
  return async (url, init) => {
    const capture = currentAttempt.getStore();
    if (!capture || (init?.method ?? 'GET').toUpperCase() !== 'POST') return inner(url, init);
    let response: Response;
    try {
      response = await inner(url, init);
    } catch (e) {
      capture.transportError = classifyNetworkError(e);
      capture.transportDetail = `${(e as Error).message}${errorCode(e) ? ` (${errorCode(e)})` : ''}`;
      throw e;
    }
    if (!response.ok) {
      const body = await response.clone().text().catch(() => '');
      capture.status = response.status;
      response.headers.forEach((value, name) => capture.headers.push([name, value]));
      capture.body = body.slice(0, MAX_CAPTURED_BODY);
    }
    return response;
  };
}

/** What a status check is asked about: a write that may have been applied. */
export interface StatusCheckRequest {
  client: Client;
  tool: string;
  arguments: Record<string, unknown>;
  idempotencyKey?: string;
  callId: number;
}

export type StatusCheck = (request: StatusCheckRequest) => Promise<Wit.StatusCheckResult>;

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
  /** Reads state after an ambiguous write; per tool or one for all. None: `unknown` (the policy escalates). */
  statusCheck?: StatusCheck | Record<string, StatusCheck>;
  /** The tool argument that carries the idempotency key (default `idempotency_key`). */
  keyArgument?: string;
  /** Jitter entropy passed to `record-outcome` (default: the OS). */
  entropy?: EntropySource;
  /** How long one attempt may take before it counts as a timeout (default 30 s). */
  attemptTimeoutMs?: number;
  /** The server's tools, if already listed (default: `listTools` on first use). */
  tools?: Tool[];
  emptyCheck?: (result: CallToolResult) => string | undefined;
  clock?: () => bigint;
  sleep?: (ms: number) => Promise<void>;
  /** One JSON line per attempt (default: stderr). */
  log?: (line: string) => void;
  /** Which policy makes the decisions, logged as `policy` on every attempt line.
   *  Default: the run's instance's `policyIdentity` (`agent-retry:policy@0.3.0 wasm
   *  0c1b894cf1b1`). A host serving a `LivePolicy` passes the run's `Loaded`
   *  identity: `loaded.identity.toString()` (`generation 3 (wasm …, config …)`). */
  policyIdentity?: string;
}

interface Observed {
  outcome: Wit.Outcome;
  summary: string;
  result?: CallToolResult;
}

/** What every log line of one call carries: its step (the N of `step-N`) and the key sent. */
interface CallTag {
  step: number;
  key?: string;
}

const defaultSleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A result's text content blocks, joined with "\n" (the tool error's body). */
export const textOf = (result: CallToolResult): string =>
  (result.content ?? []).flatMap((block) => (block.type === 'text' ? [block.text] : [])).join('\n');

/** The server's JSON-RPC error message, without the prefix the SDK adds (`MCP error -32603: `). */
export function jsonRpcMessage(error: McpError): string {
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

/** Calls MCP tools through one run of the policy. One caller per run, one call at a time. */
export class RetryingToolCaller {
  private tools?: Map<string, Tool>;
  private calls = 0;
  private readonly keyArgument: string;
  private readonly entropy: EntropySource;
  private readonly attemptTimeoutMs: number;
  private readonly clock: () => bigint;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly log: (line: string) => void;
  /** What every attempt line logs as `policy`: which policy made the decision. */
  readonly policyIdentity: string;

  constructor(readonly client: Client, readonly run: Run, private readonly options: RetryingToolCallerOptions = {}) {
    this.keyArgument = options.keyArgument ?? 'idempotency_key';
    this.entropy = options.entropy ?? new OsEntropy();
    this.attemptTimeoutMs = options.attemptTimeoutMs ?? 30_000;
    this.clock = options.clock ?? nowMs;
    this.sleep = options.sleep ?? defaultSleep;
    this.log = options.log ?? ((line) => process.stderr.write(`${line}\n`));
    const identity: unknown = options.policyIdentity ?? run.instance.policyIdentity;
    if (typeof identity !== 'string' || identity === '') {
      throw new TypeError(`policyIdentity must be a non-empty string (e.g. loaded.identity.toString()), not ${
        identity === '' ? 'an empty string' : typeof identity}`);
    }
    this.policyIdentity = identity;
    if (options.tools) this.tools = new Map(options.tools.map((t) => [t.name, t]));
  }

  private async tool(name: string): Promise<Tool | undefined> {
    if (!this.tools) {
      const tools = new Map<string, Tool>();
      let cursor: string | undefined;
      do {
        const page = await this.client.listTools(cursor ? { cursor } : undefined);
        for (const t of page.tools) tools.set(t.name, t);
        cursor = page.nextCursor;
      } while (cursor);
      this.tools = tools;
    }
    return this.tools.get(name);
  }

  /** Makes one intended call, retrying as the policy says. Resolves to what the
   *  model should see: the result, or (replan) an `isError` result carrying the
   *  policy's message. Rejects with `Escalated` when the run must stop.
   *  `actionId` names the call's place in the run for its idempotency key
   *  (default: `step-N`, N counting this caller's calls from 1, as the Rust host
   *  does, so all hosts derive the same key for the same run and call). */
  async callTool(name: string, args: Record<string, unknown> = {}, actionId?: string): Promise<CallToolResult> {
    this.calls += 1;
    const step = this.calls;
    const action = actionId ?? `step-${step}`;
    const tool = await this.tool(name);
    const sendArgs: Record<string, unknown> = { ...args };
    let key: string | undefined;
    const properties = tool?.inputSchema?.properties;
    if (properties && typeof properties === 'object' && this.keyArgument in properties) {
      key = this.policy({ step }, name, 'not sent', () => this.run.instance.deriveIdempotencyKey(this.run.runId, action));
      sendArgs[this.keyArgument] = key;
    }
    const tag: CallTag = { step, key };
    const annotations = tool?.annotations;
    const request: Wit.CallRequest = {
      tool: name,
      idempotencyKey: key,
      hints: annotations
        ? { readOnly: annotations.readOnlyHint, destructive: annotations.destructiveHint, idempotent: annotations.idempotentHint }
        : undefined,
    };
    const admission = this.policy(tag, name, 'not sent', () => this.run.beginCall(request, this.clock()));
    if (admission.tag === 'escalate') {
      this.logLine(tag, name, undefined, 0, 'not sent', { action: 'escalate', escalation: admission.val.reason, reason: admission.val.note });
      throw new Escalated(admission.val, name);
    }
    const { callId, delayMs } = admission.val;
    if (delayMs > 0n) await this.sleep(Number(delayMs));

    // The attempt each outcome reports: 1, then each retry plan's (contract 0.3.0).
    let attempt = 1;
    for (;;) {
      const observed = await this.attempt(name, sendArgs);
      let decision = this.policy(tag, name, observed.summary, () =>
        this.run.recordOutcome(callId, attempt, observed.outcome, this.clock(), this.entropy.nextU64()));
      this.logDecision(tag, name, callId, attempt, observed.summary, decision);
      while (decision.action.tag === 'check-status') {
        const found = await this.checkStatus({ client: this.client, tool: name, arguments: sendArgs, idempotencyKey: key, callId });
        // A status check reports the attempt whose effect it checked: the current one.
        decision = this.policy(tag, name, `status check: ${found}`, () =>
          this.run.recordOutcome(callId, attempt, { tag: 'status-check', val: found }, this.clock(), this.entropy.nextU64()));
        this.logDecision(tag, name, callId, attempt, `status check: ${found}`, decision);
      }
      const next = decision.action;
      switch (next.tag) {
        case 'retry':
          await this.sleep(Number(next.val.delayMs));
          attempt = next.val.attempt;
          continue;
        case 'replan':
          return { content: [{ type: 'text', text: next.val }], isError: true };
        case 'succeed':
          if (observed.result && observed.outcome.tag === 'success') return observed.result;
          return { content: [{ type: 'text', text: next.val ?? 'done' }], isError: false };
        case 'escalate':
          throw new Escalated(next.val, name);
      }
    }
  }

  /** Asks the policy; if the policy itself fails, the safe fallback: no retry,
   *  escalate with a note saying so (and what the last attempt saw). */
  private policy<T>(tag: CallTag, tool: string, lastOutcome: string, ask: () => T): T {
    try {
      return ask();
    } catch (e) {
      if (!(e instanceof PolicyTrap || e instanceof InstanceUnusable)) throw e;
      const note = `the retry policy failed (${e.name}: ${e.message}); not retried. Last outcome of ${tool}: ${lastOutcome}. ` +
        'Effects of this run are not known to the host: check before sending again.';
      this.logLine(tag, tool, undefined, 0, lastOutcome, { action: 'escalate', escalation: 'unclassified-failure', reason: note });
      throw new Escalated({ reason: 'unclassified-failure', lastError: lastOutcome, resetsInMs: undefined, effects: [], effectsTotal: 0, note }, tool, e);
    }
  }

  private async attempt(name: string, args: Record<string, unknown>): Promise<Observed> {
    const capture: AttemptCapture = { headers: [], body: '' };
    let result: CallToolResult | undefined;
    let error: unknown;
    try {
      result = (await currentAttempt.run(capture, () =>
        this.client.callTool({ name, arguments: args }, undefined, { timeout: this.attemptTimeoutMs }))) as CallToolResult;
    } catch (e) {
      error = e;
    }
    // The first case that fits, in the contract's order: HTTP status, transport,
    // JSON-RPC error, isError.
    if (capture.status !== undefined) {
      return {
        outcome: { tag: 'failure', val: { kind: { tag: 'http-status', val: capture.status }, headers: capture.headers, body: capture.body } },
        summary: `HTTP ${capture.status}`,
      };
    }
    if (capture.transportError !== undefined) {
      return { outcome: transport(capture.transportError, capture.transportDetail ?? ''), summary: capture.transportError };
    }
    if (error instanceof McpError) {
      if (error.code === ErrorCode.RequestTimeout) return { outcome: transport('timeout', error.message), summary: 'timeout' };
      if (error.code === ErrorCode.ConnectionClosed) return { outcome: transport('stream-closed', error.message), summary: 'stream closed' };
      return {
        outcome: {
          tag: 'failure',
          val: { kind: { tag: 'protocol-error', val: error.code }, headers: [], body: jsonRpcMessage(error), structuredContent: structuredText(error.data) },
        },
        summary: `JSON-RPC ${error.code}`,
      };
    }
    if (error instanceof StreamableHTTPError && error.code !== undefined && error.code >= 100) {
      // Only if the capturing fetch was not installed: the status without headers.
      return {
        outcome: { tag: 'failure', val: { kind: { tag: 'http-status', val: error.code }, headers: [], body: error.message } },
        summary: `HTTP ${error.code}`,
      };
    }
    if (error !== undefined) {
      return { outcome: transport(classifyNetworkError(error), String((error as Error).message ?? error)), summary: 'transport error' };
    }
    const value = result as CallToolResult;
    if (value.isError) {
      // No upstream status from the wrapper: the policy reads the text and the
      // structured content (a status, a provider's error type, a wait in prose).
      const failure: Wit.Failure = {
        kind: { tag: 'tool-error', val: undefined }, headers: [], body: textOf(value), structuredContent: structuredText(value.structuredContent),
      };
      return { outcome: { tag: 'failure', val: failure }, summary: 'isError', result: value };
    }
    const what = (this.options.emptyCheck ?? defaultEmptyCheck)(value);
    if (what !== undefined) return { outcome: { tag: 'empty-result', val: what }, summary: 'empty result', result: value };
    return { outcome: { tag: 'success' }, summary: 'success', result: value };
  }

  private async checkStatus(request: StatusCheckRequest): Promise<Wit.StatusCheckResult> {
    const configured = this.options.statusCheck;
    const check = typeof configured === 'function' ? configured : configured?.[request.tool];
    if (!check) return 'unknown'; // nobody can tell: the policy escalates rather than risk a second write
    try {
      const found = await check(request);
      return found === 'found' || found === 'absent' || found === 'unknown' ? found : 'unknown';
    } catch (e) {
      this.log(JSON.stringify({ event: 'agent_retry.status_check_failed', run: this.run.runId, policy: this.policyIdentity, tool: request.tool, error: String(e) }));
      return 'unknown';
    }
  }

  private logDecision(tag: CallTag, tool: string, callId: number, attempt: number, outcome: string, decision: Wit.Decision): void {
    const next = decision.action;
    this.logLine(tag, tool, callId, attempt, outcome, {
      class: decision.class,
      action: next.tag,
      delayMs: next.tag === 'retry' ? Number(next.val.delayMs) : undefined,
      hintMs: decision.hintMs === undefined ? undefined : Number(decision.hintMs),
      rule: decision.rule,
      escalation: next.tag === 'escalate' ? next.val.reason : undefined,
      reason: decision.reason,
    });
  }

  /** One JSON line, its fields in the order all three hosts use (module
   *  comment): `policy` says which policy decided (`policyIdentity`), `step` and
   *  `key` name the call (`tag`), `class` and `rule` say how the policy read the outcome,
   *  `escalation` is the contract's escalation reason (e.g. `run-steps-spent`,
   *  `server-wait-too-long`, `retry-forbidden`) when the action is `escalate`. */
  private logLine(tag: CallTag, tool: string, callId: number | undefined, attempt: number, outcome: string, what: {
    class?: string; action: string; delayMs?: number; hintMs?: number; rule?: string; escalation?: Wit.EscalationReason; reason: string;
  }): void {
    this.log(JSON.stringify({
      event: 'agent_retry.attempt', ts: Date.now() / 1000, run: this.run.runId, policy: this.policyIdentity,
      step: tag.step, call: callId ?? null, tool, attempt, key: tag.key ?? null,
      outcome, class: what.class ?? null, rule: what.rule ?? null, action: what.action, delay_ms: what.delayMs ?? null,
      hint_ms: what.hintMs ?? null, escalation: what.escalation ?? null, reason: what.reason,
    }));
  }
}

function transport(error: Wit.TransportError, body: string): Wit.Outcome {
  return { tag: 'failure', val: { kind: { tag: 'transport', val: error }, headers: [], body } };
}

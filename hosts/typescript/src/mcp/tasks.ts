// What a server says of a call's task (MCP 2026-07-28 Tasks extension,
// SEP-2663) and of the input it asks for (MRTR `input_required`), read raw for
// the policy: a `tools/call` answered `resultType: "task"`, a `tasks/get`
// answer, an `input_required` answer's questions. Nothing here decides what
// they mean; the wrapper (`./caller.ts`) reports them and does what the verdict says.
import type * as Wit from '../../generated/interfaces/agent-retry-policy-types.js';

import type { InputHandler } from './sdk.js';

/** A task as the server described it (`CreateTaskResult`, or `tasks/get`'s `DetailedTask`). */
export interface TaskAnswer {
  taskId: string;
  /** `working`, `input_required`, `completed`, `failed`, `cancelled` (or what else the server said). */
  status: string;
  statusMessage?: string;
  /** ISO 8601, as sent. */
  createdAt?: string;
  ttlMs?: bigint;
  pollIntervalMs?: bigint;
  /** With `input_required`: the server's requests, by key. */
  inputRequests?: Record<string, unknown>;
  /** With `completed`: the tool's result. */
  result?: Record<string, unknown>;
  /** With `failed`: the JSON-RPC error. */
  error?: { code?: unknown; message?: unknown; data?: unknown };
}

const isObject = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);

/** A non-negative integer of the wire as a u64, or none (negative, fractional,
 *  past u64, not a number: dropped, never passed on to fail the call). */
function u64(value: unknown): bigint | undefined {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0 && value < 2 ** 64 ? BigInt(value) : undefined;
}

/** The task a result describes (a `tools/call`'s `resultType: "task"` or a `tasks/get` answer), if it names one. */
export function taskAnswerOf(result: unknown): TaskAnswer | undefined {
  if (!isObject(result) || typeof result.taskId !== 'string' || typeof result.status !== 'string') return undefined;
  return {
    taskId: result.taskId,
    status: result.status,
    statusMessage: typeof result.statusMessage === 'string' ? result.statusMessage : undefined,
    createdAt: typeof result.createdAt === 'string' ? result.createdAt : undefined,
    ttlMs: u64(result.ttlMs),
    pollIntervalMs: u64(result.pollIntervalMs),
    inputRequests: isObject(result.inputRequests) ? result.inputRequests : undefined,
    result: isObject(result.result) ? result.result : undefined,
    error: isObject(result.error) ? result.error : undefined,
  };
}

/** The server's questions: each input request's `params.message` (else its method), joined with "\n". */
export function questionsOf(inputRequests: Record<string, unknown> | undefined): string {
  return Object.values(inputRequests ?? {}).map((request) => {
    const params = isObject(request) && isObject(request.params) ? request.params : undefined;
    if (typeof params?.message === 'string') return params.message;
    return isObject(request) && typeof request.method === 'string' ? request.method : 'input';
  }).join('\n');
}

/** An RFC 3339 time (`2026-12-02T07:00:00.123+00:00`, or `...Z`) as ms since
 *  the epoch, or none if it is not one (or is before the epoch): read as the
 *  Rust host's `task::epoch_ms` reads it, so every host reports the same age. */
export function epochMs(text: string): bigint | undefined {
  const match = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)(?:([Zz])|([+-])(\d{2}):(\d{2}))$/.exec(text);
  if (!match) return undefined;
  const [year, month, day, hour, minute] = match.slice(1, 6).map(Number);
  const seconds = Number(match[6]);
  const offset = match[7] ? 0 : (match[8] === '-' ? -1 : 1) * (Number(match[9]) * 60 + Number(match[10]));
  // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm), as Rust's.
  const y = month <= 2 ? year - 1 : year;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * ((month + 9) % 12) + 2) / 5) + day - 1;
  const days = era * 146_097 + yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy - 719_468;
  const ms = (days * 86_400 + hour * 3_600 + (minute - offset) * 60) * 1000 + seconds * 1000;
  return ms >= 0 && Number.isFinite(ms) ? BigInt(Math.trunc(ms)) : undefined;
}

/** The contract's task report of a task answer: its age read against `nowMs`
 *  (the host's wall clock; none without a readable `createdAt`). */
export function taskReportOf(task: TaskAnswer, status: Wit.TaskStatus, message: string, nowMs: bigint): Wit.TaskReport {
  const created = task.createdAt === undefined ? undefined : epochMs(task.createdAt);
  const ageMs = created === undefined ? undefined : nowMs > created ? nowMs - created : 0n;
  return { taskId: task.taskId, status, pollIntervalMs: task.pollIntervalMs, ttlMs: task.ttlMs, ageMs, message };
}

/** A failed task's JSON-RPC error code: an integer in the signed 32-bit range,
 *  else -32603 (internal error), as the Rust host's `task::failed` reads it. */
export function errorCodeOf(error: { code?: unknown }): number {
  const code = error.code;
  return typeof code === 'number' && Number.isInteger(code) && code >= -(2 ** 31) && code < 2 ** 31 ? code : -32603;
}

/** Answers a task's input requests with the application's handlers, or
 *  `undefined` if one of them has no handler (the input is then the policy's:
 *  `input-required`). A handler that fails fails the whole answer. */
export async function answerInputRequests(inputRequests: Record<string, unknown>, handlerOf: (method: string) => InputHandler | undefined,
  signal: AbortSignal, sessionId: string | undefined): Promise<Record<string, unknown> | undefined> {
  const entries = Object.entries(inputRequests);
  const handlers = entries.map(([, request]) => (isObject(request) && typeof request.method === 'string' ? handlerOf(request.method) : undefined));
  if (handlers.some((handler) => handler === undefined)) return undefined;
  const answers = await Promise.all(entries.map(async ([key, request], i) => {
    const { method, params } = request as { method: string; params?: unknown };
    // The context the SDK gives a handler of an embedded request: no related messaging.
    const unavailable = () => Promise.reject(new Error(`a task's ${method} request has no channel back to the server`));
    const context = {
      sessionId,
      mcpReq: { id: key, method, _meta: isObject(params) ? params._meta : undefined, signal, send: unavailable, notify: unavailable },
    };
    const answer = await (handlers[i] as InputHandler)({ jsonrpc: '2.0', id: key, method, ...(isObject(params) ? { params } : {}) }, context);
    return [key, answer] as const;
  }));
  return Object.fromEntries(answers);
}

// What the framework adapters share: the MCP server's tools as the model
// should see them, and how a `RetryingToolCaller`'s answer reads for a model.
// Nothing here decides anything: the caller (and so the policy) does.
import type { CallToolResult, Tool } from '@modelcontextprotocol/sdk/types.js';

import { Escalated } from '../errors.js';
import type { RetryingToolCaller } from '../mcp/caller.js';
import { textOf } from '../mcp/caller.js';

export type { Tool };

/** The tool argument that carries the idempotency key, unless the caller's `keyArgument` names another. */
export const DEFAULT_KEY_ARGUMENT = 'idempotency_key';

/** Options every adapter takes. */
export interface AdapterOptions {
  /** The server's tools, if the application listed them already (default: listed once here). */
  tools?: Tool[];
  /** Only these tools (by name) become framework tools (default: all). */
  include?: readonly string[];
  /** The caller's `keyArgument`, if it set one: the argument the wrapper fills
   *  with the idempotency key, so it is not shown to the model (default `idempotency_key`). */
  keyArgument?: string;
}

/** The server's tools: `options.tools`, else the caller's `listTools()` (the
 *  `tools/list` pseudo-call through the policy, every page, connecting first
 *  if need be; the caller's calls then use that listing). */
export async function listServerTools(caller: RetryingToolCaller, options: AdapterOptions = {}): Promise<Tool[]> {
  const tools = options.tools ?? await caller.listTools();
  const include = options.include;
  if (include) {
    const names = new Set(tools.map((t) => t.name));
    const unknown = include.filter((name) => !names.has(name));
    if (unknown.length > 0) throw new TypeError(`include names tools the server does not have: ${unknown.join(', ')}`);
    return tools.filter((t) => include.includes(t.name));
  }
  return tools;
}

/** A JSON Schema object (the tool's input schema as the model sees it). */
export type JsonObjectSchema = { type: 'object'; properties: Record<string, unknown>; required: string[]; [field: string]: unknown };

/** The tool's input schema without the key argument: the wrapper derives and
 *  sends the key itself (a key the model made up would be overwritten anyway). */
export function modelInputSchema(tool: Tool, keyArgument: string = DEFAULT_KEY_ARGUMENT): JsonObjectSchema {
  const schema = (tool.inputSchema ?? {}) as Record<string, unknown>;
  const properties = { ...((schema.properties && typeof schema.properties === 'object' ? schema.properties : {}) as Record<string, unknown>) };
  delete properties[keyArgument];
  const required = Array.isArray(schema.required) ? schema.required.filter((name): name is string => typeof name === 'string' && name !== keyArgument) : [];
  return { ...schema, type: 'object', properties, required };
}

/** The arguments a framework parsed for a tool, as an MCP call's arguments:
 *  an object, or a JSON text of one (anything else is no arguments). */
export function toolArguments(input: unknown): Record<string, unknown> {
  let value = input;
  if (typeof value === 'string') {
    if (value.trim() === '') return {};
    try {
      value = JSON.parse(value);
    } catch {
      throw new TypeError('the tool arguments are not JSON');
    }
  }
  if (value && typeof value === 'object' && !Array.isArray(value)) return value as Record<string, unknown>;
  return {};
}

/** Each caller's last call in line: frameworks run a step's tool calls at once. */
const turns = new WeakMap<RetryingToolCaller, Promise<unknown>>();

/** `caller.callTool`, one call at a time per caller (a `RetryingToolCaller` is
 *  one call at a time): calls the framework makes together are made in the
 *  order they came, each its own step of the run with its own key. One aborted
 *  while it waits its turn is cancelled when its turn comes (`CallCancelled`, nothing sent). */
export function callInTurn(caller: RetryingToolCaller, name: string, args: Record<string, unknown>, signal?: AbortSignal): Promise<CallToolResult> {
  const before = turns.get(caller) ?? Promise.resolve();
  const call = before.then(() => caller.callTool(name, args, { signal }));
  turns.set(caller, call.catch(() => undefined));
  return call;
}

/** A successful result as text for the model: its text blocks, else its
 *  structured content as JSON, else its content blocks as JSON. */
export function resultText(result: CallToolResult): string {
  const text = textOf(result);
  if (text !== '') return text;
  if (result.structuredContent !== undefined) return JSON.stringify(result.structuredContent);
  return JSON.stringify(result.content ?? []);
}

/** The wrapper answers a replan with an `isError` result carrying the policy's
 *  message: that message, or undefined for a result the model may use. */
export function replanMessage(result: CallToolResult): string | undefined {
  return result.isError === true ? textOf(result) : undefined;
}

/** The policy's message for the model, thrown so the framework shows it as the
 *  tool's error (its own retry signal). Not an escalation: the run goes on. */
export class ToolReplan extends Error {
  constructor(readonly tool: string, message: string) {
    super(message);
    this.name = 'ToolReplan';
  }

  /** The message alone: frameworks show a tool error to the model as `String(error)`. */
  override toString(): string {
    return this.message;
  }
}

/** The `Escalated` inside what a framework threw (its own error wrapping the
 *  tool's, e.g. `ToolCallError.error`, or a `cause` chain), if there is one. */
export function findEscalation(error: unknown): Escalated | undefined {
  const seen = new Set<unknown>();
  let current = error;
  while (current && typeof current === 'object' && !seen.has(current)) {
    if (current instanceof Escalated) return current;
    seen.add(current);
    const wrapper = current as { error?: unknown; cause?: unknown };
    current = wrapper.error instanceof Error ? wrapper.error : wrapper.cause;
  }
  return undefined;
}

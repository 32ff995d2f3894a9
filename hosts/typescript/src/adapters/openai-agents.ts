// The OpenAI Agents SDK (JS, `@openai/agents` 0.20) adapter: the MCP server's
// tools as the SDK's function tools, each call made through a `RetryingToolCaller`.
//
//   const connection = McpConnection.http(url);     // the capturing fetch: statuses and headers are seen
//   const caller = new RetryingToolCaller(connection, run);
//   const agent = new Agent({ name: 'desk', model, tools: await retryingTools(caller) });
//   try { await run(agent, 'refund order A1'); }
//   catch (e) { const escalated = findEscalation(e); ... escalated.note is for a person }
//
// One MCP client per call path: the wrapper's (`McpConnection`: `@modelcontextprotocol/client`
// v2 when installed, which `@openai/agents-core` installs as its optional dependency; else the v1
// SDK). The SDK's own MCP server classes (`MCPServerStreamableHttp`, ...) are not used, so its
// MCP client never connects.
//
// What reaches whom:
// - a transient failure: retried inside the call, as the policy says; the model sees the result;
// - a replan: thrown as `ToolReplan` and given to the model as the tool's error output
//   (the SDK's own path for tool errors: the span is marked, the run goes on);
// - an escalation, a stopped call (`CallTimedOut`, `CallCancelled`), a lost session,
//   a missing SDK: rethrown, so `run()` rejects (the SDK's `ToolCallError`, the wrapper's
//   error as its `error`: `findEscalation(e)`); never the model's "Please try again"
//   (the SDK's default `errorFunction`).
// - approvals: the SDK's `needsApproval` (an interruption before the tool runs), from the
//   `needsApproval` option. A call the person rejects is never sent and costs the policy
//   nothing; an approved one goes through the policy like any other.
import { tool, type FunctionTool, type RunContext } from '@openai/agents';

import { RetryingToolCaller } from '../mcp/caller.js';
import {
  DEFAULT_KEY_ARGUMENT, ToolReplan, callInTurn, listServerTools, modelInputSchema, replanMessage, resultText, toolArguments, type AdapterOptions, type Tool,
} from './server-tools.js';

export { ToolReplan, findEscalation, listServerTools, modelInputSchema, type AdapterOptions, type Tool } from './server-tools.js';

/** A tool `retryingTools` makes: an `Agent` takes it in `tools`. */
export type RetryingFunctionTool = FunctionTool<unknown, NonStrictParameters, unknown>;

/** Whether a call of a tool waits for a person's approval (the SDK's interruption). */
export type ApprovalRule = boolean | readonly string[]
  | ((tool: Tool, input: Record<string, unknown>) => boolean | Promise<boolean>);

export interface OpenAIAgentsToolsOptions extends AdapterOptions {
  /** Which calls need a person's approval first (the SDK's `needsApproval`): all
   *  (`true`), the tools named, or a predicate over the tool's MCP description
   *  (e.g. `(t) => t.annotations?.destructiveHint === true`) and the arguments.
   *  Default: none. */
  needsApproval?: ApprovalRule;
}

/** The server's tools as function tools for an `Agent`, every call through `caller`. */
export async function retryingTools(caller: RetryingToolCaller, options: OpenAIAgentsToolsOptions = {}): Promise<RetryingFunctionTool[]> {
  if (!(caller instanceof RetryingToolCaller)) throw new TypeError('retryingTools needs a RetryingToolCaller');
  const tools = await listServerTools(caller, options);
  const keyArgument = options.keyArgument ?? DEFAULT_KEY_ARGUMENT;
  const made = tools.map((described) => functionTool(caller, described, keyArgument, options.needsApproval));
  // The SDK rewrites a name to [a-zA-Z0-9_]: two MCP names may become one (each call still goes to its own MCP name).
  const seen = new Map<string, string>();
  made.forEach((t, i) => {
    const other = seen.get(t.name);
    if (other !== undefined) {
      throw new TypeError(`the MCP tools ${JSON.stringify(other)} and ${JSON.stringify(tools[i].name)} are both ${JSON.stringify(t.name)} `
        + 'to the SDK: leave one out (include)');
    }
    seen.set(t.name, tools[i].name);
  });
  return made;
}

function functionTool(caller: RetryingToolCaller, described: Tool, keyArgument: string, approval: ApprovalRule | undefined): RetryingFunctionTool {
  const name = described.name;
  return tool({
    name,
    description: described.description ?? described.title ?? name,
    parameters: parametersOf(described, keyArgument),
    // MCP schemas are not written for strict mode (optional properties, open objects).
    strict: false,
    needsApproval: needsApprovalOf(described, approval),
    async execute(input: unknown, _context?: RunContext<unknown>, details?: { signal?: AbortSignal }): Promise<string> {
      const result = await callInTurn(caller, name, toolArguments(input), details?.signal);
      const replan = replanMessage(result);
      if (replan !== undefined) throw new ToolReplan(name, replan);
      return resultText(result);
    },
    // Only the policy's message is for the model; everything else stops the run.
    errorFunction: (_context: RunContext<unknown>, error: unknown) => {
      if (error instanceof ToolReplan) return error.message;
      throw error;
    },
  });
}

/** The tool's input schema as the SDK takes a non-strict one (JSON Schema's
 *  default `additionalProperties: true` written out, the server's own kept). */
function parametersOf(described: Tool, keyArgument: string): NonStrictParameters {
  const schema = modelInputSchema(described, keyArgument);
  return { ...schema, additionalProperties: schema.additionalProperties ?? true } as unknown as NonStrictParameters;
}

/** The SDK's `JsonObjectSchemaNonStrict` (not exported by `@openai/agents`). */
type NonStrictParameters = { type: 'object'; properties: Record<string, never>; required: never[]; additionalProperties: true };

function needsApprovalOf(described: Tool, approval: ApprovalRule | undefined): boolean | ((context: RunContext, input: unknown) => Promise<boolean>) {
  if (approval === undefined || typeof approval === 'boolean') return approval ?? false;
  if (typeof approval === 'function') return async (_context, input) => (await approval(described, toolArguments(input))) === true;
  return approval.includes(described.name);
}

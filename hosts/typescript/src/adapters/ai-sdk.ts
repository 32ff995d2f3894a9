// The Vercel AI SDK (`ai` 7) adapter: the MCP server's tools as AI SDK tools,
// each `execute` through a `RetryingToolCaller`, and the stop condition that
// ends the tool loop on an escalation.
//
//   const connection = McpConnection.http(url);     // the capturing fetch: statuses and headers are seen
//   const caller = new RetryingToolCaller(connection, run);
//   const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(10) });
//   const result = await generateText({ model, tools, stopWhen, prompt });   // rejects with `Escalated`
//
// The AI SDK turns whatever `execute` throws into a `tool-error` part, shows it
// to the model and goes on with the loop. So:
// - a replan is thrown as `ToolReplan`: the tool-error part the model reads (the policy's message);
// - an escalation (and a stopped call, a lost session, a missing SDK) is thrown too, and the
//   returned `stopWhen` (`stopOnEscalation`) ends the loop after that step by throwing the
//   wrapper's error: `generateText` rejects with the `Escalated` itself, and no later model
//   call sees it. Without that stop condition the model would read the note as a tool error.
// - a transient failure is retried inside `execute`; the model sees the result.
// - approvals are the AI SDK's own: `toolApproval` on `generateText` applies to these tools as
//   to any. A call denied (or not yet approved) is never sent and costs the policy nothing.
//
// One MCP client per call path: the wrapper's `McpConnection`, not `@ai-sdk/mcp`.
import { jsonSchema, tool, type StopCondition, type Tool as AiTool, type ToolSet } from 'ai';

import { RetryingToolCaller } from '../mcp/caller.js';
import {
  DEFAULT_KEY_ARGUMENT, ToolReplan, callInTurn, listServerTools, modelInputSchema, replanMessage, resultText, toolArguments, type AdapterOptions, type Tool,
} from './server-tools.js';

export { ToolReplan, findEscalation, listServerTools, modelInputSchema, type AdapterOptions, type Tool } from './server-tools.js';

/** Errors the adapter's tools threw that must stop the loop (not replans). */
const stopping = new WeakSet<object>();

/** A stop condition: after a step in which one of the adapter's tools threw
 *  anything but a replan (an `Escalated`, `CallTimedOut`, `CallCancelled`,
 *  `SessionLost`, ...), it throws that error, so `generateText` (or
 *  `streamText`) ends with it and the model is not called again. */
export const stopOnEscalation: StopCondition<ToolSet> = ({ steps }) => {
  const last = steps[steps.length - 1];
  for (const part of last?.content ?? []) {
    if (part.type === 'tool-error' && part.error !== null && typeof part.error === 'object' && stopping.has(part.error)) throw part.error;
  }
  return false;
};

export interface AiSdkToolsOptions extends AdapterOptions {
  /** The application's own stop conditions (e.g. `stepCountIs(10)`), put after `stopOnEscalation`. */
  stopWhen?: StopCondition<ToolSet> | Array<StopCondition<ToolSet>>;
}

export interface RetryingAiSdkTools {
  /** The server's tools, by name, every `execute` through the caller. */
  tools: ToolSet;
  /** `stopOnEscalation` first, then the `stopWhen` option's conditions: pass it to `generateText`. */
  stopWhen: Array<StopCondition<ToolSet>>;
}

/** The server's tools as AI SDK tools, every call through `caller`, and the stop conditions to run them with. */
export async function retryingTools(caller: RetryingToolCaller, options: AiSdkToolsOptions = {}): Promise<RetryingAiSdkTools> {
  if (!(caller instanceof RetryingToolCaller)) throw new TypeError('retryingTools needs a RetryingToolCaller');
  const described = await listServerTools(caller, options);
  const keyArgument = options.keyArgument ?? DEFAULT_KEY_ARGUMENT;
  const tools: ToolSet = {};
  for (const t of described) tools[t.name] = aiTool(caller, t, keyArgument);
  const given = options.stopWhen === undefined ? [] : Array.isArray(options.stopWhen) ? options.stopWhen : [options.stopWhen];
  return { tools, stopWhen: [stopOnEscalation, ...given] };
}

function aiTool(caller: RetryingToolCaller, described: Tool, keyArgument: string): AiTool {
  const name = described.name;
  return tool({
    description: described.description ?? described.title ?? name,
    inputSchema: jsonSchema<Record<string, unknown>>(modelInputSchema(described, keyArgument) as Parameters<typeof jsonSchema>[0]),
    async execute(input: Record<string, unknown>, { abortSignal }: { abortSignal?: AbortSignal }): Promise<string> {
      let result;
      try {
        result = await callInTurn(caller, name, toolArguments(input), abortSignal);
      } catch (e) {
        if (e !== null && typeof e === 'object') stopping.add(e);
        throw e;
      }
      const replan = replanMessage(result);
      if (replan !== undefined) throw new ToolReplan(name, replan);
      return resultText(result);
    },
  }) as AiTool;
}

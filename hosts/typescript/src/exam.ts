// The Node host's exam client for the host-conformance judge
// (`agent-retry judge --exam tests/judge/exam.json -- <this command>`).
//
//   node hosts/typescript/dist/src/exam.js --url URL --exam tests/judge/exam.json
//
// Reads the exam and makes each of its runs through `RetryingToolCaller`: a
// fresh policy instance and run per entry of "runs" (run id, "config", the
// real-clock "attempt-timeout-ms", the "key-argument"), then each call in order.
// A replan goes on to the next call, an escalation ends the run. The status
// checks are built from the exam's "status-checks" spec. One JSON line per call
// outcome goes to stdout, the wrapper's attempt log to stderr. Exits 0 once every
// run was made; the judge then checks, from the server's side, what the host
// did. Mirrors the Rust host's `agent-retry exam` (host-example/src/commands/exam.rs).
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import { EmbeddedAccounts } from './accounts.js';
import { PolicyComponent } from './component.js';
import { OsEntropy } from './entropy.js';
import { Escalated } from './errors.js';
import { McpConnection, RetryingToolCaller, textOf, type StatusCheck } from './mcp.js';

/** An exam's status check: which read tells whether a write was applied. */
export interface StatusCheckSpec {
  tool: string;
  arguments: string[];
  list: string;
  match: string[];
}

export interface Exam {
  config: object;
  'attempt-timeout-ms': number;
  'key-argument': string;
  'status-checks'?: Record<string, StatusCheckSpec>;
  runs: Array<{ 'run-id': string; calls: Array<{ tool: string; arguments?: Record<string, unknown> }> }>;
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** Deep equality of JSON values (as serde_json's `==`). */
function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((v, i) => jsonEqual(v, b[i]));
  if (isObject(a) && isObject(b)) {
    const keys = Object.keys(a);
    return keys.length === Object.keys(b).length && keys.every((k) => k in b && jsonEqual(a[k], b[k]));
  }
  return false;
}

/** A status check built from an exam's spec: call `spec.tool` (directly, not
 *  through the policy) with the call's arguments named in `spec.arguments`;
 *  `found` if `structuredContent[spec.list]` holds an item whose `spec.match`
 *  fields all equal the call's arguments, `absent` if not, `unknown` if the read failed. */
export function statusCheckFromSpec(spec: StatusCheckSpec): StatusCheck {
  return async ({ client, arguments: args }) => {
    const read: Record<string, unknown> = {};
    for (const name of spec.arguments) if (name in args) read[name] = args[name];
    let result: CallToolResult;
    try {
      result = (await client.callTool({ name: spec.tool, arguments: read })) as CallToolResult;
    } catch {
      return 'unknown';
    }
    if (result.isError) return 'unknown';
    const items = isObject(result.structuredContent) ? result.structuredContent[spec.list] : undefined;
    const found = Array.isArray(items) && items.some((item) =>
      isObject(item) && spec.match.every((name) => jsonEqual(item[name], args[name])));
    return found ? 'found' : 'absent';
  };
}


const emit = (line: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(line)}\n`);

/** Makes every run of `exam` against `url`. Resolves to the number of calls that
 *  ended in an error that is not a policy outcome (0 when all went as designed). */
export async function runExam(url: string, exam: Exam, component: PolicyComponent): Promise<number> {
  const checks: Record<string, StatusCheck> = {};
  for (const [tool, spec] of Object.entries(exam['status-checks'] ?? {})) checks[tool] = statusCheckFromSpec(spec);
  // The wrapper's own connection, as a user's (v2 when installed): it
  // negotiates the revision and declares the tasks extension (J-9 is a task).
  const connection = McpConnection.http(url);
  let errors = 0;
  try {
    for (const runSpec of exam.runs) {
      const runId = runSpec['run-id'];
      const instance = await component.instantiate({ accounts: new EmbeddedAccounts(), entropy: new OsEntropy() });
      const run = instance.loadPolicy(exam.config).startRun(runId);
      const caller = new RetryingToolCaller(connection, run, {
        statusCheck: checks,
        keyArgument: exam['key-argument'],
        attemptTimeoutMs: exam['attempt-timeout-ms'],
      });
      for (const call of runSpec.calls) {
        let result: CallToolResult;
        try {
          result = await caller.callTool(call.tool, call.arguments ?? {});
        } catch (e) {
          if (e instanceof Escalated) {
            emit({ run: runId, tool: call.tool, outcome: 'escalated', reason: e.reason, note: e.note });
          } else { // not a policy outcome: a bug somewhere; report it, go on
            errors += 1;
            emit({ run: runId, tool: call.tool, outcome: 'error', error: String(e) });
          }
          break;
        }
        // The wrapper returns a replan as an isError result.
        if (result.isError) emit({ run: runId, tool: call.tool, outcome: 'replan', message: textOf(result) });
        else emit({ run: runId, tool: call.tool, outcome: 'done', result: textOf(result) });
      }
    }
  } finally {
    await connection.close().catch(() => undefined);
  }
  return errors;
}

async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: { url: { type: 'string' }, exam: { type: 'string' }, wasm: { type: 'string' } },
    strict: true,
  });
  if (!values.url || !values.exam) {
    process.stderr.write('usage: node dist/src/exam.js --url URL --exam PATH [--wasm PATH]\n');
    return 2;
  }
  const exam = JSON.parse(readFileSync(values.exam, 'utf8')) as Exam;
  const component = await PolicyComponent.load({ wasmPath: values.wasm });
  const errors = await runExam(values.url, exam, component);
  if (errors) process.stderr.write(`exam: ${errors} call(s) ended in an error that is not a policy outcome\n`);
  return errors ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { console.error(e); process.exit(2); });
}

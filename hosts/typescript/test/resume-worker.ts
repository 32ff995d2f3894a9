// The Node side of the cross-host resume test (hosts/python's cross-host test
// runs it): a snapshot taken by another host's wrapper, resumed here through
// the MCP wrapper's `resume` with a person's answer.
//
//   node dist/test/resume-worker.js URL CONFIG_PATH SNAPSHOT_PATH ANSWER
//
// ANSWER: retry | skip | abort | done:<text> (`done` alone: no text). It loads
// the component, the policy from CONFIG_PATH (JSON text), connects to URL over
// streamable HTTP (`McpConnection.http`), resumes the snapshot read from
// SNAPSHOT_PATH with `caller.resume(snapshot, answer)` and prints ONE JSON line
// on stdout:
//
//   {"host": "node", "action": "send"|"succeed"|"replan"|"escalate",
//    "text": <the tool result's text, the replan message or the escalation note>,
//    "call_id": n, "attempt": n, "key": <the idempotency key the resumed call sent, or null>}
//
// and exits 0. The wrapper's event lines go to stderr. A usage error: exit 1
// with a message on stderr; a snapshot refused or anything else that fails:
// exit 2 with the reason on stderr. `node --test dist/test/` loads every file
// here: under the test runner, without arguments, it does nothing.
import { readFileSync } from 'node:fs';

import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import { PolicyComponent, ResumeAnswer } from '../src/component.js';
import { Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';

const USAGE = 'usage: node dist/test/resume-worker.js URL CONFIG_PATH SNAPSHOT_PATH ANSWER (ANSWER: retry | skip | abort | done:<text>)';

/** The answer a command line gives, or undefined if it is none. */
function answerOf(word: string): ResumeAnswer | undefined {
  if (word === 'retry') return ResumeAnswer.retry();
  if (word === 'skip') return ResumeAnswer.skip();
  if (word === 'abort') return ResumeAnswer.abort();
  if (word === 'done') return ResumeAnswer.done();
  if (word.startsWith('done:')) return ResumeAnswer.done(word.slice('done:'.length));
  return undefined;
}

const textOf = (result: CallToolResult): string =>
  (result.content ?? []).flatMap((block) => (block.type === 'text' ? [block.text] : [])).join('\n');

async function main(url: string, configPath: string, snapshotPath: string, answer: ResumeAnswer): Promise<void> {
  const config = readFileSync(configPath, 'utf8');
  const snapshot = readFileSync(snapshotPath, 'utf8');
  // The keys every tools/call sent, in order (what went over the wire).
  const sentKeys: Array<{ tool: string; key: unknown }> = [];
  const recording: FetchLike = async (to, init) => {
    if ((init?.method ?? 'GET').toUpperCase() === 'POST' && typeof init?.body === 'string') {
      try {
        const message = JSON.parse(init.body) as { method?: string; params?: { name?: string; arguments?: Record<string, unknown> } };
        if (message.method === 'tools/call') sentKeys.push({ tool: message.params?.name ?? '', key: message.params?.arguments?.idempotency_key });
      } catch {
        // not JSON: not a call
      }
    }
    return fetch(to, init);
  };
  const instance = await (await PolicyComponent.load()).instantiate();
  const policy = instance.loadPolicy(config);
  // The caller's own run is replaced by the resumed one.
  const run = policy.startRun(`resume-worker-node-${process.pid}`);
  const connection = McpConnection.http(url, { fetch: recording });
  try {
    const caller = new RetryingToolCaller(connection, run);
    let text: string;
    try {
      text = textOf(await caller.resume(snapshot, answer));
    } catch (e) {
      if (!(e instanceof Escalated)) throw e;
      text = e.note;
    }
    const call = caller.run.resumedCall();
    if (call === undefined) throw new Error('the resumed run names no call');
    const sent = sentKeys.filter((s) => s.tool === call.tool);
    const key = sent.length > 0 && typeof sent[sent.length - 1].key === 'string' ? sent[sent.length - 1].key : null;
    const line = { host: 'node', action: call.action, text, call_id: call.callId, attempt: call.attempt, key };
    process.stdout.write(`${JSON.stringify(line)}\n`);
  } finally {
    await connection.close();
  }
}

const args = process.argv.slice(2);
const underTestRunner = process.env.NODE_TEST_CONTEXT !== undefined;
if (!(underTestRunner && args.length === 0)) {
  const answer = args.length === 4 ? answerOf(args[3]) : undefined;
  if (args.length !== 4 || answer === undefined) {
    process.stderr.write(`${args.length === 4 ? `ANSWER ${JSON.stringify(args[3])} is not one of retry, skip, abort, done:<text>\n` : ''}${USAGE}\n`);
    process.exit(1);
  }
  main(args[0], args[1], args[2], answer).then(() => process.exit(0), (e: unknown) => {
    process.stderr.write(`resume-worker: ${String((e as Error)?.stack ?? e)}\n`);
    process.exit(2);
  });
}

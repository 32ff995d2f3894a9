// tests/vectors/observations.json through the REAL wrapper (brief (b)): each
// case's answer is served by the demo server as the first `lookup_order`
// call's fault, the wrapper (McpConnection.http + RetryingToolCaller, with each
// SDK major) observes it, and the verdict it acted on for attempt 1 (the
// `onVerdict` hook) must say what the case expects: action, class, rule and
// reconnect. The observation it reported must be the case's raw facts (kind,
// body, headers, session-id-sent, delivery), so a wrapper that maps an SDK
// error to the wrong observation fails here. A case whose session id is sent
// runs a 2025-11-25 handshake session (`--sessions`; v2 in its legacy mode);
// otherwise no session id (v2: 2026-07-28, v1: a stateless 2025 session).
// `npm run vectors` (src/conformance.ts) runs the same cases pure.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { defaultVectorDir, expectMismatch, loadObservationFile, readableObservation, type ObservationCase } from '../src/conformance.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type McpSdkName, type VerdictEvent } from '../src/mcp.js';
import { DemoServer, type FaultRule } from './demo-server.js';

const file = loadObservationFile(defaultVectorDir);

test('observations.json is there', () => {
  assert.ok(file && file.cases.length > 0, `no observations.json in ${defaultVectorDir}`);
});

/** What the wrapper did with the case's answer: the first attempt's verdict,
 *  and how many times the connection was established. */
async function replay(sdk: McpSdkName, testCase: ObservationCase): Promise<{ first: VerdictEvent; connections: number; all: VerdictEvent[] }> {
  const sessions = testCase['session-id-sent'];
  const rule: FaultRule = { tool: 'lookup_order', call: 1, fault: testCase.answer as FaultRule['fault'] };
  const demo = await DemoServer.start({ faults: [rule], args: ['--era', 'dual', ...(sessions ? ['--sessions'] : [])], require: ['--era', '--sessions'] });
  const connection = McpConnection.http(demo.url, {
    sdk, ...(sdk === 'v2' && sessions ? { clientOptions: { versionNegotiation: { mode: 'legacy' as const } } } : {}),
  });
  try {
    const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(5n) });
    const run = instance.loadPolicy(file!.config ?? {}).startRun('observations');
    const seen: VerdictEvent[] = [];
    const caller = new RetryingToolCaller(connection, run, { log: null, sleep: async () => undefined, onVerdict: (event) => seen.push(event) });
    await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => {
      if (!(e instanceof Escalated)) throw e;
    });
    const first = seen.find((event) => event.tool === 'lookup_order' && event.attempt === 1);
    assert.ok(first, `no verdict on attempt 1 of lookup_order: ${JSON.stringify(seen.map((e) => [e.tool, e.attempt, e.verdict.action]))}`);
    return { first, connections: connection.connections, all: seen };
  } finally {
    await connection.close();
    await demo.stop();
  }
}

for (const sdk of ['v2', 'v1'] as const) {
  describe(`observations.json through the wrapper, sdk ${sdk}`, () => {
    for (const testCase of file?.cases ?? []) {
      test(testCase.description, async () => {
        const { first, connections } = await replay(sdk, testCase);
        const verdict = first.verdict;
        const mismatch = expectMismatch(testCase.expect, { action: verdict.action, class: verdict.class, rule: first.rule, reconnect: verdict.reconnect });
        assert.equal(mismatch, undefined, `${mismatch}`);
        // The raw facts the capture must report (the observation the case names).
        assert.equal(first.reported.tag, 'failure');
        const reported = first.reported.tag === 'failure' ? first.reported.val : undefined;
        const wanted = readableObservation(testCase.observation);
        assert.deepEqual(reported?.kind, wanted.kind);
        assert.equal(reported?.sessionIdSent, wanted.sessionIdSent, 'session-id-sent');
        assert.equal(reported?.delivery, wanted.delivery, 'delivery');
        assert.equal(reported?.body, wanted.body, 'the body as received');
        for (const line of wanted.headers.split('\n').filter(Boolean)) {
          const [name, value] = [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()];
          assert.ok(reported?.headers.split('\n').some((l) => l.slice(0, l.indexOf(':')).toLowerCase() === name && l.slice(l.indexOf(':') + 1).trim() === value),
            `the header ${line} as received, in ${JSON.stringify(reported?.headers)}`);
        }
        // A retry that reconnects is sent on a new session.
        if (testCase.expect.action === 'retry') assert.equal(connections, testCase.expect.reconnect ? 2 : 1, 'connections made');
      });
    }
  });
}

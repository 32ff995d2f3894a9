// Contract 0.3.0's host-side limits (and 0.4.0's flat `record-failure`) (src/limits.ts): what crosses into the
// guest is bounded before it crosses, so a 40 MB tool error or 5,800 headers
// cost the policy no more than 64 KB does, and never trap the instance.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';

import type { Failure, Outcome } from '../src/index.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import {
  MAX_BODY_BYTES, MAX_HEADERS, MAX_HEADER_VALUE_BYTES, MAX_STRUCTURED_BYTES, boundedFailure, boundedOutcome, cutUtf8, exceedsUtf8, joinedHeaders,
} from '../src/limits.js';
import { RetryingToolCaller } from '../src/mcp.js';

const bytes = (text: string) => Buffer.byteLength(text, 'utf8');
const MB = 1_000_000;

test('a text is cut at a character boundary, in UTF-8 bytes', () => {
  assert.equal(cutUtf8('abc', 2), 'ab');
  assert.equal(cutUtf8('abc', 3), 'abc');
  assert.equal(cutUtf8('é'.repeat(40_000), MAX_BODY_BYTES), 'é'.repeat(32_768)); // 2 bytes each: exactly the limit
  assert.equal(cutUtf8(`a${'é'.repeat(40_000)}`, MAX_BODY_BYTES), `a${'é'.repeat(32_767)}`); // 65,535 bytes: no half é
  assert.equal(cutUtf8('😀😀', 7), '😀'); // a 4-byte character is never split
  assert.equal(cutUtf8(`${'a'.repeat(5)}😀`, 6), 'aaaaa'); // nor its surrogate pair written as U+FFFD
  assert.equal(cutUtf8(`${'a'.repeat(5)}😀`, 9), `${'a'.repeat(5)}😀`);
  assert.equal(cutUtf8('€'.repeat(10), 10), '€€€'); // 3 bytes each
  const huge = 'x'.repeat(40 * MB);
  assert.equal(cutUtf8(huge, MAX_BODY_BYTES).length, MAX_BODY_BYTES);
  assert.equal(exceedsUtf8('é'.repeat(32_768), MAX_BODY_BYTES), false);
  assert.equal(exceedsUtf8('é'.repeat(32_769), MAX_BODY_BYTES), true);
  assert.equal(exceedsUtf8('x'.repeat(MAX_BODY_BYTES), MAX_BODY_BYTES), false);
  assert.equal(exceedsUtf8(huge, MAX_BODY_BYTES), true);
  assert.equal(exceedsUtf8('\ud800'.repeat(100), 299), true); // a lone surrogate is U+FFFD: 3 bytes, as jco sends it
});

test('a failure within every limit is passed as it is; a huge one is cut', () => {
  const small: Failure = { kind: { tag: 'http-status', val: 503 }, headers: [['a', 'b']], body: 'x' };
  assert.equal(boundedFailure(small), small, 'not copied');
  const outcome: Outcome = { tag: 'failure', val: small };
  assert.equal(boundedOutcome(outcome), outcome);
  const huge: Failure = {
    kind: { tag: 'tool-error', val: undefined },
    headers: Array.from({ length: 5_800 }, (_, i) => [`h${i}`.padEnd(5_000, 'n'), 'v'.repeat(70_000)] as [string, string]),
    body: 'é'.repeat(20 * MB),
    structuredContent: '{}'.repeat(40_000),
  };
  const cut = boundedFailure(huge);
  assert.equal(cut.headers.length, MAX_HEADERS);
  assert.ok(cut.headers.every(([n, v]) => bytes(n) === MAX_HEADER_VALUE_BYTES && bytes(v) === MAX_HEADER_VALUE_BYTES));
  assert.equal(bytes(cut.body), MAX_BODY_BYTES);
  assert.equal(cut.structuredContent, undefined, 'cut JSON is not JSON: dropped');
  assert.equal(boundedFailure({ ...small, structuredContent: `"${'x'.repeat(MAX_STRUCTURED_BYTES - 2)}"` }).structuredContent?.length, MAX_STRUCTURED_BYTES);
  const empty = boundedOutcome({ tag: 'empty-result', val: 'e'.repeat(100_000) });
  assert.ok(empty.tag === 'empty-result' && empty.val.length === MAX_BODY_BYTES);
  assert.equal(huge.body.length, 20 * MB, 'the caller\'s value is not changed');
});

const toolFailure = (body: string): Failure => ({ kind: { tag: 'tool-error', val: undefined }, headers: [], body });
const toolError = (body: string): Outcome => ({ tag: 'failure', val: toolFailure(body) });

test('a 40 MB tool error, then 20, 10, 5, 2.5 and 1.25 MB, all decide on one instance', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(1n) });
  const policy = instance.loadPolicy({ 'max-attempts-per-call': 100, 'max-retries-per-run': 100, 'max-steps-per-run': 1_000 });
  const run = policy.startRun('huge');
  const admission = run.beginCall({ tool: 'summarize', hints: { readOnly: true } }, 1n);
  assert.equal(admission.tag, 'send');
  const callId = (admission.val as { callId: number }).callId;
  let attempt = 1;
  const fuel: string[] = [];
  for (const size of [40, 20, 10, 5, 2.5, 1.25]) {
    const body = `upstream returned HTTP 503, try again. ${'x'.repeat(size * MB)}`;
    const decision = run.recordOutcome(callId, attempt, toolError(body), 1n, 1n);
    assert.equal(decision.class, 'transient', `${size} MB`);
    assert.ok(decision.action.tag === 'retry', `${size} MB: ${decision.action.tag}`);
    attempt = decision.action.val.attempt;
    fuel.push(`${size} MB ${instance.fuelUsedByLastCall()}`);
    assert.equal(policy.classify(toolFailure(body), 1n).class, 'transient');
  }
  assert.equal(instance.brokenBy, undefined);
  assert.ok(instance.memoryBytes() < 8 << 20, `the guest's memory stayed small: ${instance.memoryBytes()} bytes`);
  console.log(`fuel of record-outcome with a huge tool error (cut to 64 KB): ${fuel.join(', ')}; memory ${instance.memoryBytes()} bytes`);
});

test('5,800 headers of 70 KB decide, and the policy names what it left out', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  const policy = instance.loadPolicy({});
  const headers = Array.from({ length: 5_800 }, (_, i) => [`x-h${i}`, 'v'.repeat(70_000)] as [string, string]);
  headers.unshift(['retry-after', '2']);
  const failure: Failure = { kind: { tag: 'http-status', val: 503 }, headers, body: '' };
  const classification = policy.classify(failure, 1n);
  assert.equal(classification.class, 'transient');
  assert.equal(classification.hintMs, 2000n);
  assert.ok(classification.headerProblems.length > 0, 'the headers left out are named');
  const run = policy.startRun('headers');
  const admission = run.beginCall({ tool: 'lookup', hints: { readOnly: true } }, 1n);
  const decision = run.recordOutcome((admission.val as { callId: number }).callId, 1, { tag: 'failure', val: failure }, 1n, 1n);
  assert.equal(decision.action.tag, 'retry');
  assert.equal(instance.brokenBy, undefined);
  console.log(`fuel of record-outcome with 5,801 headers (cut to 128 of 4 KB): ${instance.fuelUsedByLastCall()}`);
});

test('the MCP wrapper passes a 40 MB tool error cut, and retries it', async () => {
  let sent = 0;
  const fake = {
    listTools: async () => ({ tools: [{ name: 'summarize', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true } }] }),
    callTool: async () => {
      sent += 1;
      if (sent > 1) return { content: [{ type: 'text', text: 'done' }] };
      return { isError: true, content: [{ type: 'text', text: `upstream returned HTTP 503. ${'x'.repeat(40 * MB)}` }], structuredContent: { blob: 'y'.repeat(MB) } };
    },
  } as unknown as Client;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const caller = new RetryingToolCaller(fake, instance.loadPolicy({}).startRun('mcp-huge'), { log: () => undefined, sleep: async () => undefined });
  const result = await caller.callTool('summarize');
  assert.ok(!result.isError);
  assert.equal(sent, 2);
  assert.equal(caller.run.report().retries, 1);
});

test('record-failure\'s headers: limited as a failure\'s, then joined as name: value lines; a CR or LF becomes a space', () => {
  assert.equal(joinedHeaders([]), '');
  assert.equal(joinedHeaders([['Retry-After', '2'], ['x-a', 'b']]), 'Retry-After: 2\nx-a: b');
  assert.equal(joinedHeaders([['x-in\r\njected', 'one\ntwo\rthree']]), 'x-in  jected: one two three');
  const many = Array.from({ length: 5_000 }, (_, i): [string, string] => [`x-${i}`, 'é'.repeat(3_000)]);
  const lines = joinedHeaders(many).split('\n');
  assert.equal(lines.length, MAX_HEADERS);
  assert.equal(lines[0], `x-0: ${'é'.repeat(MAX_HEADER_VALUE_BYTES / 2)}`);
  assert.deepEqual(joinedHeaders(many), joinedHeaders(boundedFailure({ kind: { tag: 'http-status', val: 503 }, headers: many, body: '' }).headers));
});

test('the flat record-failure cuts a 40 MB body, 5,800 headers and oversized structured content as recordOutcome does', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(1n) });
  const policy = instance.loadPolicy({});
  const failure: Failure = {
    kind: { tag: 'http-status', val: 429 },
    headers: [['Retry-After', '7'], ...Array.from({ length: 5_800 }, (_, i): [string, string] => [`x-${i}`, 'v'.repeat(5_000)])],
    body: 'e'.repeat(40 * MB), structuredContent: `"${'s'.repeat(70_000)}"`,
  };
  const rich = policy.startRun('rich');
  const flat = policy.startRun('flat');
  const richId = (rich.beginCall({ tool: 'lookup' }, 1n).val as { callId: number }).callId;
  const flatId = flat.beginCallFlat('lookup', undefined, undefined, 1n).callId;
  const decision = rich.recordOutcome(richId, 1, { tag: 'failure', val: failure }, 1n, 5n);
  const verdict = flat.recordFailure(flatId, 1, failure, 1n, 5n);
  assert.deepEqual([verdict.action, verdict.class, verdict.hintMs], ['retry', 'throttled', 7_000n]);
  // The same decision, words included (its reason names each header value over
  // the 1,024 bytes the policy reads, with its size).
  assert.deepEqual(flat.lastDecision(flatId), decision);
});

// The host-side limits (src/limits.ts, numbers from limits-generated.ts): what crosses into the
// guest is bounded before it crosses, so a 40 MB tool error or 5,800 headers
// cost the policy no more than 64 KB does, and never trap the instance.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';

import type { Observation } from '../src/index.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import {
  MAX_BODY_BYTES, MAX_HEADERS, MAX_HEADER_VALUE_BYTES, MAX_LIFTED_TEXT_BYTES, MAX_STRUCTURED_BYTES, boundedDetail, boundedHeaderText, boundedObservation,
  cutLiftedText, cutUtf8, exceedsUtf8, joinedHeaders,
} from '../src/limits.js';
import * as generated from '../src/limits-generated.js';
import { RetryingToolCaller } from '../src/mcp.js';

const bytes = (text: string) => Buffer.byteLength(text, 'utf8');
const MB = 1_000_000;

test('a text lifted from the policy is cut to MAX_LIFTED_TEXT_BYTES at a character boundary, saying how many bytes went', () => {
  assert.equal(MAX_LIFTED_TEXT_BYTES, 65_536);
  const within = 'x'.repeat(MAX_LIFTED_TEXT_BYTES);
  assert.equal(cutLiftedText(within), within);
  assert.equal(cutLiftedText(`${within}y`), `${within} … [cut: 1 bytes]`);
  // 20 MB of a 3-byte character: 21,845 whole ones kept (65,535 bytes), the rest counted.
  const big = '€'.repeat(20 * MB / 3);
  const cut = cutLiftedText(big);
  assert.equal(cut, `${'€'.repeat(21_845)} … [cut: ${bytes(big) - 65_535} bytes]`);
  assert.equal(cutLiftedText(`${'a'.repeat(MAX_LIFTED_TEXT_BYTES - 1)}😀`), `${'a'.repeat(MAX_LIFTED_TEXT_BYTES - 1)} … [cut: 4 bytes]`);
});

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

test('the limits are the generated mirror of the Rust host\'s limits.rs', () => {
  assert.deepEqual([MAX_BODY_BYTES, MAX_STRUCTURED_BYTES, MAX_HEADERS, MAX_HEADER_VALUE_BYTES],
    [generated.MAX_BODY_BYTES, generated.MAX_STRUCTURED_BYTES, generated.MAX_HEADERS, generated.MAX_HEADER_VALUE_BYTES]);
  assert.deepEqual([generated.MAX_BODY_BYTES, generated.MAX_HEADERS, generated.MAX_ID_BYTES, generated.MAX_CONFIG_BYTES], [65_536, 128, 256, 1 << 20]);
});

const observation = (kind: Observation['kind'], rest: Partial<Observation> = {}): Observation =>
  ({ kind, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'unknown', ...rest });

test('an observation within every limit is passed as it is; a huge one is cut', () => {
  const small = observation({ tag: 'http-status', val: 503 }, { headers: 'a: b', body: 'x' });
  assert.equal(boundedObservation(small), small, 'not copied');
  const huge = observation({ tag: 'tool-error', val: undefined }, {
    headers: Array.from({ length: 5_800 }, (_, i) => `${`h${i}`.padEnd(5_000, 'n')}: ${'v'.repeat(70_000)}`).join('\n'),
    body: 'é'.repeat(20 * MB),
    structuredContent: '{}'.repeat(40_000),
    sessionIdSent: true, delivery: 'answer-started',
  });
  const cut = boundedObservation(huge);
  const lines = cut.headers.split('\n');
  assert.equal(lines.length, MAX_HEADERS);
  assert.ok(lines.every((line) => {
    const [name, value] = [line.slice(0, line.indexOf(':')), line.slice(line.indexOf(':') + 2)];
    return bytes(name) === MAX_HEADER_VALUE_BYTES && bytes(value) === MAX_HEADER_VALUE_BYTES;
  }));
  assert.equal(bytes(cut.body), MAX_BODY_BYTES);
  assert.equal(cut.structuredContent, undefined, 'cut JSON is not JSON: dropped');
  assert.deepEqual([cut.sessionIdSent, cut.delivery, cut.kind], [true, 'answer-started', huge.kind], 'the raw facts are kept');
  assert.equal(boundedObservation({ ...small, structuredContent: `"${'x'.repeat(MAX_STRUCTURED_BYTES - 2)}"` }).structuredContent?.length, MAX_STRUCTURED_BYTES);
  assert.equal(boundedDetail('e'.repeat(100_000)).length, MAX_BODY_BYTES);
  assert.equal(huge.body.length, 20 * MB, 'the caller\'s value is not changed');
  const many = Array.from({ length: 200 }, (_, i) => `x-${i}: ${i}`).join('\n');
  assert.equal(boundedHeaderText(many).split('\n').length, MAX_HEADERS, 'many short lines are cut too');
  assert.equal(boundedHeaderText('a: b\nc: d'), 'a: b\nc: d');
});

const toolFailure = (body: string): Observation => observation({ tag: 'tool-error', val: undefined }, { body, delivery: 'answer-started' });

test('a 40 MB tool error, then 20, 10, 5, 2.5 and 1.25 MB, all decide on one instance', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(1n) });
  const policy = instance.loadPolicy({ 'max-attempts-per-call': 100, 'max-retries-per-run': 100, 'max-steps-per-run': 1_000 });
  const run = policy.startRun('huge');
  const admission = run.beginCall(undefined, 'summarize', undefined, { readOnly: true }, 1n);
  assert.ok(admission.admitted);
  const callId = admission.callId;
  let attempt = 1;
  const fuel: string[] = [];
  for (const size of [40, 20, 10, 5, 2.5, 1.25]) {
    const body = `upstream returned HTTP 503, try again. ${'x'.repeat(size * MB)}`;
    const verdict = run.recordFailure(callId, attempt, toolFailure(body), undefined, 1n, 1n);
    assert.equal(verdict.class, 'transient', `${size} MB`);
    assert.equal(verdict.action, 'retry', `${size} MB`);
    attempt = verdict.attempt + 1;
    fuel.push(`${size} MB ${instance.fuelUsedByLastCall()}`);
    assert.equal(policy.classify(toolFailure(body), 1n).class, 'transient');
  }
  assert.equal(instance.brokenBy, undefined);
  assert.ok(instance.memoryBytes() < 8 << 20, `the guest's memory stayed small: ${instance.memoryBytes()} bytes`);
  console.log(`fuel of record-failure with a huge tool error (cut to 64 KB): ${fuel.join(', ')}; memory ${instance.memoryBytes()} bytes`);
});

test('5,800 headers of 70 KB decide, and the policy names what it left out', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  const policy = instance.loadPolicy({});
  const headers = Array.from({ length: 5_800 }, (_, i) => [`x-h${i}`, 'v'.repeat(70_000)] as [string, string]);
  headers.unshift(['retry-after', '2']);
  const failure = observation({ tag: 'http-status', val: 503 }, { headers: joinedHeaders(headers), delivery: 'answer-started' });
  const classification = policy.classify(failure, 1n);
  assert.equal(classification.class, 'transient');
  assert.equal(classification.hintMs, 2000n);
  assert.ok(classification.headerProblems.length > 0, 'the headers left out are named');
  const run = policy.startRun('headers');
  const admission = run.beginCall(undefined, 'lookup', undefined, { readOnly: true }, 1n);
  assert.equal(run.recordFailure(admission.callId, 1, failure, undefined, 1n, 1n).action, 'retry');
  assert.equal(instance.brokenBy, undefined);
  console.log(`fuel of record-failure with 5,801 headers (cut to 128 of 4 KB): ${instance.fuelUsedByLastCall()}`);
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

test('an observation\'s headers: limited, then joined as name: value lines; a CR or LF becomes a space', () => {
  assert.equal(joinedHeaders([]), '');
  assert.equal(joinedHeaders([['Retry-After', '2'], ['x-a', 'b']]), 'Retry-After: 2\nx-a: b');
  assert.equal(joinedHeaders([['x-in\r\njected', 'one\ntwo\rthree']]), 'x-in  jected: one two three');
  const many = Array.from({ length: 5_000 }, (_, i): [string, string] => [`x-${i}`, 'é'.repeat(3_000)]);
  const lines = joinedHeaders(many).split('\n');
  assert.equal(lines.length, MAX_HEADERS);
  assert.equal(lines[0], `x-0: ${'é'.repeat(MAX_HEADER_VALUE_BYTES / 2)}`);
  assert.equal(boundedHeaderText(joinedHeaders(many)), joinedHeaders(many), 'joined headers are within the limits already');
});

test('record-failure cuts a 40 MB body, 5,800 header lines and oversized structured content, and decides as on the cut value', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(1n) });
  const policy = instance.loadPolicy({});
  const failure = observation({ tag: 'http-status', val: 429 }, {
    headers: ['Retry-After: 7', ...Array.from({ length: 5_800 }, (_, i) => `x-${i}: ${'v'.repeat(5_000)}`)].join('\n'),
    body: 'e'.repeat(40 * MB), structuredContent: `"${'s'.repeat(70_000)}"`, delivery: 'answer-started',
  });
  const huge = policy.startRun('huge');
  const cut = policy.startRun('cut');
  const hugeId = huge.beginCall(undefined, 'lookup', undefined, undefined, 1n).callId;
  const cutId = cut.beginCall(undefined, 'lookup', undefined, undefined, 1n).callId;
  const verdict = huge.recordFailure(hugeId, 1, failure, undefined, 1n, 5n);
  assert.deepEqual([verdict.action, verdict.class, verdict.hintMs], ['retry', 'throttled', 7_000n]);
  // The same decision as on the value cut by hand, words included.
  assert.deepEqual(cut.recordFailure(cutId, 1, boundedObservation(failure), undefined, 1n, 5n), verdict);
  assert.deepEqual(cut.lastDecision(cutId), huge.lastDecision(hugeId));
});

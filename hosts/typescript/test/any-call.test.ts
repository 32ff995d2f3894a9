// `withPolicy` end to end: fetch, the openai client and the @anthropic-ai/sdk
// client (their own retries off) against a local faulty HTTP server, under the
// policy component: 429 with Retry-After, 503 with x-should-retry, 401, a
// refused connection, a timeout; keys, status checks, deadlines, the guard, and
// the metrics against the run report.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallCancelled, CallTimedOut, Escalated, ObservedFailure, ReplanNeeded } from '../src/errors.js';
import type { StatusCheckEvent } from '../src/events.js';
import { RetryMetrics } from '../src/metrics.js';
import { FakeClock, fixedEntropy } from '../src/testing.js';
import { FaultyServer, closedPort } from './faulty-http.js';

let server: FaultyServer;
before(async () => {
  server = await FaultyServer.start();
});
after(async () => {
  await server.stop();
});

const TOOLS = {
  get_quote: { effect: 'read' },
  create_order: { effect: 'write', idempotent: true },
  send_email: { effect: 'write' },
};

let runs = 0;
async function newRun(config: object = { tools: TOOLS }): Promise<Run> {
  runs += 1;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(BigInt(runs)) });
  return instance.loadPolicy(config).startRun(`RUN-ANY-${runs}`);
}

/** A fetch of `path` that returns the parsed JSON of a 2xx answer, and the Response of any other (a failure). */
const getJson = (path: string, init: RequestInit = {}) => async ({ signal }: { signal: AbortSignal }) => {
  const response = await fetch(`${server.url}${path}`, { ...init, signal: init.signal ? AbortSignal.any([init.signal, signal]) : signal });
  return response.ok ? (await response.json() as unknown) : response;
};

test('fetch: a 429 with Retry-After is waited out and retried; the call returns the value', async () => {
  server.script('/quote', { status: 429, headers: { 'retry-after': '2' }, body: '{"error":"slow"}' }, { status: 200, body: '{"price":12}' });
  const run = await newRun();
  const clock = new FakeClock(1_700_000_000_000);
  const metrics = new RetryMetrics();
  const value = await withPolicy(run, 'get_quote', getJson('/quote'), { clock, entropy: fixedEntropy(5), metrics });
  assert.deepEqual(value, { price: 12 });
  assert.equal(server.hits('/quote').length, 2);
  assert.equal(clock.sleeps.length, 1);
  assert.ok(clock.sleeps[0] >= 2000, `waited ${clock.sleeps[0]} ms after Retry-After: 2`);
  const report = run.report();
  assert.equal(report.attempts, 2);
  assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
  assert.equal(metrics.total('agent_retry.waits', { why: 'retry' }), report.waits);
});

test('fetch: a 503 the server says not to retry (x-should-retry: false) is sent once', async () => {
  server.script('/busy', { status: 503, headers: { 'x-should-retry': 'false' }, body: 'busy' });
  const run = await newRun();
  const before = server.hits('/busy').length;
  const error = await withPolicy(run, 'get_quote', getJson('/busy'), { clock: new FakeClock() }).then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof Escalated || error instanceof ReplanNeeded, String(error));
  assert.equal(server.hits('/busy').length - before, 1, 'not retried');
});

test('fetch: a 503 is retried up to the policy\'s attempts, then escalated', async () => {
  server.script('/down', { status: 503, body: 'down' });
  const run = await newRun({ tools: TOOLS, 'max-attempts-per-call': 3 });
  const metrics = new RetryMetrics();
  const before = server.hits('/down').length;
  await assert.rejects(withPolicy(run, 'get_quote', getJson('/down'), { clock: new FakeClock(), metrics }),
    (e: unknown) => e instanceof Escalated && e.reason === 'call-attempts-spent');
  assert.equal(server.hits('/down').length - before, 3);
  assert.equal(metrics.total('agent_retry.attempts'), run.report().attempts);
  assert.equal(metrics.total('agent_retry.escalations', { reason: 'call-attempts-spent' }), 1);
});

test('fetch: a 401 is never repeated as it was', async () => {
  server.script('/private', { status: 401, body: 'who are you' });
  const run = await newRun();
  const before = server.hits('/private').length;
  await assert.rejects(withPolicy(run, 'get_quote', getJson('/private'), { clock: new FakeClock() }),
    (e: unknown) => e instanceof Escalated || e instanceof ReplanNeeded);
  assert.equal(server.hits('/private').length - before, 1);
});

test('fetch: a refused connection is retried (nothing was sent), then succeeds elsewhere', async () => {
  const port = await closedPort();
  const run = await newRun();
  server.script('/fallback', { status: 200, body: '"ok"' });
  const value = await withPolicy(run, 'get_quote', async ({ number, signal }) => {
    const base = number === 1 ? `http://127.0.0.1:${port}` : server.url;
    const response = await fetch(`${base}/fallback`, { signal });
    return response.ok ? (await response.json() as unknown) : response;
  }, { clock: new FakeClock() });
  assert.equal(value, 'ok');
});

test('fetch: a timeout of a keyed write is retried with the same key; an unkeyed one is not resent without a status check', async () => {
  server.script('/orders', { hang: true }, { status: 201, body: '{"id":"o-1"}' });
  const run = await newRun();
  const keys: Array<string | undefined> = [];
  const value = await withPolicy(run, 'create_order', async ({ idempotencyKey, signal }) => {
    keys.push(idempotencyKey);
    const response = await fetch(`${server.url}/orders`, {
      method: 'POST', body: '{}', headers: { 'idempotency-key': idempotencyKey ?? '' }, signal: AbortSignal.any([signal, AbortSignal.timeout(100)]),
    });
    return response.ok ? (await response.json() as unknown) : response;
  }, { clock: new FakeClock() });
  assert.deepEqual(value, { id: 'o-1' });
  const expected = run.instance.deriveIdempotencyKey(run.runId, 'step-1');
  assert.deepEqual(keys, [expected, expected]);
  assert.deepEqual(server.hits('/orders').map((h) => h.headers['idempotency-key']), [expected, expected]);

  // An unkeyed write whose outcome is unknown: a status check first; `unknown` (none given) escalates, nothing resent.
  server.script('/email', { hang: true });
  const checks: StatusCheckEvent[] = [];
  const before = server.hits('/email').length;
  await assert.rejects(withPolicy(run, 'send_email', async ({ signal }) => {
    await fetch(`${server.url}/email`, { method: 'POST', body: 'hi', signal: AbortSignal.any([signal, AbortSignal.timeout(50)]) });
    return 'sent';
  }, { clock: new FakeClock(), hooks: { onStatusCheck: (e) => checks.push(e) } }), (e: unknown) => e instanceof Escalated && e.reason === 'status-unknown');
  assert.equal(server.hits('/email').length - before, 1);
  assert.deepEqual(checks.map((c) => c.result), ['unknown']);

  // The escalation ended the run. In a new one, a status check that reads "absent" lets it be sent again.
  server.script('/email2', { hang: true }, { status: 200, body: '"sent"' });
  const value2 = await withPolicy(await newRun(), 'send_email', async ({ signal }) => {
    const response = await fetch(`${server.url}/email2`, { method: 'POST', body: 'hi', signal: AbortSignal.any([signal, AbortSignal.timeout(50)]) });
    return response.ok ? (await response.json() as unknown) : response;
  }, { clock: new FakeClock(), statusCheck: async () => 'absent' });
  assert.equal(value2, 'sent');
  assert.equal(server.hits('/email2').length, 2);
});

test('the openai client (maxRetries 0): a 429 with Retry-After retried under the policy', async () => {
  server.script('/v1/models/gpt', { status: 429, headers: { 'retry-after': '1' }, body: '{"error":{"message":"slow down"}}' },
    { status: 200, body: '{"id":"gpt","object":"model","created":1,"owned_by":"me"}' });
  const client = new OpenAI({ apiKey: 'test', baseURL: `${server.url}/v1`, maxRetries: 0 });
  const run = await newRun({ tools: { 'openai.models.retrieve': { effect: 'read' } } });
  const clock = new FakeClock();
  const model = await withPolicy(run, 'openai.models.retrieve', ({ signal }) => client.models.retrieve('gpt', { signal }), { clock });
  assert.equal(model.id, 'gpt');
  assert.equal(server.hits('/v1/models/gpt').length, 2);
  assert.ok(clock.sleeps[0] >= 1000);
});

test('the @anthropic-ai/sdk client (maxRetries 0): a 401 escalates at once', async () => {
  server.script('/v1/models/claude-x', { status: 401, body: '{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}' });
  const client = new Anthropic({ apiKey: 'test', baseURL: server.url, maxRetries: 0 });
  const run = await newRun({ tools: { 'anthropic.models.retrieve': { effect: 'read' } } });
  await assert.rejects(withPolicy(run, 'anthropic.models.retrieve', ({ signal }) => client.models.retrieve('claude-x', {}, { signal }), { clock: new FakeClock() }),
    (e: unknown) => e instanceof Escalated || e instanceof ReplanNeeded);
  assert.equal(server.hits('/v1/models/claude-x').length, 1);
});

test('an error no mapping knows is thrown unchanged and the call abandoned', async () => {
  const run = await newRun();
  const bug = new RangeError('a bug in the caller');
  const lines: Array<Record<string, unknown>> = [];
  const metrics = new RetryMetrics();
  await assert.rejects(withPolicy(run, 'get_quote', async () => { throw bug; }, { log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>), metrics }),
    (e: unknown) => e === bug);
  const report = run.report();
  assert.equal(report.abandonedCalls, 1);
  assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
  assert.equal(lines.at(-1)?.action, 'stop');
  // The run goes on: the next call is admitted.
  assert.equal(await withPolicy(run, 'get_quote', async () => 'fine'), 'fine');
});

test('the caller\'s own mapping is tried first; isEmpty reports an empty result', async () => {
  const run = await newRun({ tools: TOOLS, 'max-attempts-per-call': 2 });
  class MyError extends Error {}
  let n = 0;
  const value = await withPolicy(run, 'get_quote', async () => {
    n += 1;
    if (n === 1) throw new MyError('flaky');
    return n === 2 ? [] : ['a'];
  }, {
    clock: new FakeClock(),
    observe: (e) => (e instanceof MyError ? { kind: { tag: 'http-status', val: 503 }, headers: '', body: e.message, sessionIdSent: false, delivery: 'answer-started' } : undefined),
    isEmpty: (v) => (v.length === 0 ? 'no rows' : undefined),
  }).then((v) => v, (e: unknown) => e);
  // 503, then an empty result: what the policy does with the second is its own (retry within 2 attempts, or not).
  assert.ok(Array.isArray(value) || value instanceof Escalated || value instanceof ReplanNeeded, String(value));
  assert.ok(n === 2 || n === 3);
});

test('a deadline stops the call between attempts and tells the run; a cancelled signal stops it at once', async () => {
  server.script('/slow', { hang: true });
  const run = await newRun();
  await assert.rejects(withPolicy(run, 'get_quote', getJson('/slow'), { callTimeoutMs: 100 }),
    (e: unknown) => e instanceof CallTimedOut && e.cause === 'call-timeout' && e.attemptsSent >= 1);
  assert.equal(run.report().abandonedCalls, 1);

  const controller = new AbortController();
  const pending = withPolicy(run, 'get_quote', getJson('/slow'), { signal: controller.signal });
  setTimeout(() => controller.abort(), 30);
  await assert.rejects(pending, (e: unknown) => e instanceof CallCancelled);
  assert.equal(run.report().abandonedCalls, 2);

  // A fake clock's deadline: a wait that would pass it stops the call instead.
  server.script('/down2', { status: 503 });
  const clock = new FakeClock();
  await assert.rejects(withPolicy(run, 'get_quote', getJson('/down2'), { clock, callTimeoutMs: 10 }), (e: unknown) => e instanceof CallTimedOut || e instanceof Escalated);
  assert.ok(clock.nowMs() - Date.UTC(2026, 0, 1) <= 10, 'never waited past the deadline');
});

test('the guard: a policy that retries a 4xx as it is cannot (status-overrides make it retryable, the guard allows it then)', async () => {
  // A 409 the configuration calls transient is retried; the guard reads the same configuration.
  const run = await newRun({ tools: TOOLS, 'status-overrides': { 409: 'transient' }, 'max-attempts-per-call': 2 });
  let n = 0;
  await assert.rejects(withPolicy(run, 'get_quote', async () => {
    n += 1;
    throw new ObservedFailure({ kind: { tag: 'http-status', val: 409 }, headers: '', body: 'conflict', sessionIdSent: false, delivery: 'answer-started' });
  }, { clock: new FakeClock() }), (e: unknown) => e instanceof Escalated && e.policyFailure === undefined);
  assert.equal(n, 2);
});

test('withPolicy checks its options', async () => {
  const run = await newRun();
  await assert.rejects(withPolicy(run, 'get_quote', async () => 1, { callTimeoutMs: -1 }), TypeError);
  await assert.rejects(withPolicy(run, 'get_quote', async () => 1, { callTimeoutMs: Number.NaN }), TypeError);
});

test('an isEmpty that throws is the caller\'s bug: thrown unchanged, the call abandoned', async () => {
  const run = await newRun();
  const bug = new Error('isEmpty bug');
  await assert.rejects(withPolicy(run, 'get_quote', async () => 'x', { isEmpty: () => { throw bug; } }), (e: unknown) => e === bug);
  assert.equal(run.report().abandonedCalls, 1);
  // A thrown non-Error is no mapping's either.
  await assert.rejects(withPolicy(run, 'get_quote', async () => { throw 'a string'; }), (e: unknown) => e === 'a string');
  assert.equal(run.report().abandonedCalls, 2);
});

// The built-in mappings (src/observe-errors.ts) on real errors: what `fetch`,
// the `openai` client and the `@anthropic-ai/sdk` client throw against a local
// faulty HTTP server (their own retries off), translated into observations
// with the status, the headers as received and the body, and nothing decided.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { ObservedFailure } from '../src/errors.js';
import { MAX_BODY_BYTES } from '../src/limits.js';
import { observeError, observeResponse } from '../src/observe-errors.js';
import { FaultyServer, closedPort } from './faulty-http.js';

let server: FaultyServer;
before(async () => {
  server = await FaultyServer.start();
});
after(async () => {
  await server.stop();
});

/** What `promise` rejected with. */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  return assert.fail('it did not reject');
}

test('a Response that is not ok: the status, the headers as received, the body', async () => {
  server.script('/throttled', { status: 429, headers: { 'retry-after': '7', 'x-should-retry': 'true' }, body: '{"error":"slow down"}' });
  const response = await fetch(`${server.url}/throttled`);
  const observation = await observeResponse(response);
  assert.deepEqual(observation.kind, { tag: 'http-status', val: 429 });
  assert.match(observation.headers, /^retry-after: 7$/m);
  assert.match(observation.headers, /^x-should-retry: true$/m);
  assert.equal(observation.body, '{"error":"slow down"}');
  assert.equal(observation.delivery, 'answer-started');
  // A thrown Response is read the same way.
  server.script('/unavailable', { status: 503, body: 'busy' });
  const thrown = await observeError(await fetch(`${server.url}/unavailable`));
  assert.deepEqual(thrown?.kind, { tag: 'http-status', val: 503 });
  assert.equal(thrown?.body, 'busy');
});

test('a huge body is read only up to the limit and cut at a character', async () => {
  const huge = 'é'.repeat(MAX_BODY_BYTES); // 2 bytes each: twice the limit
  server.script('/huge', { status: 500, body: huge });
  const observation = await observeResponse(await fetch(`${server.url}/huge`));
  assert.ok(Buffer.byteLength(observation.body) <= MAX_BODY_BYTES);
  assert.ok(observation.body.length > 0 && /^é+$/.test(observation.body), 'cut at a character boundary');
});

test('fetch: a refused connection was not sent; a destroyed socket is a closed stream; a timeout is a timeout', async () => {
  const refused = observeError(await rejection(fetch(`http://127.0.0.1:${await closedPort()}/x`))) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(refused.kind, { tag: 'transport', val: 'connection-refused' });
  assert.equal(refused.delivery, 'not-sent');
  assert.match(refused.body, /ECONNREFUSED/);

  server.script('/reset', { destroy: true });
  const reset = observeError(await rejection(fetch(`${server.url}/reset`, { method: 'POST', body: 'x' }))) as Awaited<ReturnType<typeof observeResponse>>;
  // undici's "other side closed" (UND_ERR_SOCKET): the stream closed under a request that was written.
  assert.deepEqual(reset.kind, { tag: 'transport', val: 'stream-closed' });
  assert.equal(reset.delivery, 'sent');
  // A reset socket (ECONNRESET, as undici reports it under `fetch failed`) is connection-reset.
  const econnreset = new TypeError('fetch failed', { cause: Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET', syscall: 'read' }) });
  const resetObservation = observeError(econnreset) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(resetObservation.kind, { tag: 'transport', val: 'connection-reset' });
  assert.equal(resetObservation.delivery, 'sent');

  server.script('/hang', { hang: true });
  const timedOut = observeError(await rejection(fetch(`${server.url}/hang`, { signal: AbortSignal.timeout(50) }))) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(timedOut.kind, { tag: 'transport', val: 'timeout' });
});

test('the openai client: APIError with status, headers and body; connection errors; timeouts', async () => {
  server.script('/v1/models/m', { status: 429, headers: { 'retry-after': '3', 'x-request-id': 'req-1' }, body: '{"error":{"message":"Rate limit","type":"requests"}}' });
  const client = new OpenAI({ apiKey: 'test', baseURL: `${server.url}/v1`, maxRetries: 0 });
  const error = await rejection(client.models.retrieve('m'));
  assert.ok(error instanceof OpenAI.RateLimitError);
  const observation = observeError(error) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(observation.kind, { tag: 'http-status', val: 429 });
  assert.match(observation.headers, /^retry-after: 3$/m);
  assert.match(observation.body, /Rate limit/);
  assert.equal(observation.delivery, 'answer-started');

  server.script('/v1/models/text', { status: 401, headers: { 'content-type': 'text/plain' }, body: 'bad key' });
  const unauthorised = observeError(await rejection(client.models.retrieve('text'))) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(unauthorised.kind, { tag: 'http-status', val: 401 });
  assert.equal(unauthorised.body, 'bad key');

  const refusedClient = new OpenAI({ apiKey: 'test', baseURL: `http://127.0.0.1:${await closedPort()}/v1`, maxRetries: 0 });
  const refused = observeError(await rejection(refusedClient.models.retrieve('m'))) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(refused.kind, { tag: 'transport', val: 'connection-refused' });
  assert.equal(refused.delivery, 'not-sent');

  server.script('/v1/models/slow', { hang: true });
  const slowClient = new OpenAI({ apiKey: 'test', baseURL: `${server.url}/v1`, maxRetries: 0, timeout: 50 });
  const timeout = await rejection(slowClient.models.retrieve('slow'));
  assert.ok(timeout instanceof OpenAI.APIConnectionTimeoutError);
  assert.deepEqual((observeError(timeout) as Awaited<ReturnType<typeof observeResponse>>).kind, { tag: 'transport', val: 'timeout' });

  // The caller's own abort is no failure of the call: no mapping claims it.
  const controller = new AbortController();
  controller.abort();
  const aborted = await rejection(client.models.retrieve('m', { signal: controller.signal }));
  assert.ok(aborted instanceof OpenAI.APIUserAbortError);
  assert.equal(observeError(aborted), undefined);
});

test('the @anthropic-ai/sdk client: APIError with status, headers and body; connection errors', async () => {
  server.script('/v1/models/claude', { status: 529, headers: { 'x-should-retry': 'false' }, body: '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}' });
  const client = new Anthropic({ apiKey: 'test', baseURL: server.url, maxRetries: 0 });
  const error = await rejection(client.models.retrieve('claude'));
  assert.ok(error instanceof Anthropic.APIError);
  const observation = observeError(error) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(observation.kind, { tag: 'http-status', val: 529 });
  assert.match(observation.headers, /^x-should-retry: false$/m);
  assert.equal(JSON.parse(observation.body).error.type, 'overloaded_error');

  const refusedClient = new Anthropic({ apiKey: 'test', baseURL: `http://127.0.0.1:${await closedPort()}`, maxRetries: 0 });
  const refused = observeError(await rejection(refusedClient.models.retrieve('claude'))) as Awaited<ReturnType<typeof observeResponse>>;
  assert.deepEqual(refused.kind, { tag: 'transport', val: 'connection-refused' });
  assert.equal(refused.delivery, 'not-sent');
});

test('what no mapping knows stays unknown; an ObservedFailure is its observation', () => {
  assert.equal(observeError(new RangeError('a bug')), undefined);
  assert.equal(observeError('a string'), undefined);
  assert.equal(observeError(null), undefined);
  assert.equal(observeError(new TypeError('x is not a function')), undefined);
  // An object that merely looks like an SDK error (a status, no class of theirs) is not taken for one.
  assert.equal(observeError({ status: 503, headers: {} }), undefined);
  const observation = { kind: { tag: 'tool-error' as const, val: undefined }, headers: '', body: 'b', sessionIdSent: false, delivery: 'sent' as const };
  assert.equal(observeError(new ObservedFailure(observation)), observation);
});

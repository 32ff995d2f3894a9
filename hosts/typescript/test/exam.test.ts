// The exam client's pieces (src/exam.ts): the status check built from an exam's
// spec. The client end to end is run by the judge (`make judge-ts`).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import { statusCheckFromSpec } from '../src/exam.js';

const SPEC = { tool: 'list_notes', arguments: ['order_id'], list: 'notes', match: ['order_id', 'text'] };
const CALL = { order_id: 'J-5', text: 'customer called', idempotency_key: 'ar1-x' };

async function check(answer: CallToolResult | Error, args: Record<string, unknown> = CALL) {
  const calls: Array<{ name: string; arguments?: Record<string, unknown> }> = [];
  const client = {
    callTool: async (params: { name: string; arguments?: Record<string, unknown> }) => {
      calls.push(params);
      if (answer instanceof Error) throw answer;
      return answer;
    },
  } as unknown as Client;
  const found = await statusCheckFromSpec(SPEC)({ client, tool: 'record_note', arguments: args, callId: 1 });
  return { found, calls };
}

const listing = (...items: unknown[]): CallToolResult => ({ content: [], structuredContent: { notes: items } });

test('the read gets only the named arguments, and a matching item is found', async () => {
  const { found, calls } = await check(listing({ order_id: 'J-5', text: 'other' }, { order_id: 'J-5', text: 'customer called' }));
  assert.equal(found, 'found');
  assert.deepEqual(calls, [{ name: 'list_notes', arguments: { order_id: 'J-5' } }]);
});

test('no item matching every field is absent', async () => {
  assert.equal((await check(listing({ order_id: 'J-5', text: 'other' }))).found, 'absent');
  assert.equal((await check(listing())).found, 'absent');
  assert.equal((await check({ content: [], structuredContent: {} })).found, 'absent');
});

test('a failed read is unknown', async () => {
  assert.equal((await check(new Error('down'))).found, 'unknown');
  assert.equal((await check({ content: [{ type: 'text', text: 'down' }], isError: true })).found, 'unknown');
});

// One worker of the cross-host account test (test/redis-accounts.test.ts and
// hosts/python/tests/test_redis_accounts.py; its Python twin is
// hosts/python/tests/accounts_draw.py): connects a `SharedAccounts` to Redis,
// prints `ready`, reads the common start (epoch ms) from stdin, then asks for
// one token at a time (max wait 0) until the end, and prints one JSON line:
// {"host", "grants": [epoch ms of each token granted], "asked", "fallbacks"}.
//
//   ACCOUNTS_DRAW=1 node accounts-draw.js URL ACCOUNT CAPACITY INTERVAL_MS WORKERS DURATION_MS
//
// (ACCOUNTS_DRAW=1 or it does nothing: `node --test dist/test/` loads every file here.)
import { createInterface } from 'node:readline';

import { SharedAccounts } from '../src/redis-accounts.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Opens, trying again twice: a worker booting beside five others on a loaded
 *  2-core machine can miss the 500 ms connect check (what this test is about
 *  is the allowance, not the start-up). */
async function openPatiently(url: string, workers: number): Promise<SharedAccounts> {
  for (let tries = 1; ; tries++) {
    try {
      return await SharedAccounts.open(url, { workers });
    } catch (e) {
      if (tries === 3) throw e;
      await sleep(200);
    }
  }
}

async function main(): Promise<void> {
  const [url, account, capacity, intervalMs, workers, durationMs] = process.argv.slice(2);
  const accounts = await openPatiently(url, Number(workers));
  const bucket = { capacity: Number(capacity), refillIntervalMs: BigInt(intervalMs) };
  process.stdout.write('ready\n');
  const lines = createInterface({ input: process.stdin });
  const start = Number((await lines[Symbol.asyncIterator]().next()).value);
  lines.close();
  process.stdin.destroy();
  const end = start + Number(durationMs);
  while (Date.now() < start) await sleep(1);
  const grants: number[] = [];
  let asked = 0;
  for (let now = Date.now(); now < end; now = Date.now()) {
    asked += 1;
    if (accounts.reserve(account, 1, bucket, 0n, BigInt(now)).granted) grants.push(Date.now());
    await sleep(3);
  }
  process.stdout.write(`${JSON.stringify({ host: 'node', grants, asked, fallbacks: accounts.fallbacks })}\n`);
  accounts.close();
}

if (process.env.ACCOUNTS_DRAW === '1') {
  main().catch((e) => {
    process.stderr.write(`${String((e as Error)?.stack ?? e)}\n`);
    process.exit(2);
  });
}

// The Redis side of `RedisThread` (src/redis-accounts.ts: under `RedisAccounts`
// and `RedisSharedState`), on a worker thread: the component calls the account
// budget and the shared state synchronously and node-redis
// is asynchronous, so the main thread posts each exchange here and blocks on
// `Atomics.wait` until this thread has posted the answer and stored its id in
// the shared flag (or until its deadline).
//
// One connection; exchanges are served one at a time, in order, each within
// the deadline the main thread gave it (its REDIS_TIMEOUT_MS, connecting
// included); a failed exchange drops the connection and the next one
// reconnects. An exchange whose deadline has passed before its turn (the main
// thread has given up on it) is not sent to Redis.
import { parentPort, workerData, type MessagePort } from 'node:worker_threads';

import { ACCOUNTS_REDIS_TIMEOUT_MS, GCRA_LUA } from './redis-scripts.js';

/** What the main thread posts: a command (EVALSHA …) and the script to EVAL if Redis lacks it. */
export interface Exchange {
  id: number;
  /** `Date.now()` after which the main thread no longer waits. */
  deadline: number;
  command: string[];
  script?: string;
}
export type Answer = { id: number; ok: true; reply: unknown } | { id: number; ok: false; reason: string };
export interface WorkerInput {
  url: string;
  flag: Int32Array;
  port: MessagePort;
  /** The scripts the start-up check loads (default: the account budget's GCRA). */
  scripts?: string[];
}
/** Posted on `parentPort` once, after the first connection was tried. */
export type Started = { ok: true } | { ok: false; missing: boolean; reason: string };

type Redis = typeof import('redis');
type Client = ReturnType<Redis['createClient']>;

function describe(e: unknown): string {
  if (e instanceof AggregateError && e.errors.length > 0) return e.errors.map(describe).join('; ');
  return (e as Error)?.message || String(e);
}

async function main(redis: Redis, input: WorkerInput): Promise<void> {
  const { url, flag, port } = input;
  let client: Client | undefined;
  const drop = () => {
    try {
      client?.destroy();
    } catch {
      // already closed
    }
    client = undefined;
  };
  /** `promise`, or a rejection when `deadline` passes (the connection dropped). */
  const within = async <T>(promise: Promise<T>, deadline: number, what: string): Promise<T> => {
    const ms = deadline - Date.now();
    if (ms <= 0) throw new Error(`${what}: no time left of ${ACCOUNTS_REDIS_TIMEOUT_MS} ms`);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ACCOUNTS_REDIS_TIMEOUT_MS} ms`)), ms);
    });
    try {
      return await Promise.race([promise, late]);
    } finally {
      clearTimeout(timer);
    }
  };
  const command = async (args: string[], deadline: number): Promise<unknown> => {
    if (client !== undefined && !client.isReady) drop(); // the server closed it since (restarted, killed)
    if (client === undefined) {
      // No CLIENT SETINFO (disableClientInfo): a paused server would leave its answers unread.
      const fresh = redis.createClient({
        url,
        socket: { connectTimeout: Math.max(1, deadline - Date.now()), reconnectStrategy: false },
        disableOfflineQueue: true,
        disableClientInfo: true,
      });
      fresh.on('error', () => undefined); // reported by the commands' rejections
      client = fresh;
      await within(fresh.connect(), deadline, 'connect');
    }
    return within(client.sendCommand(args), deadline, args[0]);
  };
  const serve = async (exchange: Exchange): Promise<Answer> => {
    if (Date.now() >= exchange.deadline) return { id: exchange.id, ok: false, reason: 'given up before its turn' };
    try {
      try {
        return { id: exchange.id, ok: true, reply: await command(exchange.command, exchange.deadline) };
      } catch (e) {
        if (exchange.script === undefined || !describe(e).startsWith('NOSCRIPT')) throw e;
        return { id: exchange.id, ok: true, reply: await command(['EVAL', exchange.script, ...exchange.command.slice(2)], exchange.deadline) };
      }
    } catch (e) {
      drop(); // possibly broken mid-reply: start afresh next time
      return { id: exchange.id, ok: false, reason: describe(e) };
    }
  };
  let queue = Promise.resolve();
  port.on('message', (exchange: Exchange) => {
    queue = queue.then(async () => {
      port.postMessage(await serve(exchange));
      Atomics.store(flag, 0, exchange.id);
      Atomics.notify(flag, 0);
    });
  });
  // The check `RedisAccounts.connect` (and `RedisSharedState.connect`) makes:
  // the server speaks Redis and runs the scripts.
  const deadline = Date.now() + ACCOUNTS_REDIS_TIMEOUT_MS;
  let started: Started = { ok: true };
  try {
    const pong = await command(['PING'], deadline);
    if (pong !== 'PONG') throw new Error(`PING answered ${JSON.stringify(pong)}`);
    for (const script of input.scripts ?? [GCRA_LUA]) await command(['SCRIPT', 'LOAD', script], deadline);
  } catch (e) {
    drop();
    started = { ok: false, missing: false, reason: describe(e) };
  }
  parentPort?.postMessage(started);
}

if (parentPort !== null && workerData?.flag instanceof Int32Array) {
  const input = workerData as WorkerInput;
  import('redis').then(
    (redis) => main(redis, input),
    (e: unknown) => parentPort?.postMessage({ ok: false, missing: true, reason: describe(e) } satisfies Started),
  );
}

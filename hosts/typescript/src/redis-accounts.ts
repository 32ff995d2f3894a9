// The account budget on Redis, for workers in several processes or on several
// machines: the Rust host's `RedisAccounts` and `SharedAccounts`
// (hosts/rust/src/accounts/redis.rs, shared.rs), with the same script, keys,
// timeout, fallback and log fields, so that Rust, Python and Node workers draw
// on one bucket per account.
//
// - `RedisAccounts`: the GCRA run atomically on the server by one Lua script,
//   on the server's clock (src/redis-scripts.ts, generated from the Rust
//   source). A key of another type is repaired to an empty bucket and logged; a
//   key that is gone while this process last saw a later TAT (a restart without
//   persistence, FLUSHALL) is re-created from that TAT. Every exchange,
//   connecting included, ends within ACCOUNTS_REDIS_TIMEOUT_MS (500 ms).
// - `SharedAccounts`: the backend to instantiate with. Redis while it answers;
//   while it does not, this worker's share of the allowance (capacity ÷
//   workers, refill ÷ workers), logged once, Redis tried again every
//   `retryIntervalMs`, and the tokens taken locally charged to Redis when it
//   answers again.
//
// The component calls the account budget synchronously, and node-redis is
// asynchronous: node-redis runs on a worker thread (src/redis-accounts-worker.ts)
// and each exchange blocks this thread on `Atomics.wait` until the worker has
// answered, at most ACCOUNTS_REDIS_TIMEOUT_MS. While Redis is slow, the whole
// thread waits (up to that bound), as a synchronous import must.
import { createHash } from 'node:crypto';
import { MessageChannel, Worker, receiveMessageOnPort, type MessagePort } from 'node:worker_threads';

import { EmbeddedAccounts, U64_MAX, type AccountBudgetBackend, type Bucket, type Reservation } from './accounts.js';
import { AgentRetryError } from './errors.js';
import { ACCOUNTS_REDIS_TIMEOUT_MS, ACCOUNTS_RETRY_INTERVAL_MS, ACCOUNT_PREFIX, GCRA_LUA, REFUND_LUA } from './redis-scripts.js';
import type { Answer, Exchange, Started, WorkerInput } from './redis-accounts-worker.js';

export { ACCOUNTS_REDIS_TIMEOUT_MS, ACCOUNTS_RETRY_INTERVAL_MS, ACCOUNT_PREFIX };

/** Redis cannot be used for the account budget: `bad-url` (not a Redis URL)
 *  or `unreachable` (no answer in time, or not Redis). */
export class AccountsError extends AgentRetryError {
  /** `subject`: what the Redis is for, in the message (the shared state's errors are this class too, as in the Rust host). */
  constructor(readonly kind: 'bad-url' | 'unreachable', readonly url: string, readonly reason: string, subject = 'account budget') {
    super(kind === 'bad-url' ? `${subject}: ${JSON.stringify(url)} is not a redis:// URL: ${reason}` : `${subject}: Redis at ${url} is unusable: ${reason}`);
  }
}

/** What the Redis backend logs: a repaired key (`error`), the fallback to the
 *  local share and the return to Redis (`warning`). The fields are the Rust host's. */
export interface AccountBudgetEvent {
  event: 'agent_retry.account_budget';
  level: 'error' | 'warning';
  message: string;
  redis: string;
  key?: string;
  reason?: string;
  workers?: number;
  charged?: number;
}

export interface RedisAccountsOptions {
  /** The keys' prefix (`ACCOUNT_PREFIX`, the Rust and Python hosts' too). */
  prefix?: string;
  /** Receives the events (default: one JSON line through `console.warn`). */
  log?: (event: AccountBudgetEvent) => void;
}

export interface SharedAccountsOptions {
  /** How often to try Redis again while on the local share (ACCOUNTS_RETRY_INTERVAL_MS). */
  retryIntervalMs?: number;
  log?: (event: AccountBudgetEvent) => void;
}

const defaultLog = (event: AccountBudgetEvent): void => console.warn(JSON.stringify(event));
/** Gives `log` the event with the backend's URL as `redis`; a failing logger must not fail the reservation. */
function emit(log: (event: AccountBudgetEvent) => void, redis: string, fields: Omit<AccountBudgetEvent, 'event' | 'redis'>): void {
  try {
    log({ event: 'agent_retry.account_budget', redis, ...fields });
  } catch {
    // ignored
  }
}
/** The server's clock in ms, read once on connecting (the scripts read it on every take). */
const CLOCK_LUA = "local t = redis.call('TIME') return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)";
const sha1 = (text: string) => createHash('sha1').update(text).digest('hex');
const big = (value: unknown): bigint => {
  if (typeof value !== 'number' || !Number.isFinite(value)) throw new TypeError(`not a number: ${String(value)}`);
  return BigInt(Math.trunc(value));
};

/** A worker thread holding one Redis connection (node-redis), and the
 *  synchronous exchange with it: the mechanism under `RedisAccounts` and
 *  `RedisSharedState` (src/redis-shared-state.ts). Each exchange blocks this
 *  thread on `Atomics.wait` until its answer, at most ACCOUNTS_REDIS_TIMEOUT_MS.
 *  @internal */
export class RedisThread {
  readonly url: string;
  readonly #subject: string;
  readonly #worker: Worker;
  readonly #port: MessagePort;
  readonly #flag: Int32Array;
  #next = 0;
  /** Why exchanges fail at once: closed, or the worker thread ended. */
  #closed: string | undefined;

  private constructor(url: string, subject: string, worker: Worker, port: MessagePort, flag: Int32Array) {
    this.url = url;
    this.#subject = subject;
    this.#worker = worker;
    this.#port = port;
    this.#flag = flag;
    worker.on('error', (e) => (this.#closed ??= `the Redis worker thread failed: ${e.message}`));
    worker.on('exit', (code) => (this.#closed ??= `the Redis worker thread exited (${code})`));
  }

  /** Starts the thread, which connects, checks that the server speaks Redis
   *  (PING) and loads `scripts`: a bad URL, a closed port or a server answering
   *  garbage rejects with an `AccountsError` (its message naming `subject`)
   *  within ACCOUNTS_REDIS_TIMEOUT_MS of the connection, not a hang later. */
  static async start(url: string, scripts: string[], subject: string): Promise<RedisThread> {
    let protocol: string;
    try {
      protocol = new URL(url).protocol;
    } catch (e) {
      throw new AccountsError('bad-url', url, (e as Error).message, subject);
    }
    if (protocol !== 'redis:' && protocol !== 'rediss:') throw new AccountsError('bad-url', url, `the scheme is ${protocol}, not redis: or rediss:`, subject);
    const flag = new Int32Array(new SharedArrayBuffer(4));
    const { port1, port2 } = new MessageChannel();
    const input: WorkerInput = { url, flag, port: port2, scripts };
    const worker = new Worker(new URL('./redis-accounts-worker.js', import.meta.url), { workerData: input, transferList: [port2] });
    const started = await new Promise<Started>((resolve) => {
      worker.once('message', resolve);
      worker.once('error', (e) => resolve({ ok: false, missing: false, reason: `the Redis worker thread failed: ${e.message}` }));
      worker.once('exit', (code) => resolve({ ok: false, missing: false, reason: `the Redis worker thread exited (${code})` }));
    });
    if (!started.ok) {
      await worker.terminate();
      if (started.missing) {
        throw new AgentRetryError(`the ${subject} on Redis needs the npm package \`redis\` (node-redis 5): npm install redis@^5.9.0 (${started.reason})`);
      }
      throw new AccountsError('unreachable', url, started.reason, subject);
    }
    worker.unref();
    port1.unref();
    return new RedisThread(url, subject, worker, port1, flag);
  }

  /** Ends the worker thread; later exchanges fail at once. */
  close(): void {
    if (this.#closed !== undefined) return;
    this.#closed = 'closed';
    this.#port.close();
    void this.#worker.terminate();
  }

  /** One exchange through the worker thread, this thread blocked until its
   *  answer or ACCOUNTS_REDIS_TIMEOUT_MS: `EVALSHA` of `script` (EVAL if the
   *  server lacks it) on `key` with `args`. Throws `AccountsError` ("unreachable"). */
  evaluate(script: string, key: string, args: string[]): unknown {
    if (this.#closed !== undefined) throw new AccountsError('unreachable', this.url, this.#closed, this.#subject);
    const id = (this.#next = (this.#next % 0x7fff_ffff) + 1);
    const until = performance.now() + ACCOUNTS_REDIS_TIMEOUT_MS;
    const exchange: Exchange = { id, deadline: Date.now() + ACCOUNTS_REDIS_TIMEOUT_MS, command: ['EVALSHA', sha1(script), '1', key, ...args], script };
    this.#port.postMessage(exchange);
    for (;;) {
      const seen = Atomics.load(this.#flag, 0);
      if (seen === id) break;
      const left = until - performance.now();
      if (left <= 0) throw new AccountsError('unreachable', this.url, `no answer within ${ACCOUNTS_REDIS_TIMEOUT_MS} ms`, this.#subject);
      Atomics.wait(this.#flag, 0, seen, left);
    }
    // Answers come in order; those of exchanges given up on earlier are skipped.
    for (let received = receiveMessageOnPort(this.#port); received !== undefined; received = receiveMessageOnPort(this.#port)) {
      const answer = received.message as Answer;
      if (answer.id !== id) continue;
      if (!answer.ok) throw new AccountsError('unreachable', this.url, answer.reason, this.#subject);
      return answer.reply;
    }
    throw new AccountsError('unreachable', this.url, 'the worker thread stored an answer it did not post', this.#subject);
  }
}

/** A connection to Redis holding the buckets, on a worker thread of its own. */
export class RedisAccounts {
  readonly url: string;
  readonly prefix: string;
  readonly #log: (event: AccountBudgetEvent) => void;
  readonly #thread: RedisThread;
  /** Per account, the latest TAT this process saw on the server: the floor a lost key is re-created from. */
  readonly #seenTats = new Map<string, bigint>();
  /** Per account, how far the schedule was ahead of the server's clock at the latest exchange. */
  readonly #seenBacklogs = new Map<string, bigint>();
  #repairs = 0;
  /** The server's clock minus this process's wall clock, in ms, as last measured. */
  #serverOffsetMs: bigint | undefined;

  private constructor(thread: RedisThread, prefix: string, log: (event: AccountBudgetEvent) => void) {
    this.url = thread.url;
    this.prefix = prefix;
    this.#log = log;
    this.#thread = thread;
  }

  /** Connects and checks that the server speaks Redis and runs the script:
   *  a bad URL, a closed port or a server answering garbage rejects with an
   *  `AccountsError` here, within ACCOUNTS_REDIS_TIMEOUT_MS, not a hang later. */
  static async connect(url: string, options: RedisAccountsOptions = {}): Promise<RedisAccounts> {
    const thread = await RedisThread.start(url, [GCRA_LUA], 'account budget');
    const accounts = new RedisAccounts(thread, options.prefix ?? ACCOUNT_PREFIX, options.log ?? defaultLog);
    try {
      accounts.#measured(big(accounts.#exchange(CLOCK_LUA, accounts.prefix, [])));
    } catch (e) {
      accounts.close();
      throw e instanceof AccountsError ? e : new AccountsError('unreachable', url, `TIME: ${(e as Error).message}`);
    }
    return accounts;
  }

  /** Keys of another type or values not a number repaired so far (each also logged). */
  get repairs(): number {
    return this.#repairs;
  }

  /** Ends the worker thread; later exchanges fail at once. */
  close(): void {
    this.#thread.close();
  }

  /** Keeps the server's clock, read at `serverNowMs`, against this process's. */
  #measured(serverNowMs: bigint): void {
    this.#serverOffsetMs = serverNowMs - BigInt(Date.now());
  }

  /** The server's time past which an exchange that must end `leftMs` from now
   *  is no longer awaited; 0 before the server's clock was measured. The same
   *  rule as the Rust host's `not_after_ms`. */
  #notAfterMs(leftMs: number): bigint {
    if (this.#serverOffsetMs === undefined) return 0n;
    return BigInt(Date.now()) + this.#serverOffsetMs + BigInt(Math.max(0, Math.floor(leftMs)));
  }

  /** One exchange through the worker thread, this thread blocked until its
   *  answer or ACCOUNTS_REDIS_TIMEOUT_MS. A script's last argument is the
   *  server's time past which it must take nothing (its client gave up).
   *  Throws `AccountsError` ("unreachable"). */
  #exchange(script: string, key: string, args: string[]): unknown {
    if (script !== CLOCK_LUA) args = [...args, String(this.#notAfterMs(ACCOUNTS_REDIS_TIMEOUT_MS))];
    return this.#thread.evaluate(script, key, args);
  }

  /** The take-or-wait, on the server, within ACCOUNTS_REDIS_TIMEOUT_MS in all.
   *  Throws `AccountsError` when Redis failed: the caller decides what to do
   *  (see `SharedAccounts`). */
  tryReserve(accountId: string, tokens: number, bucket: Bucket, maxWaitMs: bigint): Reservation {
    const floor = this.#seenTats.get(accountId) ?? 0n;
    const key = `${this.prefix}${accountId}`;
    const reply = this.#exchange(GCRA_LUA, key, [tokens, bucket.capacity, bucket.refillIntervalMs, maxWaitMs, floor].map(String));
    let granted: bigint, wait: bigint, repaired: bigint, tat: bigint, serverNow: bigint;
    try {
      if (!Array.isArray(reply) || reply.length !== 5) throw new TypeError(`the script answered ${JSON.stringify(reply)}`);
      [granted, wait, repaired, tat, serverNow] = reply.map(big);
    } catch (e) {
      throw new AccountsError('unreachable', this.url, (e as Error).message);
    }
    if (serverNow > 0n) this.#measured(serverNow); // 0: a take of 0 tokens, answered without reading the clock
    if (granted === -1n) {
      throw new AccountsError('unreachable', this.url, `the take reached Redis after its deadline (${ACCOUNTS_REDIS_TIMEOUT_MS} ms): nothing was taken`);
    }
    if (repaired === 1n) {
      this.#repairs += 1;
      emit(this.#log, this.url, {
        level: 'error', key,
        message: "account budget: the account's key held something other than a number (another program's key, an operator's mistake); " +
          'replaced with an empty bucket, so the allowance holds',
      });
    }
    if (tat > 0n) {
      const seen = this.#seenTats.get(accountId) ?? 0n;
      this.#seenTats.set(accountId, tat > seen ? tat : seen);
      this.#seenBacklogs.set(accountId, tat > serverNow ? tat - serverNow : 0n);
    }
    return { granted: granted === 1n, waitMs: wait > 0n ? wait : 0n };
  }

  /** How far ahead of the server's clock the account's schedule was at this
   *  process's latest exchange, in ms (0 if never seen). */
  lastSeenBacklogMs(accountId: string): bigint {
    return this.#seenBacklogs.get(accountId) ?? 0n;
  }

  /** Gives tokens back, on the server. Throws `AccountsError` when Redis failed. */
  tryRefund(accountId: string, tokens: number, bucket: Bucket): void {
    this.#exchange(REFUND_LUA, `${this.prefix}${accountId}`, [String(tokens), String(bucket.refillIntervalMs)]);
    // A refund moves the TAT back: the floor this process remembers moves with it.
    const seen = this.#seenTats.get(accountId);
    if (seen !== undefined) {
      const back = BigInt(tokens) * bucket.refillIntervalMs;
      this.#seenTats.set(accountId, seen > back ? seen - back : 0n);
    }
  }
}

/** The account budget for workers on many machines (an `AccountBudgetBackend`
 *  for `component.instantiate({ accounts })`): Redis while it answers, a local
 *  share of the allowance while it does not. `workers`: how many workers share
 *  the account (the local share is 1/workers of it). Every reservation is
 *  answered by exactly one backend. */
export class SharedAccounts implements AccountBudgetBackend {
  readonly redis: RedisAccounts;
  readonly workers: number;
  readonly retryIntervalMs: number;
  readonly #log: (event: AccountBudgetEvent) => void;
  readonly #local = new EmbeddedAccounts();
  /** undefined: on Redis; else on the local share, Redis tried again after this `performance.now()`. */
  #retryAt: number | undefined;
  /** Per account, tokens taken on the local share since the fallback, and the
   *  account's (whole) bucket: charged to Redis when it answers again. */
  readonly #takenLocally = new Map<string, { tokens: bigint; bucket: Bucket }>();
  #fallbacks = 0;
  #recoveries = 0;

  constructor(redis: RedisAccounts, workers: number, options: SharedAccountsOptions = {}) {
    this.redis = redis;
    this.workers = Math.max(1, Math.floor(workers));
    this.retryIntervalMs = options.retryIntervalMs ?? ACCOUNTS_RETRY_INTERVAL_MS;
    this.#log = options.log ?? defaultLog;
  }

  /** `new SharedAccounts(await RedisAccounts.connect(url, { prefix, log }), workers, { retryIntervalMs, log })`. */
  static async open(url: string, options: { workers: number; prefix?: string } & SharedAccountsOptions): Promise<SharedAccounts> {
    return new SharedAccounts(await RedisAccounts.connect(url, options), options.workers, options);
  }

  /** Switches to the local share so far. */
  get fallbacks(): number {
    return this.#fallbacks;
  }

  /** Returns to Redis so far. */
  get recoveries(): number {
    return this.#recoveries;
  }

  /** This worker's share of the bucket. */
  localShare(bucket: Bucket): Bucket {
    const interval = bucket.refillIntervalMs * BigInt(this.workers);
    return { capacity: Math.max(1, Math.floor(bucket.capacity / this.workers)), refillIntervalMs: interval < U64_MAX ? interval : U64_MAX };
  }

  close(): void {
    this.redis.close();
  }

  /** Takes from the shared bucket, whatever the wait, the tokens this worker
   *  took on its local share while Redis was away. Throws when Redis failed;
   *  what was not charged stays owed for the next try. */
  #chargeLocalTakes(): bigint {
    let charged = 0n;
    for (const [accountId, { tokens, bucket }] of [...this.#takenLocally]) {
      const owed = tokens < 0xffff_ffffn ? tokens : 0xffff_ffffn;
      if (owed > 0n) this.redis.tryReserve(accountId, Number(owed), bucket, U64_MAX);
      // Charged, but kept (at 0) until the return succeeds: the Rust host
      // removes it here, so a failed retry made the next local reservation
      // fill the share again, every retry interval.
      this.#takenLocally.set(accountId, { tokens: 0n, bucket });
      charged += owed;
    }
    return charged;
  }

  reserve(accountId: string, tokens: number, bucket: Bucket, maxWaitMs: bigint, nowMs: bigint): Reservation {
    const recovering = this.#retryAt !== undefined;
    if (this.#retryAt === undefined || performance.now() >= this.#retryAt) {
      try {
        // Back on Redis, the local takes are charged first, so that this
        // reservation (and the other workers') sees a bucket that holds them.
        const charged = recovering ? this.#chargeLocalTakes() : 0n;
        const reservation = this.redis.tryReserve(accountId, tokens, bucket, maxWaitMs);
        if (recovering) {
          this.#takenLocally.clear();
          this.#retryAt = undefined;
          this.#recoveries += 1;
          emit(this.#log, this.redis.url, {
            level: 'warning', charged: Number(charged),
            message: 'account budget: Redis answers again; back to the shared bucket, charged with the tokens taken locally meanwhile',
          });
        }
        return reservation;
      } catch (e) {
        if (!(e instanceof AccountsError)) throw e;
        if (this.#retryAt === undefined) {
          this.#fallbacks += 1;
          emit(this.#log, this.redis.url, {
            level: 'warning', reason: e.reason, workers: this.workers,
            message: "account budget: Redis unavailable; using this worker's local share until it answers",
          });
        }
        this.#retryAt = performance.now() + this.retryIntervalMs;
      }
    }
    const share = this.localShare(bucket);
    if (!this.#takenLocally.has(accountId)) {
      // The first local reservation of this account since the fallback. The
      // share starts empty, not full (the shared bucket was being drawn on until
      // now), and behind the shared schedule as last seen: the calls Redis
      // granted before it failed, to any worker, are still to come.
      const interval = share.refillIntervalMs > 0n ? share.refillIntervalMs : 1n;
      const behind = (this.redis.lastSeenBacklogMs(accountId) + interval - 1n) / interval;
      const owed = behind < BigInt(share.capacity) ? BigInt(share.capacity) : behind < 0xffff_ffffn ? behind : 0xffff_ffffn;
      this.#local.reserve(accountId, Number(owed), share, U64_MAX, nowMs);
      this.#takenLocally.set(accountId, { tokens: 0n, bucket });
    }
    const reservation = this.#local.reserve(accountId, tokens, share, maxWaitMs, nowMs);
    const entry = this.#takenLocally.get(accountId)!;
    if (reservation.granted) this.#takenLocally.set(accountId, { tokens: entry.tokens + BigInt(tokens), bucket });
    return reservation;
  }

  /** A refund goes where reservations go now: to Redis, or to the local share. */
  refund(accountId: string, tokens: number, bucket: Bucket, nowMs: bigint): void {
    if (this.#retryAt === undefined) {
      try {
        this.redis.tryRefund(accountId, tokens, bucket);
        return;
      } catch (e) {
        if (!(e instanceof AccountsError)) throw e;
      }
    }
    this.#local.refund(accountId, tokens, this.localShare(bucket), nowMs);
  }
}

// Helpers for tests of code that runs under the policy: a clock whose waits
// take no time, jitter entropy that replays (SplitMix64 from a seed, the
// same sequence in every host), and the demo MCP server with a fault script.
import { spawn } from 'node:child_process';
import { accessSync, constants, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { SplitMix64, type EntropySource } from './entropy.js';

/** A fake clock: `nowMs()` is `startMs` plus every wait so far; `sleep(ms)`
 *  moves it at once and records the wait. Give it as `withPolicy`'s `clock`. */
export class FakeClock {
  private now: number;
  /** Every wait asked for, in ms, in order. */
  readonly sleeps: number[] = [];

  constructor(startMs: number = Date.UTC(2026, 0, 1)) {
    if (!Number.isSafeInteger(startMs) || startMs < 0) throw new RangeError(`startMs must be a non-negative integer of ms, not ${startMs}`);
    this.now = startMs;
  }

  nowMs(): number {
    return this.now;
  }

  async sleep(ms: number): Promise<void> {
    const wait = Number.isFinite(ms) && ms > 0 ? Math.floor(ms) : 0;
    this.sleeps.push(wait);
    this.now += wait;
  }

  /** Moves the clock without a wait (time passing elsewhere). */
  advance(ms: number): void {
    if (Number.isFinite(ms) && ms > 0) this.now += Math.floor(ms);
  }
}

/** Jitter entropy that replays: SplitMix64 from `seed` (a u64). */
export function fixedEntropy(seed: number | bigint): EntropySource {
  return new SplitMix64(BigInt(seed));
}

/** A fault script's rule (demo-server/src/faults.rs): the Nth matching call
 *  (`call`), the first N (`first`), or every matching call. */
export interface DemoFaultRule {
  tool: string;
  when?: Record<string, unknown>;
  call?: number;
  first?: number;
  fault: Record<string, unknown> & { kind: string };
}

export interface DemoServerOptions {
  /** The fault script: its rules, or the path of a JSON file of them (default: none). */
  faults?: readonly DemoFaultRule[] | string;
  /** The `agent-retry` binary (default: $AGENT_RETRY_BIN, else `agent-retry` on
   *  PATH, else the repository's target/release/agent-retry). */
  binary?: string;
  /** More flags for `agent-retry serve` (`--era modern`, `--ledger FILE`, ...). */
  args?: readonly string[];
  /** How long to wait for the server to say where it listens (default 20 s). */
  startTimeoutMs?: number;
}

/** A running demo server: its MCP URL, and `close()` (also `await using`). */
export interface RunningDemoServer {
  url: string;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** The `agent-retry` binary the options name, or the first found. */
export function demoServerBinary(binary?: string): string {
  if (binary !== undefined) return binary;
  const fromEnv = process.env.AGENT_RETRY_BIN;
  if (fromEnv) return fromEnv;
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    const candidate = dir && join(dir, 'agent-retry');
    if (candidate && isExecutable(candidate)) return candidate;
  }
  // This file is dist/src/testing.js in hosts/typescript of the repository.
  return resolve(dirname(fileURLToPath(import.meta.url)), '../../../../target/release/agent-retry');
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** Starts the demo MCP server (`agent-retry serve --http 127.0.0.1:0`: a free
 *  port the server picks) with a fault script, for a node:test test:
 *
 *    const server = await startDemoServer({ faults: [{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 503 } }] });
 *    after(() => server.close());
 *    const caller = new RetryingToolCaller(McpConnection.http(server.url), run);
 *
 *  Resolves once it printed "demo MCP server at URL" on stderr; rejects if
 *  the binary is missing, or it exits or says nothing in time. */
export async function startDemoServer(options: DemoServerOptions = {}): Promise<RunningDemoServer> {
  const binary = demoServerBinary(options.binary);
  if (!isExecutable(binary)) {
    throw new Error(`no agent-retry binary at ${binary}: pass { binary }, set AGENT_RETRY_BIN, put agent-retry on PATH, `
      + 'or build it (cargo build --release -p agent-retry-cli --bin agent-retry)');
  }
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-demo-'));
  const args = ['serve', '--http', '127.0.0.1:0'];
  const faults = options.faults;
  if (typeof faults === 'string') {
    args.push('--faults', faults);
  } else if (faults !== undefined) {
    writeFileSync(join(dir, 'faults.json'), JSON.stringify(faults));
    args.push('--faults', join(dir, 'faults.json'));
  }
  args.push(...(options.args ?? []));
  const child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const close = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((done) => child.once('exit', done));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
      await gone;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const said: string[] = [];
  try {
    const url = await new Promise<string>((found, fail) => {
      const limit = options.startTimeoutMs ?? 20_000;
      const timer = setTimeout(() => fail(new Error(`the demo server said no URL in ${limit} ms: ${said.join('\n')}`)), limit);
      child.once('error', (e) => { clearTimeout(timer); fail(e); });
      child.once('exit', (code) => { clearTimeout(timer); fail(new Error(`the demo server exited (${code}): ${said.join('\n')}`)); });
      createInterface({ input: child.stderr as NodeJS.ReadableStream }).on('line', (line) => {
        said.push(line);
        const at = /demo MCP server at (\S+)/.exec(line);
        if (at) {
          clearTimeout(timer);
          found(at[1]);
        }
      });
    });
    return { url, close, [Symbol.asyncDispose]: close };
  } catch (e) {
    await close();
    throw e;
  }
}

// The one MCP server of the host's tests: the demo server (demo-server/, run as
// `target/release/agent-retry serve --http 127.0.0.1:0 ...`). `DemoServer.start`
// starts it with a fault script (the rules of demo-server/src/faults.rs), a
// ledger file and any other flags, and reads its URL from the line it prints on
// stderr; `ledger()` reads what it applied; `stop()` ends it. The binary is
// built by `make judge-setup`; without it a test fails, it does not skip.
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** The repository's root: this file runs from hosts/typescript/dist/test. */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');
/** The demo server's binary: $AGENT_RETRY_CLI, else the repository's release build. */
export const CLI = process.env.AGENT_RETRY_CLI ?? join(ROOT, 'target/release/agent-retry');

/** A fault of the script (demo-server/src/faults.rs `Fault`). */
export type Fault =
  | { kind: 'http'; status: number; headers?: Array<[string, string]>; body?: string }
  | { kind: 'json-rpc-error'; code: number; message: string; data?: unknown }
  | { kind: 'tool-error'; status?: number; message: string }
  | { kind: 'tool-text'; text: string; structured?: unknown }
  | { kind: 'empty' }
  | { kind: 'drop' }
  | { kind: 'timeout-after-apply'; 'delay-ms': number };

/** A rule of the script: `call` (the Nth matching call), `first` (the first N), or every matching call. */
export interface FaultRule { tool: string; when?: Record<string, unknown>; call?: number; first?: number; fault: Fault }

/** What the server applied (demo-server/src/ledger.rs). */
export interface Ledger {
  refunds: Array<{ refund_id: string; order_id: string; amount_paise: number; idempotency_key: string | null }>;
  notes: Array<{ order_id: string; text: string }>;
  assets: Record<string, string>;
  uploads: Record<string, number>;
  /** `archive_orders` runs (a task). */
  archives: Array<{ archive_id: string; before: string }>;
  /** Every round of `confirm_order` (an MRTR continuation). */
  confirmations: Array<{ order_id: string; request_state: string | null; outcome: 'asked' | 'confirmed' | 'declined' }>;
  /** Every `export_report` run: the progress notifications it sent, whether it finished. */
  reports: Array<{ report_id: string; seconds: number; progress_token: unknown; notifications: number; finished: boolean }>;
  /** The task ids of every `tasks/cancel` the server received. */
  cancelled_tasks: string[];
}

/** Fails the test (never skips it) when the binary is missing or its `serve` lacks one of `flags`. */
export function requireDemo(...flags: string[]): void {
  assert.ok(existsSync(CLI), `missing ${CLI}: cargo build --release -p agent-retry-cli --bin agent-retry (make judge-setup)`);
  if (flags.length === 0) return;
  const help = spawnSync(CLI, ['serve', '--help'], { encoding: 'utf8' });
  const text = `${help.stdout}${help.stderr}`;
  for (const flag of flags) assert.ok(text.includes(flag), `agent-retry serve has no ${flag}: rebuild it`);
}

export interface DemoOptions {
  /** The fault script. */
  faults?: FaultRule[];
  /** Keep the ledger in a file, for `ledger()`. */
  ledger?: boolean;
  /** More flags for `agent-retry serve` (`--era modern`, `--sessions`, ...). */
  args?: string[];
  /** Flags the binary must know. */
  require?: string[];
}

/** `agent-retry serve --http 127.0.0.1:0 [--faults F] [--ledger L] ARGS`. */
export class DemoServer {
  private constructor(readonly url: string, private readonly child: ChildProcess, private readonly dir: string,
    private readonly ledgerPath: string | undefined) {}

  static async start(options: DemoOptions = {}): Promise<DemoServer> {
    requireDemo(...(options.require ?? []));
    const dir = mkdtempSync(join(tmpdir(), 'agent-retry-demo-'));
    const args = ['serve', '--http', '127.0.0.1:0'];
    if (options.faults) {
      writeFileSync(join(dir, 'faults.json'), JSON.stringify(options.faults));
      args.push('--faults', join(dir, 'faults.json'));
    }
    const ledgerPath = options.ledger ? join(dir, 'ledger.json') : undefined;
    if (ledgerPath) args.push('--ledger', ledgerPath);
    args.push(...(options.args ?? []));
    const child = spawn(CLI, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    const said: string[] = [];
    try {
      const url = await new Promise<string>((resolveUrl, reject) => {
        const timer = setTimeout(() => reject(new Error(`the demo server printed no URL in 20 s: ${said.join('\n')}`)), 20_000);
        createInterface({ input: child.stderr! }).on('line', (line) => {
          said.push(line);
          const found = /demo MCP server at (\S+)/.exec(line);
          if (found) {
            clearTimeout(timer);
            resolveUrl(found[1]);
          }
        });
        child.once('exit', (code) => {
          clearTimeout(timer);
          reject(new Error(`the demo server exited (${code}): ${said.join('\n')}`));
        });
      });
      return new DemoServer(url, child, dir, ledgerPath);
    } catch (e) {
      await new DemoServer('', child, dir, ledgerPath).stop();
      throw e;
    }
  }

  /** What the server applied; all empty before its first applied call. */
  ledger(): Ledger {
    assert.ok(this.ledgerPath, 'start the server with { ledger: true }');
    const read = existsSync(this.ledgerPath) ? (JSON.parse(readFileSync(this.ledgerPath, 'utf8')) as Partial<Ledger>) : {};
    return { refunds: [], notes: [], assets: {}, uploads: {}, archives: [], confirmations: [], reports: [], cancelled_tasks: [], ...read };
  }

  /** Ends the server (it is gone when this resolves); again, nothing. */
  async stop(): Promise<void> {
    const child = this.child;
    if (child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
      await gone;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

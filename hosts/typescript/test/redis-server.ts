// A redis-server of a test's own, without persistence, on a free port: the
// fleet tests' and the account-budget tests'. `killRedisServers()` in an
// `after` hook stops those still running.
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';

import { createClient } from 'redis';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A port nobody listens on now (never 6379 or CI's 6391). */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = await new Promise<number>((resolve, reject) => {
      const server = createServer();
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address() as { port: number };
        server.close(() => resolve(port));
      });
    });
    if (port !== 6379 && port !== 6391) return port;
  }
}

const running = new Set<RedisServer>();

/** Kills every server still running (an `after` hook). */
export async function killRedisServers(): Promise<void> {
  for (const server of [...running]) await server.kill();
}

export class RedisServer {
  private child: ChildProcess | undefined;
  private constructor(readonly port: number) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Started on `port` (default: a free one), empty. */
  static async start(port?: number): Promise<RedisServer> {
    const server = new RedisServer(port ?? (await freePort()));
    await server.restart();
    return server;
  }

  /** Started (again) on its port, empty. */
  async restart(): Promise<void> {
    const child = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    let spawnError: Error | undefined;
    child.once('error', (e) => (spawnError = e));
    this.child = child;
    running.add(this);
    const deadline = Date.now() + 10_000;
    for (;;) {
      if (spawnError) throw new Error(`cannot start redis-server (\`make redis\` in the repository root installs it): ${spawnError.message}`);
      if (child.exitCode !== null) throw new Error(`redis-server on port ${this.port} exited ${child.exitCode}`);
      try {
        const client = await this.client();
        await client.ping();
        client.destroy();
        return;
      } catch {
        if (Date.now() > deadline) throw new Error(`redis-server on port ${this.port} does not answer`);
        await sleep(50);
      }
    }
  }

  /** A client of its own (no reconnection). */
  async client() {
    const client = createClient({ url: this.url, socket: { reconnectStrategy: false, connectTimeout: 500 } });
    client.on('error', () => undefined);
    await client.connect();
    return client;
  }

  signal(signal: NodeJS.Signals): void {
    this.child?.kill(signal);
  }

  /** Killed at once (SIGKILL, after SIGCONT if paused): its data is gone. */
  async kill(): Promise<void> {
    running.delete(this);
    const child = this.child;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGCONT');
    child.kill('SIGKILL');
    await exited;
  }
}

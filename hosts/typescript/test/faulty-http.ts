// A local faulty HTTP server for the tests of `withPolicy` and its mappings
// (node:http on 127.0.0.1): each path answers from a script, one answer per
// request in order (the last repeats); every request is recorded.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** One scripted answer: a status with headers and body, a socket destroyed before any answer, or no answer at all. */
export type Answer =
  | { status: number; headers?: Record<string, string>; body?: string }
  | { destroy: true }
  | { hang: true };

export interface Seen {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  body: string;
}

export class FaultyServer {
  readonly seen: Seen[] = [];
  private readonly scripts = new Map<string, Answer[]>();
  private readonly hung = new Set<ServerResponse>();

  private constructor(private readonly server: Server, readonly url: string) {}

  static async start(): Promise<FaultyServer> {
    let faulty: FaultyServer | undefined;
    const server = createServer((request, response) => faulty?.handle(request, response));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    faulty = new FaultyServer(server, `http://127.0.0.1:${port}`);
    return faulty;
  }

  /** Answers for `path` (the query string is ignored), in order; the last repeats. */
  script(path: string, ...answers: Answer[]): void {
    this.scripts.set(path, answers);
  }

  /** Requests seen on `path`. */
  hits(path: string): Seen[] {
    return this.seen.filter((s) => s.path === path);
  }

  private handle(request: IncomingMessage, response: ServerResponse): void {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const path = (request.url ?? '/').split('?')[0];
      this.seen.push({ method: request.method ?? 'GET', path, headers: request.headers, body: Buffer.concat(chunks).toString('utf8') });
      const script = this.scripts.get(path) ?? [{ status: 404, body: 'no script' }];
      const index = Math.min(this.hits(path).length - 1, script.length - 1);
      const answer = script[index];
      if ('destroy' in answer) {
        request.socket.destroy();
        return;
      }
      if ('hang' in answer) {
        this.hung.add(response);
        return;
      }
      response.writeHead(answer.status, { 'content-type': 'application/json', ...(answer.headers ?? {}) });
      response.end(answer.body ?? '');
    });
  }

  async stop(): Promise<void> {
    for (const response of this.hung) response.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** A port nothing listens on (bound, then closed). */
export async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

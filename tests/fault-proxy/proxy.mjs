#!/usr/bin/env node
// The fault proxy for streamable HTTP: starts an MCP server, forwards every
// request to it, and on demand cuts a connection before, during or after the
// answer, delays an answer, or restarts the server (losing its sessions).
// Usage and control API: tests/fault-proxy/README.md.

import { spawn } from 'node:child_process';
import { fstatSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';

const separator = process.argv.indexOf('--');
if (separator < 0 || separator === process.argv.length - 1) {
  console.error('usage: node proxy.mjs -- <server command...>');
  process.exit(2);
}
const serverCommand = process.argv.slice(separator + 1);

/** A free loopback port, asked of the kernel. */
function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

function accepts(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => { socket.destroy(); resolve(true); });
    socket.once('error', () => resolve(false));
  });
}

const upstreamPort = await freePort();
let server = null;

/** Starts the server and waits (up to 20 s) until its port accepts. */
async function startServer() {
  const [program, ...args] = serverCommand.map((a) => a.replaceAll('{port}', String(upstreamPort)));
  const child = spawn(program, args, { env: { ...process.env, PORT: String(upstreamPort) }, stdio: ['ignore', 'ignore', 'inherit'] });
  let exited = false;
  child.once('exit', () => { exited = true; });
  server = child;
  for (let waited = 0; waited < 20_000; waited += 25) {
    if (exited) throw new Error(`the server exited before it accepted on port ${upstreamPort}: ${serverCommand.join(' ')}`);
    if (await accepts(upstreamPort)) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`the server did not accept on port ${upstreamPort} within 20 s`);
}

/** Kills the server and waits until it has exited. */
async function stopServer() {
  const child = server;
  server = null;
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await gone;
}

const faults = [];
const log = [];

/** What a request is: its JSON-RPC method and tool name, if any. */
function describe(method, body) {
  if (method !== 'POST') return { rpc: method, tool: null };
  try {
    const message = JSON.parse(body.toString('utf8'));
    const first = Array.isArray(message) ? message[0] : message;
    return { rpc: first?.method ?? null, tool: first?.params?.name ?? null };
  } catch {
    return { rpc: null, tool: null };
  }
}

/** Takes the first queued fault that matches this request off the queue. */
function takeFault(rpc, tool) {
  const index = faults.findIndex((f) => f.on === rpc && (f.tool === undefined || f.tool === tool));
  return index < 0 ? null : faults.splice(index, 1)[0];
}

function readBody(stream) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    stream.on('data', (c) => chunks.push(c));
    stream.once('end', () => resolve(Buffer.concat(chunks)));
    stream.once('error', reject);
  });
}

function reply(res, status, value) {
  const body = Buffer.from(JSON.stringify(value));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': body.length });
  res.end(body);
}

async function control(req, res, body) {
  const path = req.url.replace(/^\/__proxy\//, '');
  try {
    if (req.method === 'POST' && path === 'faults') {
      const added = JSON.parse(body.toString('utf8') || '[]');
      if (!Array.isArray(added)) throw new Error('the body must be a JSON array of faults');
      for (const f of added) {
        if (!['cut-before', 'cut-during', 'cut-after', 'delay'].includes(f.fault)) throw new Error(`unknown fault ${JSON.stringify(f.fault)}`);
        if (typeof f.on !== 'string') throw new Error('a fault needs "on": a JSON-RPC method or "GET"');
      }
      faults.push(...added);
      return reply(res, 200, { queued: faults.length });
    }
    if (req.method === 'POST' && path === 'restart') {
      await stopServer();
      await startServer();
      return reply(res, 200, { restarted: true });
    }
    if (req.method === 'POST' && path === 'stop') {
      await stopServer();
      return reply(res, 200, { stopped: true });
    }
    if (req.method === 'POST' && path === 'start') {
      if (!server) await startServer();
      return reply(res, 200, { started: true });
    }
    if (req.method === 'GET' && path === 'log') return reply(res, 200, log);
    return reply(res, 404, { error: `no control ${req.method} ${req.url}` });
  } catch (error) {
    return reply(res, 400, { error: String(error?.message ?? error) });
  }
}

/** Cuts the client's connection: no more bytes, a reset or a truncated body. */
function cut(res) {
  res.socket?.destroy();
  res.destroy();
}

const proxy = http.createServer(async (req, res) => {
  const body = await readBody(req);
  if (req.url.startsWith('/__proxy/')) return control(req, res, body);
  const { rpc, tool } = describe(req.method, body);
  const entry = { http: req.method, rpc, tool, session: req.headers['mcp-session-id'] !== undefined, status: null, fault: null };
  log.push(entry);
  const fault = takeFault(rpc, tool);
  entry.fault = fault?.fault ?? null;
  if (fault?.fault === 'cut-before') return cut(res);

  const headers = { ...req.headers, host: `127.0.0.1:${upstreamPort}` };
  const upstream = http.request({ host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers });
  upstream.once('error', () => cut(res)); // the server is down: the client's connection is cut
  res.once('close', () => upstream.destroy()); // the client went away (a GET stream it closed)
  upstream.once('response', async (answer) => {
    entry.status = answer.statusCode;
    if (fault?.fault === 'cut-during') {
      // The server finishes its answer (a write is applied); the client gets
      // only the head of it.
      await readBody(answer).catch(() => {});
      res.writeHead(answer.statusCode, answer.headers);
      res.flushHeaders();
      setTimeout(() => cut(res), 20);
      return;
    }
    if (fault?.fault === 'delay') await new Promise((r) => setTimeout(r, fault.delay_ms ?? 0));
    res.writeHead(answer.statusCode, answer.headers);
    res.flushHeaders();
    answer.pipe(res);
    if (fault?.fault === 'cut-after') answer.once('end', () => res.once('finish', () => setTimeout(() => res.socket?.destroy(), 10)));
  });
  upstream.end(body);
});
proxy.keepAliveTimeout = 60_000;

await startServer();
proxy.listen(0, '127.0.0.1', () => {
  const { port } = proxy.address();
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}`, upstream_port: upstreamPort })}\n`);
});

async function shutdown() {
  await stopServer();
  process.exit(0);
}
// Ends with its test: when its stdin (a pipe) closes, or its parent is gone.
const stdin = fstatSync(0);
if (stdin.isFIFO() || stdin.isSocket()) {
  process.stdin.resume();
  process.stdin.once('end', shutdown);
}
const parent = process.ppid;
setInterval(() => { if (process.ppid !== parent) shutdown(); }, 500).unref();
process.once('SIGTERM', shutdown);
process.once('SIGINT', shutdown);

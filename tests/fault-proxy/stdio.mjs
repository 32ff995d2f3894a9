#!/usr/bin/env node
// The fault shim for stdio: starts an MCP server, relays newline-delimited
// JSON-RPC both ways, and dies on demand before or after a request is run, or
// refuses to start. Faults live in a file and are consumed as they apply, so a
// shim the wrapper respawns does not repeat one. See tests/fault-proxy/README.md.

import { spawn } from 'node:child_process';
import { appendFileSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const argv = process.argv.slice(2);
const separator = argv.indexOf('--');
const option = (name) => {
  const i = argv.indexOf(name);
  return i >= 0 && i < separator ? argv[i + 1] : undefined;
};
const scriptPath = option('--script');
const logPath = option('--log');
if (separator < 0 || separator === argv.length - 1 || !scriptPath) {
  console.error('usage: node stdio.mjs --script FAULTS.json [--log LOG.jsonl] -- <server command...>');
  process.exit(2);
}
const [program, ...args] = argv.slice(separator + 1);

function readFaults() {
  try {
    const faults = JSON.parse(readFileSync(scriptPath, 'utf8'));
    return Array.isArray(faults) ? faults : [];
  } catch {
    return [];
  }
}

/** Writes the remaining faults back atomically (a rename), for the next shim. */
function writeFaults(faults) {
  const temporary = `${scriptPath}.${process.pid}.tmp`;
  writeFileSync(temporary, JSON.stringify(faults));
  renameSync(temporary, scriptPath);
}

/** Takes the first fault that matches (and is not a start fault) out of the file. */
function takeFault(rpc, tool) {
  const faults = readFaults();
  const index = faults.findIndex((f) => f.fault !== 'exit-at-start' && f.on === rpc && (f.tool === undefined || f.tool === tool));
  if (index < 0) return null;
  const [fault] = faults.splice(index, 1);
  writeFaults(faults);
  return fault;
}

// A server that cannot be started again: this start uses up one count.
{
  const faults = readFaults();
  const start = faults.find((f) => f.fault === 'exit-at-start' && (f.count ?? 1) > 0);
  if (start) {
    start.count = (start.count ?? 1) - 1;
    writeFaults(faults.filter((f) => f.fault !== 'exit-at-start' || f.count > 0));
    if (logPath) appendFileSync(logPath, `${JSON.stringify({ rpc: null, tool: null, pid: process.pid, fault: 'exit-at-start' })}\n`);
    process.exit(1);
  }
}

const server = spawn(program, args, { stdio: ['pipe', 'pipe', 'inherit'] });
const quit = (status) => {
  server.kill('SIGKILL');
  process.exit(status);
};
server.once('exit', () => process.exit(0));
server.stdin.on('error', () => quit(0));

/** Request id → what to do when its answer comes. */
const pending = new Map();

createInterface({ input: process.stdin }).on('line', (line) => {
  let message = null;
  try {
    message = JSON.parse(line);
  } catch {
    // not JSON: relayed as it is; the server answers it
  }
  const rpc = message?.method ?? null;
  const tool = message?.params?.name ?? null;
  const fault = rpc ? takeFault(rpc, tool) : null;
  if (logPath && rpc) appendFileSync(logPath, `${JSON.stringify({ rpc, tool, pid: process.pid, fault: fault?.fault ?? null })}\n`);
  if (fault?.fault === 'kill-before') return quit(0);
  if (fault && message?.id !== undefined) pending.set(JSON.stringify(message.id), fault);
  server.stdin.write(`${line}\n`);
});
process.stdin.once('end', () => quit(0));

createInterface({ input: server.stdout }).on('line', async (line) => {
  let id;
  try {
    id = JSON.parse(line)?.id;
  } catch {
    // not JSON: relayed
  }
  const fault = id === undefined ? undefined : pending.get(JSON.stringify(id));
  if (fault) pending.delete(JSON.stringify(id));
  if (fault?.fault === 'kill-after') return quit(0);
  if (fault?.fault === 'delay') await new Promise((r) => setTimeout(r, fault.delay_ms ?? 0));
  process.stdout.write(`${line}\n`);
});

// One worker of the cross-language breaker test (hosts/python/tests/
// test_redis_shared_state.py; its twins are hosts/python/tests/breaker_worker.py
// and target/release/breaker-worker): the component with its shared state on
// Redis (`FallbackSharedState`), a policy whose breaker opens after 2 failures,
// one run, and one JSON line on stdout.
//
//   node dist/test/breaker-worker.js URL SERVER MODE
//
// - MODE `open`: begin-call(SERVER, "lookup_order") must be admitted; attempts
//   1 and 2 fail with HTTP 503 ("upstream unavailable", sent): a retry, then
//   the breaker opens. Prints {"host": "node", "mode": "open", "action": <the
//   verdict's action of attempt 2>, "changes": [{old, new, tool}]}.
// - MODE `call`: begin-call(SERVER, "lookup_order"); prints {"host": "node",
//   "mode": "call", "admitted", "replan", "message": <the replan's text, or null>}.
//
// Exit 2, with the reason on stderr, when the run does not go as told. Without
// its three arguments it does nothing (`node --test dist/test/` loads every file here).
import { FallbackSharedState } from '../src/redis-shared-state.js';
import { PolicyComponent } from '../src/component.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';

const CONFIG = { tools: { lookup_order: { effect: 'read' } }, 'circuit-breaker': { 'failures-to-open': 2, 'cooldown-ms': 60000 } };
const TOOL = 'lookup_order';
const UNAVAILABLE: Wit.Observation = {
  kind: { tag: 'http-status', val: 503 }, headers: '', body: 'upstream unavailable', sessionIdSent: false, delivery: 'sent',
};

function fail(why: string): never {
  throw new Error(`breaker-worker: ${why}`);
}

async function main(url: string, server: string, mode: string): Promise<void> {
  if (mode !== 'open' && mode !== 'call') fail(`MODE is open or call, not ${JSON.stringify(mode)}`);
  const sharedState = await FallbackSharedState.open(url);
  try {
    const instance = await (await PolicyComponent.load()).instantiate({ sharedState });
    const run = instance.loadPolicy(CONFIG).startRun(`breaker-worker-node-${process.pid}-${Date.now()}`);
    const changes: Array<{ old: string; new: string; tool: string | null }> = [];
    const take = (changed: boolean) => {
      if (!changed) return;
      for (const c of run.takeBreakerChanges()) changes.push({ old: c.oldState, new: c.newState, tool: c.tool ?? null });
    };
    const start = run.beginCall(server, TOOL, undefined, undefined, Date.now());
    take(start.breakerChanged);
    let line: Record<string, unknown>;
    if (mode === 'call') {
      let message: string | null = null;
      if (!start.admitted && start.replan) {
        const said = run.lastDecision(start.callId);
        message = said?.action.tag === 'replan' ? said.action.val : fail(`a replan whose last decision is ${JSON.stringify(said?.action.tag)}`);
      }
      line = { host: 'node', mode, admitted: start.admitted, replan: start.replan, message };
    } else {
      if (!start.admitted) fail(`begin-call was not admitted (replan ${start.replan}): is the breaker of ${server} open already?`);
      const first = run.recordFailure(start.callId, 1, UNAVAILABLE, undefined, Date.now());
      take(first.breakerChanged);
      if (first.action !== 'retry') fail(`attempt 1 (503) was answered ${first.action}, not retry`);
      const second = run.recordFailure(start.callId, first.attempt + 1, UNAVAILABLE, undefined, Date.now());
      take(second.breakerChanged);
      if (second.action !== 'replan') fail(`attempt 2 (503) was answered ${second.action}, not replan`);
      line = { host: 'node', mode, action: second.action, changes };
    }
    if (sharedState.fallbacks > 0) fail(`Redis at ${url} failed during the run: the breakers were this process's own`);
    process.stdout.write(`${JSON.stringify(line)}\n`);
  } finally {
    sharedState.close();
  }
}

const args = process.argv.slice(2);
if (args.length === 3) {
  main(args[0], args[1], args[2]).catch((e) => {
    process.stderr.write(`${String((e as Error)?.stack ?? e)}\n`);
    process.exit(2);
  });
}

// The log lines 0.8 added beside the attempt lines (docs/events.md): the older
// tests keep reading the lines they were written for by leaving these out.
const ADDED = new Set([
  'agent_retry.wait', 'agent_retry.replan', 'agent_retry.escalation', 'agent_retry.status_check', 'agent_retry.task_poll',
  'agent_retry.tools_without_hints',
]);

/** Whether `line` (its JSON text, or parsed) is one of the event lines added in 0.8. */
export function isAddedEventLine(line: string | Record<string, unknown>): boolean {
  if (typeof line !== 'string') return ADDED.has(String(line.event));
  const found = /^\{"event":"([^"]+)"/.exec(line);
  return found !== null && ADDED.has(found[1]);
}

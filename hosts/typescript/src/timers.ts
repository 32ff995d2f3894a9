// Timers of any length: node's setTimeout / setInterval take at most 2^31 - 1 ms
// (a longer delay fires after 1 ms, with a TimeoutOverflowWarning).

/** The longest delay `setTimeout` takes (2^31 - 1 ms, about 24.8 days): a
 *  longer one would fire at once. Longer waits are made of several timers. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Calls `fire` after `ms` (any length: chained timers past `MAX_TIMER_MS`);
 *  returns what cancels it. */
export function longTimeout(ms: number, fire: () => void): () => void {
  let timer: ReturnType<typeof setTimeout>;
  const arm = (left: number) => {
    const now = left > MAX_TIMER_MS ? MAX_TIMER_MS : left > 0 ? left : 0;
    timer = setTimeout(() => (left > MAX_TIMER_MS ? arm(left - MAX_TIMER_MS) : fire()), now);
  };
  arm(ms);
  return () => clearTimeout(timer);
}

// The instruments of docs/events.md ("Metrics"), counted from the events (so the
// attempts agree with the run report), kept in-process and printed as Prometheus
// text (exposition format 0.0.4). The same updates go to OpenTelemetry's metrics
// API when it is present (src/otel.ts), through `metricUpdates`.
import { policyUpdateOutcome, type CallEvent, type PolicyUpdateEvent } from './events.js';

/** One instrument of docs/events.md: its OpenTelemetry name, its Prometheus name, kind and label names. */
export interface Instrument {
  otel: string;
  prometheus: string;
  kind: 'counter' | 'histogram';
  labels: readonly string[];
  help: string;
}

/** The histogram's buckets (seconds), the same in every host. */
export const WAIT_BUCKETS_S: readonly number[] = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export const INSTRUMENTS: readonly Instrument[] = [
  { otel: 'agent_retry.attempts', prometheus: 'agent_retry_attempts_total', kind: 'counter', labels: ['class', 'action'],
    help: 'Attempts, by the class of their outcome and the action decided.' },
  { otel: 'agent_retry.replans', prometheus: 'agent_retry_replans_total', kind: 'counter', labels: [], help: 'Calls ended with a message for the model.' },
  { otel: 'agent_retry.escalations', prometheus: 'agent_retry_escalations_total', kind: 'counter', labels: ['reason'], help: 'Calls ended with an escalation, by reason.' },
  { otel: 'agent_retry.status_checks', prometheus: 'agent_retry_status_checks_total', kind: 'counter', labels: ['result'], help: 'Status checks, by result.' },
  { otel: 'agent_retry.waits', prometheus: 'agent_retry_waits_total', kind: 'counter', labels: ['why'], help: 'Waits before an attempt or a poll, by why.' },
  { otel: 'agent_retry.wait.duration', prometheus: 'agent_retry_wait_seconds', kind: 'histogram', labels: ['why'], help: 'How long the waits were, in seconds.' },
  { otel: 'agent_retry.account.waits', prometheus: 'agent_retry_account_waits_total', kind: 'counter', labels: [], help: 'Waits for the account budget (admission waits).' },
  { otel: 'agent_retry.account.refusals', prometheus: 'agent_retry_account_refusals_total', kind: 'counter', labels: [],
    help: 'Calls the account budget did not admit.' },
  { otel: 'agent_retry.policy_updates', prometheus: 'agent_retry_policy_updates_total', kind: 'counter', labels: ['outcome'],
    help: 'Live policy updates, by outcome.' },
  { otel: 'agent_retry.breaker.changes', prometheus: 'agent_retry_breaker_changes_total', kind: 'counter', labels: ['scope', 'to'],
    help: "Circuit breakers' changes of state, by scope (server, tool) and the state changed to." },
];

const BY_OTEL = new Map(INSTRUMENTS.map((i) => [i.otel, i]));

/** One change an event makes to an instrument: add `value` (a counter) or record it (the histogram). */
export interface MetricUpdate {
  instrument: string;
  labels: Record<string, string>;
  value: number;
  /** The histogram's value in whole ms (kept exact in-process; the sum is given in seconds from it). */
  ms?: number;
}

/** What an event adds to the instruments. The attempts counter counts only the
 *  lines the run report counts as attempts (not a status check's or a poll's
 *  verdict); refusals are escalations for `account-budget-exhausted`. */
export function metricUpdates(event: CallEvent | PolicyUpdateEvent): MetricUpdate[] {
  switch (event.event) {
    case 'agent_retry.attempt':
      if (!event.countsAsAttempt) return [];
      return [{ instrument: 'agent_retry.attempts', labels: { class: event.class ?? 'none', action: event.action }, value: 1 }];
    case 'agent_retry.wait': {
      const updates: MetricUpdate[] = [
        { instrument: 'agent_retry.waits', labels: { why: event.why }, value: 1 },
        { instrument: 'agent_retry.wait.duration', labels: { why: event.why }, value: event.waitMs / 1000, ms: event.waitMs },
      ];
      if (event.why === 'admission') updates.push({ instrument: 'agent_retry.account.waits', labels: {}, value: 1 });
      return updates;
    }
    case 'agent_retry.replan':
      return [{ instrument: 'agent_retry.replans', labels: {}, value: 1 }];
    case 'agent_retry.escalation': {
      const updates: MetricUpdate[] = [{ instrument: 'agent_retry.escalations', labels: { reason: event.reason }, value: 1 }];
      if (event.reason === 'account-budget-exhausted') updates.push({ instrument: 'agent_retry.account.refusals', labels: {}, value: 1 });
      return updates;
    }
    case 'agent_retry.status_check':
      return [{ instrument: 'agent_retry.status_checks', labels: { result: event.result }, value: 1 }];
    case 'agent_retry.task_poll':
    case 'agent_retry.resume':
      return [];
    case 'agent_retry.breaker':
      return [{ instrument: 'agent_retry.breaker.changes', labels: { scope: event.scope, to: event.to }, value: 1 }];
    case 'agent_retry.policy_update': {
      const outcome = policyUpdateOutcome(event);
      return outcome === undefined ? [] : [{ instrument: 'agent_retry.policy_updates', labels: { outcome }, value: 1 }];
    }
  }
}

/** A counter's series: its labels and value. */
export interface CounterSeries {
  labels: Record<string, string>;
  value: number;
}

/** A histogram's series: its labels, the cumulative count at each bucket's
 *  upper bound (`le`, `+Inf` last), the count and the sum (seconds). */
export interface HistogramSeries {
  labels: Record<string, string>;
  buckets: Record<string, number>;
  count: number;
  sum: number;
}

/** Every instrument by its Prometheus name: its series, sorted by their label
 *  values in the instrument's label order (a counter without labels: one series,
 *  0 until counted). The same shape in every host. */
export type MetricsSnapshot = Record<string, Array<CounterSeries | HistogramSeries>>;

/** A histogram's counts as kept: per bucket (not cumulative), the last above the largest bound. */
interface HistogramCounts {
  labels: Record<string, string>;
  counts: number[];
  count: number;
  sumMs: number;
}

/** The buckets' bounds in ms, to compare whole ms exactly. */
const WAIT_BUCKETS_MS = WAIT_BUCKETS_S.map((bound) => Math.round(bound * 1000));

/** A series' key: its label values in the instrument's label order (so keys sort as the snapshot lists them). */
const seriesKey = (instrument: Instrument, labels: Record<string, string>): string => JSON.stringify(instrument.labels.map((name) => labels[name] ?? ''));

/** The instruments of docs/events.md, in-process. Give one to a wrapper's
 *  `metrics` option (and the same one to every caller and `withPolicy` of a
 *  process to sum them); `toPrometheus()` serves a scrape. */
export class RetryMetrics {
  private readonly series = new Map<string, Map<string, CounterSeries | HistogramCounts>>();

  /** Adds what `event` counts. */
  record(event: CallEvent | PolicyUpdateEvent): void {
    this.add(metricUpdates(event));
  }

  /** Adds updates already made from an event (`metricUpdates`). */
  add(updates: readonly MetricUpdate[]): void {
    for (const update of updates) this.apply(update);
  }

  private apply(update: MetricUpdate): void {
    const instrument = BY_OTEL.get(update.instrument);
    if (instrument === undefined) return;
    let all = this.series.get(instrument.otel);
    if (all === undefined) this.series.set(instrument.otel, (all = new Map()));
    const key = seriesKey(instrument, update.labels);
    let series = all.get(key);
    if (instrument.kind === 'counter') {
      if (series === undefined) all.set(key, (series = { labels: { ...update.labels }, value: 0 }));
      (series as CounterSeries).value += update.value;
    } else {
      if (series === undefined) all.set(key, (series = { labels: { ...update.labels }, counts: WAIT_BUCKETS_S.map(() => 0).concat(0), count: 0, sumMs: 0 }));
      const histogram = series as HistogramCounts;
      const ms = update.ms ?? update.value * 1000;
      const index = WAIT_BUCKETS_MS.findIndex((bound) => ms <= bound);
      histogram.counts[index < 0 ? WAIT_BUCKETS_S.length : index] += 1;
      histogram.count += 1;
      histogram.sumMs += ms;
    }
  }

  /** A copy of every instrument's series, by Prometheus name. */
  snapshot(): MetricsSnapshot {
    const snapshot: MetricsSnapshot = {};
    for (const instrument of INSTRUMENTS) {
      const all = [...(this.series.get(instrument.otel)?.entries() ?? [])].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      const series: Array<CounterSeries | HistogramSeries> = all.map(([, s]) => {
        if ('value' in s) return { labels: { ...s.labels }, value: s.value };
        const buckets: Record<string, number> = {};
        let cumulative = 0;
        WAIT_BUCKETS_S.forEach((bound, i) => {
          cumulative += s.counts[i];
          buckets[number(bound)] = cumulative;
        });
        buckets['+Inf'] = s.count;
        return { labels: { ...s.labels }, buckets, count: s.count, sum: s.sumMs / 1000 };
      });
      // A counter without labels is always there, 0 until counted.
      if (series.length === 0 && instrument.kind === 'counter' && instrument.labels.length === 0) series.push({ labels: {}, value: 0 });
      snapshot[instrument.prometheus] = series;
    }
    return snapshot;
  }

  /** The sum of a counter over its series matching `labels` (every series without). */
  total(instrument: string, labels: Record<string, string> = {}): number {
    let sum = 0;
    for (const series of this.series.get(instrument)?.values() ?? []) {
      if (Object.entries(labels).every(([k, v]) => series.labels[k] === v)) sum += 'value' in series ? series.value : series.count;
    }
    return sum;
  }

  /** Prometheus text exposition format 0.0.4 (`text/plain; version=0.0.4`). */
  toPrometheus(): string {
    const out: string[] = [];
    const snapshot = this.snapshot();
    for (const instrument of INSTRUMENTS) {
      const name = instrument.prometheus;
      out.push(`# HELP ${name} ${instrument.help}`, `# TYPE ${name} ${instrument.kind}`);
      for (const s of snapshot[name]) {
        if ('value' in s) {
          out.push(`${name}${labelText(instrument.labels, s.labels)} ${number(s.value)}`);
          continue;
        }
        // In the bounds' order (an object lists integer-like keys first).
        for (const le of [...WAIT_BUCKETS_S.map(number), '+Inf']) out.push(`${name}_bucket${labelText(instrument.labels, s.labels, le)} ${s.buckets[le]}`);
        out.push(`${name}_sum${labelText(instrument.labels, s.labels)} ${number(s.sum)}`);
        out.push(`${name}_count${labelText(instrument.labels, s.labels)} ${s.count}`);
      }
    }
    return `${out.join('\n')}\n`;
  }
}

/** A sample value as Prometheus writes it. */
const number = (value: number): string => (Number.isFinite(value) ? String(value) : value > 0 ? '+Inf' : value < 0 ? '-Inf' : 'NaN');

/** `\`, `"` and a line break escaped, as the format wants in a label value. */
const escapeLabel = (value: string): string => value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

function labelText(names: readonly string[], labels: Record<string, string>, le?: string): string {
  const pairs = names.map((name) => `${name}="${escapeLabel(labels[name] ?? '')}"`);
  if (le !== undefined) pairs.push(`le="${le}"`);
  return pairs.length === 0 ? '' : `{${pairs.join(',')}}`;
}

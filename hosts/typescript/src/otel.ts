// OpenTelemetry through `@opentelemetry/api` only (an optional peer dependency):
// loaded once with a dynamic import, and when it is absent nothing is recorded
// and nothing fails. Spans, span events and metric instruments as
// docs/events.md ("Traces", "Metrics") says. The types here are the few shapes
// this module uses, written out so the package's typings do not need the API.
import { INSTRUMENTS, WAIT_BUCKETS_S, type MetricUpdate } from './metrics.js';

export type Attributes = Record<string, string | number | boolean>;

export interface OtelSpanContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: { serialize(): string };
}

export interface OtelSpan {
  setAttribute(key: string, value: string | number | boolean): unknown;
  addEvent(name: string, attributes?: Attributes): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  end(): void;
  spanContext(): OtelSpanContext;
}

interface OtelTracer {
  startSpan(name: string, options?: { kind?: number; attributes?: Attributes }, context?: unknown): OtelSpan;
}

interface OtelInstrument {
  add?(value: number, attributes?: Attributes): void;
  record?(value: number, attributes?: Attributes): void;
}

interface OtelMeter {
  createCounter(name: string, options?: { description?: string; unit?: string }): OtelInstrument;
  createHistogram(name: string, options?: { description?: string; unit?: string; advice?: { explicitBucketBoundaries?: number[] } }): OtelInstrument;
}

/** The parts of `@opentelemetry/api` used here. */
export interface OtelApi {
  trace: {
    getTracer(name: string, version?: string): OtelTracer;
    setSpan(context: unknown, span: OtelSpan): unknown;
  };
  context: { active(): unknown };
  metrics: { getMeter(name: string, version?: string): OtelMeter };
  isSpanContextValid(context: OtelSpanContext): boolean;
  SpanKind: { INTERNAL: number; CLIENT: number };
  SpanStatusCode: { ERROR: number };
}

/** The instrumentation scope's name (tracer and meter). */
export const SCOPE = 'agent-retry-policy';
const VERSION = '0.9.0';

let loaded: Promise<Otel | undefined> | undefined;

/** `@opentelemetry/api` if it can be imported, once per process (undefined when
 *  it is absent or fails to load). `importer` is for tests. */
export function loadOtel(importer: () => Promise<unknown> = () => import('@opentelemetry/api')): Promise<Otel | undefined> {
  loaded ??= importer().then(
    (module) => {
      const api = ((module as { default?: unknown }).default ?? module) as Partial<OtelApi>;
      return api.trace && api.metrics && api.context ? new Otel(api as OtelApi) : undefined;
    },
    () => undefined, // not installed: nothing is recorded
  );
  return loaded;
}

/** Forgets the loaded API (tests: the next `loadOtel` imports again). */
export function resetOtelForTests(): void {
  loaded = undefined;
}

/** The tracer and instruments of one `@opentelemetry/api`. The global providers
 *  are read at each use, so a provider registered later is used. */
export class Otel {
  constructor(readonly api: OtelApi) {}

  tracer(): OtelTracer {
    return this.api.trace.getTracer(SCOPE, VERSION);
  }

  /** A span started as a child of `parent` (else of the active context). */
  startSpan(name: string, kind: 'internal' | 'client', attributes: Attributes, parent?: OtelSpan): OtelSpan {
    const context = parent ? this.api.trace.setSpan(this.api.context.active(), parent) : this.api.context.active();
    return this.tracer().startSpan(name, { kind: kind === 'client' ? this.api.SpanKind.CLIENT : this.api.SpanKind.INTERNAL, attributes }, context);
  }

  /** The W3C trace context of `span` (`traceparent`, and `tracestate` if any), or
   *  undefined for a span that is not recorded anywhere (no provider). */
  traceContext(span: OtelSpan): { traceparent: string; tracestate?: string } | undefined {
    const context = span.spanContext();
    if (!this.api.isSpanContextValid(context)) return undefined;
    const flags = (context.traceFlags & 0xff).toString(16).padStart(2, '0');
    const state = context.traceState?.serialize();
    return { traceparent: `00-${context.traceId}-${context.spanId}-${flags}`, ...(state ? { tracestate: state } : {}) };
  }

  readonly errorCode = (): number => this.api.SpanStatusCode.ERROR;

  private meter?: { provider: unknown; instruments: Map<string, OtelInstrument> };

  /** Adds (a counter) or records (the histogram) one update. */
  record(update: MetricUpdate): void {
    const meter = this.api.metrics.getMeter(SCOPE, VERSION);
    // Instruments are made once per meter (a provider set later gives a new meter).
    if (this.meter?.provider !== meter) this.meter = { provider: meter, instruments: new Map() };
    let instrument = this.meter.instruments.get(update.instrument);
    if (instrument === undefined) {
      const spec = INSTRUMENTS.find((i) => i.otel === update.instrument);
      if (spec === undefined) return;
      instrument = spec.kind === 'counter'
        ? meter.createCounter(spec.otel, { description: spec.help })
        : meter.createHistogram(spec.otel, { description: spec.help, unit: 's', advice: { explicitBucketBoundaries: [...WAIT_BUCKETS_S] } });
      this.meter.instruments.set(update.instrument, instrument);
    }
    if (instrument.add) instrument.add(update.value, update.labels);
    else instrument.record?.(update.value, update.labels);
  }
}

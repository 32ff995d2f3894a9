// The one fan-out every emitter uses (the MCP wrapper, `withPolicy`, `LivePolicy`):
// an event becomes its log line, its hook, its metric updates and, when
// `@opentelemetry/api` is present, its place in the call's span tree. So the
// four cannot disagree.
import {
  AttemptEvent, BreakerEvent, EscalationEvent, ReplanEvent, ResumeEvent, StatusCheckEvent, TaskPollEvent, WaitEvent, type CallEvent, type PolicyUpdateEvent,
} from './events.js';
import { callHook, type HookName, type RetryHooks } from './hooks.js';
import { cutLiftedText } from './limits.js';
import { metricUpdates, type RetryMetrics } from './metrics.js';
import type { Attributes, Otel, OtelSpan } from './otel.js';

export interface TelemetryOptions {
  /** One JSON line per event; `null`: none. */
  log: ((line: string) => void) | null;
  hooks?: RetryHooks;
  metrics?: RetryMetrics;
  /** The loaded `@opentelemetry/api` (`loadOtel()`), if any. */
  otel?: Otel;
}

/** Where the fan-out of one wrapper (a caller, a `withPolicy` call, a `LivePolicy`) goes. */
export class Telemetry {
  readonly logging: boolean;
  private readonly write: (line: string) => void;
  /** Hooks that threw already: each is logged once. */
  private readonly failedHooks = new Set<HookName>();

  constructor(private readonly options: TelemetryOptions) {
    this.logging = options.log !== null;
    this.write = options.log ?? (() => {});
  }

  get otel(): Otel | undefined {
    return this.options.otel;
  }

  set otel(otel: Otel | undefined) {
    this.options.otel = otel;
  }

  /** Whether the policy's words (a decision's reason, a replan's message) are
   *  wanted: for a line or a hook. */
  get wantsWords(): boolean {
    const hooks = this.options.hooks;
    return this.logging || (hooks !== undefined && Object.values(hooks).some((hook) => typeof hook === 'function'));
  }

  /** A line that is no event of the model (`agent_retry.capture_missing`, ...). */
  line(fields: Record<string, unknown>): void {
    if (!this.logging) return;
    try {
      this.write(JSON.stringify(fields));
    } catch {
      // a log that fails changes nothing
    }
  }

  /** One event: its line, its hook, its metrics (in-process and OpenTelemetry). */
  emit(event: CallEvent | PolicyUpdateEvent, writeLine = true): void {
    if (this.logging && writeLine) this.line(event.event === 'agent_retry.policy_update' ? { ...event } : event.toLogLine());
    // Counted before any hook runs, and frozen for them: an observer cannot change what is counted or done.
    const updates = metricUpdates(event);
    const hooks = this.options.hooks;
    if (hooks !== undefined) deepFreeze(event);
    const failed = (name: HookName, error: unknown) => this.hookFailed(name, error);
    switch (event.event) {
      case 'agent_retry.attempt':
        if (event.action === 'retry') callHook(hooks, 'onRetry', event, failed);
        break;
      case 'agent_retry.wait':
        callHook(hooks, 'onWait', event, failed);
        break;
      case 'agent_retry.replan':
        callHook(hooks, 'onReplan', event, failed);
        break;
      case 'agent_retry.escalation':
        callHook(hooks, 'onEscalate', event, failed);
        break;
      case 'agent_retry.status_check':
        callHook(hooks, 'onStatusCheck', event, failed);
        break;
      case 'agent_retry.breaker':
        callHook(hooks, 'onBreaker', event, failed);
        break;
      case 'agent_retry.policy_update':
        callHook(hooks, 'onPolicyUpdate', event, failed);
        break;
      default:
        break;
    }
    if (updates.length === 0) return;
    try {
      this.options.metrics?.add(updates);
    } catch {
      // counting never changes a call
    }
    const otel = this.options.otel;
    if (otel) {
      for (const update of updates) {
        try {
          otel.record(update);
        } catch {
          // an exporter or SDK that throws changes nothing
        }
      }
    }
  }

  /** A hook threw: logged once per hook (`agent_retry.hook_failed`), then ignored. */
  private hookFailed(name: HookName, error: unknown): void {
    if (this.failedHooks.has(name)) return;
    this.failedHooks.add(name);
    let text: string;
    try {
      text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    } catch {
      text = 'an error that cannot be printed';
    }
    // Bounded as any text the host logs: a hook's error may be of any size.
    this.line({ event: 'agent_retry.hook_failed', ts: Math.round(Date.now()) / 1000, hook: name, error: cutLiftedText(text) });
  }

  /** The span and events of one call. `attemptSpan`: `tools/call {tool}` (client) over MCP, else `attempt {tool}`. */
  call(tool: string, fields: { run: string; policy: string; step: number | null }, attemptSpan: 'mcp' | 'any' | 'none'): CallTrace {
    return new CallTrace(this, tool, fields, attemptSpan);
  }
}

/** One call's spans: the call span (`execute_tool {tool}`), a child per
 *  attempt, and the waits, status checks, task polls, breaker changes and
 *  escalation as events on the call span. Every method is safe without OpenTelemetry. */
export class CallTrace {
  private readonly span?: OtelSpan;
  private attemptSpan?: OtelSpan;
  /** The attempts the call sent (as the run report counts them). */
  attempts = 0;
  /** The call's end as last decided (`succeed`, `replan`, `escalate`, `stop`). */
  private action?: string;
  private escalation?: string;
  private ended = false;

  constructor(readonly telemetry: Telemetry, readonly tool: string, fields: { run: string; policy: string; step: number | null },
    private readonly attemptKind: 'mcp' | 'any' | 'none') {
    const otel = telemetry.otel;
    if (otel === undefined || attemptKind === 'none') return;
    const attributes: Attributes = {
      'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': tool, 'agent_retry.run': fields.run, 'agent_retry.policy': fields.policy,
    };
    if (fields.step !== null) attributes['agent_retry.step'] = fields.step;
    this.span = guarded(() => otel.startSpan(`execute_tool ${tool}`, 'internal', attributes));
  }

  /** An attempt is about to be sent: its span starts (ending one left open). */
  startAttempt(attempt: number): void {
    const otel = this.telemetry.otel;
    if (!this.span || !otel) return;
    this.endAttempt();
    const attributes: Attributes = { 'agent_retry.attempt': attempt };
    if (attempt > 1) attributes['http.request.resend_count'] = attempt - 1;
    if (this.attemptKind === 'mcp') {
      attributes['mcp.method.name'] = 'tools/call';
      attributes['gen_ai.tool.name'] = this.tool;
    }
    const name = this.attemptKind === 'mcp' ? `tools/call ${this.tool}` : `attempt ${this.tool}`;
    this.attemptSpan = guarded(() => otel.startSpan(name, this.attemptKind === 'mcp' ? 'client' : 'internal', attributes, this.span));
  }

  /** The attempt span's W3C trace context, for the request's `params._meta`. */
  traceContext(): { traceparent: string; tracestate?: string } | undefined {
    const otel = this.telemetry.otel;
    const span = this.attemptSpan ?? this.span;
    return otel && span ? guarded(() => otel.traceContext(span)) : undefined;
  }

  /** An event of the call: fanned out, and put on the spans. */
  emit(event: CallEvent): void {
    if (event instanceof AttemptEvent) {
      if (event.countsAsAttempt) this.attempts += 1;
      if (event.action === 'succeed' || event.action === 'replan' || event.action === 'escalate' || event.action === 'stop') this.action = event.action;
      if (event.escalation !== null) this.escalation = event.escalation;
    }
    this.telemetry.emit(event);
    if (!this.span) return;
    if (event instanceof AttemptEvent) {
      const span = this.attemptSpan;
      if (span === undefined) return;
      this.attemptSpan = undefined;
      guarded(() => {
        span.setAttribute('agent_retry.action', event.action);
        if (event.class !== null) span.setAttribute('agent_retry.class', event.class);
        if (event.rule !== null) span.setAttribute('agent_retry.rule', event.rule);
        if (event.outcome !== 'success' && event.outcome !== 'empty result') {
          span.setAttribute('error.type', event.outcome);
          span.setStatus({ code: this.telemetry.otel?.errorCode() ?? 2, message: event.outcome });
        }
        span.end();
      });
      return;
    }
    if (event instanceof WaitEvent || event instanceof StatusCheckEvent || event instanceof TaskPollEvent || event instanceof EscalationEvent
      || event instanceof ReplanEvent || event instanceof BreakerEvent || event instanceof ResumeEvent) {
      if (event instanceof EscalationEvent) this.escalation = event.reason;
      if (event instanceof ReplanEvent) this.action = 'replan';
      if (event instanceof EscalationEvent) this.action = 'escalate';
      // A replan is the call's end (its action), not one of the documented span events.
      if (event instanceof ReplanEvent) return;
      const span = this.span;
      guarded(() => span.addEvent(event.event, ownAttributes(event.toLogLine())));
    }
  }

  private endAttempt(): void {
    const span = this.attemptSpan;
    this.attemptSpan = undefined;
    if (span) guarded(() => span.end());
  }

  /** The call ended (`succeed`, `replan`, `escalate`, or as its last line said). */
  end(action?: string): void {
    if (this.ended) return;
    this.ended = true;
    this.endAttempt();
    const span = this.span;
    if (!span) return;
    const final = action ?? this.action;
    guarded(() => {
      if (final !== undefined) span.setAttribute('agent_retry.action', final);
      span.setAttribute('agent_retry.attempts', this.attempts);
      if (final === 'escalate' && this.escalation !== undefined) {
        span.setAttribute('error.type', this.escalation);
        span.setStatus({ code: this.telemetry.otel?.errorCode() ?? 2, message: this.escalation });
      }
      span.end();
    });
  }
}

/** The fields of a line after the call's own (`event` ... `tool`), as `agent_retry.*` attributes; nulls left out. */
function ownAttributes(line: Record<string, unknown>): Attributes {
  const attributes: Attributes = {};
  for (const [key, value] of Object.entries(line)) {
    if (['event', 'ts', 'run', 'policy', 'step', 'call', 'tool'].includes(key)) continue;
    if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') attributes[`agent_retry.${key}`] = value;
  }
  return attributes;
}

/** Freezes `value` and every object in it (the events are plain data, made for one emission). */
function deepFreeze(value: unknown, depth = 0): void {
  if (value === null || typeof value !== 'object' || Object.isFrozen(value) || depth > 8) return;
  Object.freeze(value);
  for (const inner of Object.values(value)) deepFreeze(inner, depth + 1);
}

/** Runs `f`; an OpenTelemetry SDK or exporter that throws changes nothing. */
function guarded<T>(f: () => T): T | undefined {
  try {
    return f();
  } catch {
    return undefined;
  }
}

// agent-retry for Node: the policy component transpiled by jco, its imports (an
// embedded GCRA account budget shared by the process, the embedded shared state
// of the circuit breakers beside it, host entropy) and typed
// wrappers. The MCP wrapper is in `agent-retry-policy/mcp`, the vector runner in
// `agent-retry-policy/conformance`.
export {
  EmbeddedAccounts, MAX_CLOCK_SKEW_MS, PROCESS_ACCOUNTS, gcra, type AccountBudgetBackend, type AccountClockEvent, type Bucket, type EmbeddedAccountsOptions,
  type Reservation,
} from './accounts.js';
export {
  EmbeddedSharedState, MAX_SHARED_KEYS, MAX_SHARED_VALUE_BYTES, sharedStateFor, type EmbeddedSharedStateOptions, type Loaded as SharedStateLoaded,
  type SharedStateBackend,
} from './shared-state.js';
export {
  CACHE_ENV_VAR, INSTALLED, MAX_EFFECTS_PAGE, Policy, PolicyComponent, PolicyInstance, ResumeAnswer, Run, UNKNOWN_POLICY_IDENTITY, defaultCacheDir, locateComponent, nowMs,
  policyIdentityOf, type ComponentOrigin, type FromBytesOptions,
  type InstantiateOptions, type LoadOptions, type SourceInfo,
} from './component.js';
export {
  Integrity, LivePolicy, MANIFEST_SUFFIX, PolicyIdentity, SIGNATURE_SUFFIX, manifestPath, signaturePath, type FleetPolicySource, type IntegrityRead,
  type LiveOptions, type Loaded, type PolicySource, type PolicyUpdateEvent, type PolicyWatcher, type UpdateMetrics,
} from './live.js';
export {
  MANIFEST_HEADER, MAX_MANIFEST_BYTES, ManifestError, checkCovers, parseManifest, signPublication, statement, verifyPublication, type Bytes, type Manifest,
  type PublicationRead,
} from './manifest.js';
export {
  ACCOUNTS_REDIS_TIMEOUT_MS, ACCOUNTS_RETRY_INTERVAL_MS, ACCOUNT_PREFIX, AccountsError, RedisAccounts, SharedAccounts, type AccountBudgetEvent, type RedisAccountsOptions,
  type SharedAccountsOptions,
} from './redis-accounts.js';
export {
  FallbackSharedState, RedisSharedState, STATE_PREFIX, type FallbackSharedStateOptions, type SharedStateEvent,
} from './redis-shared-state.js';
export {
  DEFAULT_PREFIX, Fleet, FleetError, MAX_REVISION, REDIS_TIMEOUT_MS, parseRevision, publishPolicy, type FleetSource, type Publication, type PublishOptions,
} from './fleet.js';
export { CONTRACT_VERSION, checkContractVersion, checkImports, componentExportNames, componentImportNames, contractVersionOf } from './contract.js';
export { FUEL_PER_CALL, FUEL_PER_CONFIG_BYTE, MAX_MEMORY_BYTES } from './sandbox.js';
export {
  MAX_BODY_BYTES, MAX_CONFIG_BYTES, MAX_HEADERS, MAX_HEADER_VALUE_BYTES, MAX_ID_BYTES, MAX_STRUCTURED_BYTES, boundedObservation, joinedHeaders,
} from './limits.js';
export { ValueConversionError } from './wit.js';
export { OsEntropy, SplitMix64, type EntropySource } from './entropy.js';
export { jsonSafeBigInt, toJsonSafe, type JsonSafe } from './json.js';
export {
  AgentRetryError, CallCancelled, CallStopped, CallTimedOut, ComponentImportRefused, ComponentLoadError, ComponentNotFound, ConfigError, ConnectionConfigError, ContractVersionMismatch, Escalated, InstanceUnusable,
  NothingToRollBackTo, PolicyBoundaryViolation, PolicyInputTooLarge, PolicyMemoryExceeded, PolicyOutOfFuel, PolicyTrap, RunMisuse, SessionLost, SnapshotError, UpdateConfigError, UpdateError,
  UpdateFleetError, UpdateIntegrityError, UpdateLoadError, UpdateOlderError, UpdateReadError, UpdateSelfTestError, type StopCause, type Stopped,
} from './errors.js';
export {
  withPolicy, outcomeWords, type Attempt, type AnyStatusCheckRequest, type StatusCheckAnswer, type PolicyClock, type WithPolicyOptions,
} from './any-call.js';
export { observeError, observeResponse, type ObserveError } from './observe-errors.js';
export { ObservedFailure, ReplanNeeded } from './errors.js';
export {
  AttemptEvent, BreakerEvent, EscalationEvent, ReplanEvent, ResumeEvent, StatusCheckEvent, TaskPollEvent, WaitEvent, type AttemptFields, type BreakerFields,
  type CallEvent, type CallFields, type EscalationFields, type ReplanFields, type ResumeFields, type StatusCheckFields, type TaskPollFields, type WaitFields, type WaitWhy,
} from './events.js';
export type { Invariant, Violation } from './guard.js';
export type { RetryHooks } from './hooks.js';
export {
  INSTRUMENTS, RetryMetrics, WAIT_BUCKETS_S, type CounterSeries, type HistogramSeries, type Instrument, type MetricUpdate, type MetricsSnapshot,
} from './metrics.js';
// Test helpers (exported here: the package has no `./testing` entry point).
export {
  FakeClock, demoServerBinary, fixedEntropy, startDemoServer, type DemoFaultRule, type DemoServerOptions, type RunningDemoServer,
} from './testing.js';
export type * from '../generated/interfaces/agent-retry-policy-types.js';
// The contract's `config-error` record, under a name of its own: `ConfigError` is the error class that carries it.
export type { ConfigError as ConfigErrorValue } from '../generated/interfaces/agent-retry-policy-types.js';
// The same for 0.9.0's `snapshot-error` (`SnapshotError` is the error class) and
// `resume-answer` in jco's form (`ResumeAnswer` is the host's `{kind}` union).
export type {
  ResumeAnswer as ResumeAnswerValue, SnapshotError as SnapshotErrorValue,
} from '../generated/interfaces/agent-retry-policy-types.js';

//! Loading the policy component into a sandbox and calling it.
//!
//! The sandbox: the component imports only the account budget and
//! `wasi:random/random` (both supplied here), so it can reach no file, socket,
//! clock or environment. Every call runs on a fuel budget and the instance's
//! memory is capped, so a broken or hostile policy update fails a call with a
//! trap that the host survives, instead of hanging or exhausting the host.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::{Component, HasSelf, Instance, Linker, ResourceAny};
use wasmtime::{Config, Engine, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder};

use crate::accounts::{AccountBudgetBackend, Bucket, Reservation};
pub use crate::component_cache::ComponentCache;
use crate::entropy::EntropySource;
use crate::fault::PolicyFault;
use crate::limits;
use crate::shared_state::{EmbeddedSharedState, SharedStateBackend};

// wit/ is a link to the repository's wit/ (the packaged crate holds a copy).
wasmtime::component::bindgen!({ world: "agent-retry", path: "wit" });

pub use agent_retry::policy::types;

/// Fuel for one call into the component (about one unit per wasm instruction).
/// A decision's calls take tens of thousands (a 503 with `Retry-After`:
/// about 27,000), the costliest hostile tool error 6.9 M (the sandbox
/// tests print both); a policy stuck in a loop runs out and traps.
pub const FUEL_PER_CALL: u64 = 20_000_000;

/// Fuel for loading a configuration (`from-json`), on top of [`FUEL_PER_CALL`],
/// per byte of its text. Its cost is linear in the text, and it is loaded off
/// the decision path (once per update, in the gate): 10,000 namespaced tools
/// take about 83 million fuel (120 a byte). The costliest shape measured, an
/// array of zeros, takes 435 a byte in wasmtime (`cargo test --release -p
/// agent-retry-harness --test host -- --nocapture costliest`) and 904 in the
/// Node host, whose count is an upper bound: 2,000 leaves every host twice that.
pub const FUEL_PER_CONFIG_BYTE: u64 = 2_000;

/// The most resources (policies and runs) alive at once in one instance.
pub const MAX_RESOURCE_HANDLES: usize = 1_000_000;

/// The most linear memory one instance may grow to.
pub const MAX_MEMORY_BYTES: usize = 64 << 20;

/// The contract version this host speaks (the WIT package `agent-retry:policy`).
pub const CONTRACT_VERSION: &str = "0.9.0";

/// The policy interface of that version, as the component exports it.
pub const POLICY_INTERFACE: &str = "agent-retry:policy/policy@0.9.0";

/// The component this crate was built with, if it carries one: the published
/// crate embeds the `.wasm` of its release (`make dist` copies it into
/// `component/` before `cargo package`); a build from the repository does not.
#[cfg(agent_retry_bundled)]
pub const BUNDLED_WASM: Option<&[u8]> = Some(include_bytes!(env!("AGENT_RETRY_BUNDLED_WASM")));
/// The component this crate was built with, if it carries one (this build does not).
#[cfg(not(agent_retry_bundled))]
pub const BUNDLED_WASM: Option<&[u8]> = None;

/// The component to load when none is named: `$AGENT_RETRY_WASM`, else where
/// `make wasm` puts it in the repository. (`PolicyComponent::load(None)` also
/// uses the component embedded in the crate, when it has one, before the latter.)
pub fn default_wasm_path() -> PathBuf {
    if let Some(path) = std::env::var_os("AGENT_RETRY_WASM").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join("target/component/agent_retry_policy.wasm")
}

/// The part of a version that must match for two sides to work together
/// (semver): the major, or for 0.x the major and the minor.
fn compatibility(version: &str) -> &str {
    let mut parts = version.splitn(3, '.');
    let major = parts.next().unwrap_or("");
    let minor = parts.next().unwrap_or("");
    if major == "0" { &version[..(major.len() + 1 + minor.len()).min(version.len())] } else { major }
}

/// Refuses a component whose policy interface is of another contract version,
/// naming both versions, and one that does not export the policy interface at
/// all (another world), naming what it exports.
pub fn check_contract_version(exports: &[String]) -> Result<(), LoadError> {
    let prefix = "agent-retry:policy/policy@";
    if !exports.iter().any(|name| name.starts_with(prefix)) {
        return Err(LoadError::Incompatible {
            reason: format!(
                "the component is of another world: it exports [{}], not {POLICY_INTERFACE}",
                exports.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    for name in exports {
        if let Some(theirs) = name.strip_prefix(prefix)
            && compatibility(theirs) != compatibility(CONTRACT_VERSION)
        {
            return Err(LoadError::Incompatible {
                reason: format!("the component speaks agent-retry:policy@{theirs}, this host speaks agent-retry:policy@{CONTRACT_VERSION}"),
            });
        }
    }
    Ok(())
}

/// A component that could not be loaded. Nothing was run.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read.
    Read { path: PathBuf, reason: String },
    /// The bytes are not a valid WebAssembly component.
    Invalid { reason: String },
    /// A valid component, but not an agent-retry policy this host can run: it
    /// imports something the host does not provide, or lacks the exports.
    Incompatible { reason: String },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, reason } => write!(
                f,
                "cannot read the policy component {}: {reason} (point AGENT_RETRY_WASM or the path argument at an \
                 agent_retry_policy.wasm, or unset AGENT_RETRY_WASM to use the one embedded in the published crate; \
                 in the repository, `make wasm` builds it)",
                path.display()
            ),
            LoadError::Invalid { reason } => write!(f, "not a valid WebAssembly component: {reason}"),
            LoadError::Incompatible { reason } => write!(f, "not an agent-retry policy component this host can run: {reason}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// What the host gives every instance: the shared account budget, the shared
/// state (the circuit breakers) and entropy. Instances made from one
/// `HostServices` (or its clones) share its account budget and its state.
#[derive(Clone)]
pub struct HostServices {
    pub accounts: Arc<dyn AccountBudgetBackend>,
    pub shared_state: Arc<dyn SharedStateBackend>,
    pub entropy: Arc<EntropySource>,
}

impl HostServices {
    /// With a fresh [`EmbeddedSharedState`].
    pub fn new(accounts: Arc<dyn AccountBudgetBackend>, entropy: EntropySource) -> Self {
        HostServices { accounts, shared_state: Arc::new(EmbeddedSharedState::new()), entropy: Arc::new(entropy) }
    }

    /// The same services with another shared state (e.g. one several `HostServices` share).
    pub fn with_shared_state(self, shared_state: Arc<dyn SharedStateBackend>) -> Self {
        HostServices { shared_state, ..self }
    }
}

/// How far one instance may go: fuel per call and linear memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Fuel for one call (about one unit per wasm instruction).
    pub fuel_per_call: u64,
    /// More fuel for `from-json`, per byte of the configuration ([`FUEL_PER_CONFIG_BYTE`]).
    pub fuel_per_config_byte: u64,
    /// The most linear memory one instance may grow to, in bytes.
    pub max_memory_bytes: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits { fuel_per_call: FUEL_PER_CALL, fuel_per_config_byte: FUEL_PER_CONFIG_BYTE, max_memory_bytes: MAX_MEMORY_BYTES }
    }
}

/// The store's data: the services, and the memory limits.
pub struct HostState {
    services: HostServices,
    limits: MemoryLimiter,
}

/// wasmtime's limits, remembering whether a `memory.grow` was refused during the
/// current call (the guest then traps on its own, and the trap's cause is the cap).
struct MemoryLimiter {
    limits: StoreLimits,
    refused: bool,
    /// The linear memory granted so far, in bytes.
    granted_bytes: usize,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        self.refused |= !allowed;
        if allowed {
            self.granted_bytes = self.granted_bytes.max(desired);
        }
        Ok(allowed)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

impl agent_retry::policy::account_budget::Host for HostState {
    fn reserve(
        &mut self,
        account_id: String,
        tokens: u32,
        bucket: agent_retry::policy::account_budget::Bucket,
        max_wait_ms: u64,
        now_ms: u64,
    ) -> agent_retry::policy::account_budget::Reservation {
        use agent_retry::policy::account_budget::Reservation as Wit;
        let bucket = Bucket { capacity: bucket.capacity, refill_interval_ms: bucket.refill_interval_ms };
        match self.services.accounts.reserve(&account_id, tokens, bucket, max_wait_ms, now_ms) {
            Reservation::Granted(wait) => Wit::Granted(wait),
            Reservation::Refused(wait) => Wit::Refused(wait),
        }
    }

    fn refund(&mut self, account_id: String, tokens: u32, bucket: agent_retry::policy::account_budget::Bucket, now_ms: u64) {
        let bucket = Bucket { capacity: bucket.capacity, refill_interval_ms: bucket.refill_interval_ms };
        self.services.accounts.refund(&account_id, tokens, bucket, now_ms);
    }
}

impl agent_retry::policy::shared_state::Host for HostState {
    fn load(&mut self, key: String, now_ms: u64) -> agent_retry::policy::shared_state::Loaded {
        let loaded = self.services.shared_state.load(&key, now_ms);
        // A text past the longest any store keeps is not copied into the guest (whatever backend read it).
        let value = loaded.value.filter(|v| v.len() <= crate::shared_state::MAX_VALUE_BYTES);
        agent_retry::policy::shared_state::Loaded { value, version: loaded.version, now_ms: loaded.now_ms }
    }

    fn store_if(&mut self, key: String, expected_version: u64, value: String, ttl_ms: u64) -> bool {
        self.services.shared_state.store_if(&key, expected_version, &value, ttl_ms)
    }
}

/// A compiled, linked policy component, ready to instantiate many times
/// (cloning it is cheap: the compiled code is shared).
#[derive(Clone)]
pub struct PolicyComponent {
    engine: Engine,
    component: Component,
    pre: AgentRetryPre<HostState>,
    limits: SandboxLimits,
    /// `agent-retry:policy@<version> wasm <12 hex of the .wasm's SHA-256>`.
    identity: Arc<str>,
}

impl PolicyComponent {
    /// Loads and compiles the component: `path` if given, else `$AGENT_RETRY_WASM`,
    /// else the component embedded in the crate ([`BUNDLED_WASM`], the published
    /// crate's), else the repository's build output (`make wasm`).
    pub fn load(path: Option<&Path>) -> Result<Self, LoadError> {
        if let Some(path) = path {
            return Self::from_file(path);
        }
        if let Some(path) = std::env::var_os("AGENT_RETRY_WASM").filter(|p| !p.is_empty()) {
            return Self::from_file(Path::new(&path));
        }
        match BUNDLED_WASM {
            Some(bytes) => Self::from_bytes(bytes),
            None => Self::from_file(&default_wasm_path()),
        }
    }

    /// Loads and compiles a component from a file.
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        let bytes = std::fs::read(path).map_err(|e| LoadError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        Self::from_bytes(&bytes)
    }

    /// Loads and compiles a component from its bytes (the compiled code
    /// cached in the default [`ComponentCache`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, LoadError> {
        Self::from_bytes_cached(bytes, &ComponentCache::Default)
    }

    /// Loads and compiles a component from a file, the compiled code cached in `cache`.
    pub fn from_file_cached(path: &Path, cache: &ComponentCache) -> Result<Self, LoadError> {
        let bytes = std::fs::read(path).map_err(|e| LoadError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        Self::from_bytes_cached(&bytes, cache)
    }

    /// Loads a component from its bytes: compiled, or the compiled code an
    /// earlier process cached in `cache` for the same bytes and engine.
    pub fn from_bytes_cached(bytes: &[u8], cache: &ComponentCache) -> Result<Self, LoadError> {
        let mut config = Config::new();
        // Component-model async is not used; without it a call costs ~3x less.
        config.concurrency_support(false);
        config.consume_fuel(true);
        let engine = Engine::new(&config).map_err(|e| LoadError::Invalid { reason: format!("{e:#}") })?;
        let (component, _cached) = crate::component_cache::compile(&engine, bytes, cache).map_err(|e| LoadError::Invalid { reason: format!("{e:#}") })?;
        let exports: Vec<String> = component.component_type().exports(&engine).map(|(name, _)| name.to_string()).collect();
        check_contract_version(&exports)?;
        let mut linker: Linker<HostState> = Linker::new(&engine);
        let incompatible = |e: wasmtime::Error| LoadError::Incompatible { reason: format!("{e:#}") };
        agent_retry::policy::account_budget::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(incompatible)?;
        agent_retry::policy::shared_state::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(incompatible)?;
        add_random(&mut linker, &component, &engine).map_err(incompatible)?;
        let instance_pre = linker.instantiate_pre(&component).map_err(incompatible)?;
        let pre = AgentRetryPre::new(instance_pre).map_err(incompatible)?;
        let version = exports.iter().find_map(|name| name.strip_prefix("agent-retry:policy/policy@")).unwrap_or(CONTRACT_VERSION);
        let digest: String = <sha2::Sha256 as sha2::Digest>::digest(bytes).iter().take(6).map(|b| format!("{b:02x}")).collect();
        let identity = Arc::from(format!("agent-retry:policy@{version} wasm {digest}"));
        Ok(PolicyComponent { engine, component, pre, limits: SandboxLimits::default(), identity })
    }

    /// Sets the fuel each call may burn (default [`FUEL_PER_CALL`]).
    pub fn with_fuel_per_call(mut self, fuel: u64) -> Self {
        self.limits.fuel_per_call = fuel;
        self
    }

    /// Sets the fuel `from-json` gets per byte of configuration, on top of a
    /// call's (default [`FUEL_PER_CONFIG_BYTE`]).
    pub fn with_fuel_per_config_byte(mut self, fuel: u64) -> Self {
        self.limits.fuel_per_config_byte = fuel;
        self
    }

    /// Sets the most linear memory an instance may grow to (default [`MAX_MEMORY_BYTES`]).
    pub fn with_max_memory_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_memory_bytes = bytes;
        self
    }

    /// Sets every limit.
    pub fn with_limits(mut self, limits: SandboxLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits each instance runs under.
    pub fn limits(&self) -> SandboxLimits {
        self.limits
    }

    /// Which policy this is, for logs: `agent-retry:policy@0.9.0 wasm 1a2b3c4d5e6f`
    /// (the contract version it speaks and its `.wasm`'s SHA-256, 12 hex digits).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The interfaces the component imports, as `name` strings.
    pub fn imports(&self) -> Vec<String> {
        self.component.component_type().imports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }

    /// The interfaces the component exports.
    pub fn exports(&self) -> Vec<String> {
        self.component.component_type().exports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }

    /// A fresh instance with its own memory. Runs live in one instance.
    pub fn instantiate(&self, services: HostServices) -> wasmtime::Result<PolicyInstance> {
        let limits = StoreLimitsBuilder::new().memory_size(self.limits.max_memory_bytes).instances(4).tables(16).memories(4).build();
        let mut store = Store::new(&self.engine, HostState { services, limits: MemoryLimiter { limits, refused: false, granted_bytes: 0 } });
        store.limiter(|state| &mut state.limits);
        // Runs are resources: wasmtime's default of 100,000 live handles a store
        // would refuse the 100,000th run in flight before memory does.
        store.set_max_component_handles(MAX_RESOURCE_HANDLES);
        store.set_fuel(self.limits.fuel_per_call)?;
        let instance = self.pre.instance_pre().instantiate(&mut store)?;
        let bindings = AgentRetry::new(&mut store, &instance)?;
        Ok(PolicyInstance {
            component: self.clone(),
            store,
            instance,
            bindings,
            limits: self.limits,
            tank: self.limits.fuel_per_call,
            broken: None,
            identity: Arc::clone(&self.identity),
            rule_names: None,
        })
    }
}

/// Supplies `wasi:random/random`, at whatever 0.2.x version the component
/// imports, from the host's entropy source. The guest uses it only when a host
/// passes no entropy.
fn add_random(linker: &mut Linker<HostState>, component: &Component, engine: &Engine) -> wasmtime::Result<()> {
    let names: Vec<String> =
        component.component_type().imports(engine).map(|(name, _)| name.to_string()).filter(|name| name.starts_with("wasi:random/random@")).collect();
    for name in names {
        let mut instance = linker.instance(&name)?;
        instance.func_wrap("get-random-u64", |store, (): ()| Ok((store.data().services.entropy.next_u64(),)))?;
        instance.func_wrap("get-random-bytes", |store, (len,): (u64,)| {
            // The guest never asks for more than a few bytes; cap what a bad one could ask.
            let len = usize::try_from(len.min(4096)).unwrap_or(4096);
            let entropy = &store.data().services.entropy;
            let bytes: Vec<u8> = (0..len.div_ceil(8)).flat_map(|_| entropy.next_u64().to_le_bytes()).take(len).collect();
            Ok((bytes,))
        })?;
    }
    Ok(())
}

/// What one attempt came to, as the host saw it: the four reports of the
/// contract (`record-success`, `record-empty-result`, `record-failure`,
/// `record-status-check`), as one value for a host's loop ([`PolicyInstance::record`]).
#[derive(Clone, Debug)]
pub enum Outcome {
    Success,
    /// A result that was empty or unusable; what was wrong, for the model.
    EmptyResult(String),
    Failure(types::Observation),
    StatusCheck(types::StatusCheckResult),
    /// What the server said of the call's task (`record-task-status`).
    Task(types::TaskReport),
    /// A failed poll of the call's task (`record-poll-failure`).
    PollFailure(types::Observation),
}

/// `begin-call`'s answer with the hand-off read when the call is not
/// admitted ([`PolicyInstance::begin`]).
#[derive(Clone, Debug)]
pub enum Admission {
    /// Send the first attempt (after `delay-ms`).
    Send(types::CallStart),
    /// Do not send: the run stopped here.
    Escalate(types::Escalation),
    /// Do not send: a circuit breaker of the server is open, and the call is
    /// over as a replan (the decision's message is for the model).
    Replan(types::CallStart, types::Decision),
}

impl types::Observation {
    /// An observation with headers given as pairs (joined as `name: value`
    /// lines), no structured content, no session id sent, delivery `unknown`.
    pub fn new(kind: types::FailureKind, headers: &[(String, String)], body: impl Into<String>) -> Self {
        types::Observation {
            kind,
            headers: limits::header_lines(headers),
            body: body.into(),
            structured_content: None,
            session_id_sent: false,
            delivery: types::Delivery::Unknown,
        }
    }

    /// The same observation with `delivery`.
    pub fn delivered(mut self, delivery: types::Delivery) -> Self {
        self.delivery = delivery;
        self
    }
}

/// A policy component instance: one store, one instance, typed calls.
///
/// Every call refills the fuel first. A call that fails returns a
/// [`PolicyFault`] with its cause; the instance is then broken (later calls
/// answer [`PolicyFault::InstanceUnusable`] without entering the guest), and the
/// host handles the run as escalated and instantiates a fresh one.
pub struct PolicyInstance {
    /// What it was instantiated from, for [`PolicyInstance::sibling`].
    component: PolicyComponent,
    store: Store<HostState>,
    instance: Instance,
    bindings: AgentRetry,
    limits: SandboxLimits,
    /// The fuel the last call was given.
    tank: u64,
    /// The first fault, once a call failed.
    broken: Option<String>,
    identity: Arc<str>,
    /// `rule-names()`, once read.
    rule_names: Option<Arc<[String]>>,
}

/// `too-large`, as the component answers it, for an id over 256 bytes.
fn id_within_limit(input: &str, value: &str) -> Result<(), types::RunError> {
    within_limit(input, value, limits::MAX_ID_BYTES)
}

fn within_limit(input: &str, value: &str, limit_bytes: usize) -> Result<(), types::RunError> {
    if value.len() <= limit_bytes {
        return Ok(());
    }
    let size_bytes = u32::try_from(value.len()).unwrap_or(u32::MAX);
    Err(types::RunError::TooLarge(types::SizeLimit { input: input.to_string(), size_bytes, limit_bytes: limit_bytes as u32 }))
}

fn too_large(check: Result<(), (&'static str, usize, usize)>) -> Result<(), PolicyFault> {
    check.map_err(|(input, size_bytes, limit_bytes)| PolicyFault::InputTooLarge { input, size_bytes, limit_bytes })
}

/// A snapshot refused before it crossed, or after, for its size.
fn snapshot_too_large(message: String) -> types::SnapshotError {
    types::SnapshotError { kind: types::SnapshotErrorKind::TooLarge, message }
}

/// A policy resource in an instance, with the size of the configuration it was
/// loaded from (its `effective-config` is as long: that call gets the load's tank).
pub struct PolicyHandle(ResourceAny, usize);
/// A run resource in an instance.
pub struct RunHandle(ResourceAny);

impl PolicyInstance {
    /// Runs one call into the guest: on a full tank, with the fault typed and the
    /// instance marked broken if it fails.
    fn guarded<T>(&mut self, call: impl FnOnce(&AgentRetry, &mut Store<HostState>) -> wasmtime::Result<T>) -> Result<T, PolicyFault> {
        self.guarded_on(self.limits.fuel_per_call, call)
    }

    /// [`Self::guarded`] on a tank of `fuel`.
    fn guarded_on<T>(&mut self, fuel: u64, call: impl FnOnce(&AgentRetry, &mut Store<HostState>) -> wasmtime::Result<T>) -> Result<T, PolicyFault> {
        if let Some(first_fault) = &self.broken {
            return Err(PolicyFault::InstanceUnusable { first_fault: first_fault.clone() });
        }
        self.store.data_mut().limits.refused = false;
        self.tank = fuel;
        let result = self.store.set_fuel(fuel).and_then(|()| call(&self.bindings, &mut self.store));
        result.map_err(|error| {
            let fault = PolicyFault::of(&error, self.store.data().limits.refused, fuel, self.limits.max_memory_bytes);
            self.broken = Some(fault.to_string());
            fault
        })
    }

    /// The component's identity ([`PolicyComponent::identity`]).
    pub fn policy_identity(&self) -> &str {
        &self.identity
    }

    /// Whether an earlier call failed (the instance is then not entered again).
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// The guest's linear memory, in bytes (it never shrinks).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limits.granted_bytes
    }

    /// The fuel the last call burned (about one unit per wasm instruction).
    pub fn fuel_used_by_last_call(&self) -> u64 {
        self.tank.saturating_sub(self.store.get_fuel().unwrap_or(0))
    }

    /// The store and the raw instance, for dynamic calls (the conformance runner).
    pub fn raw(&mut self) -> (&mut Store<HostState>, &Instance) {
        self.raw_on(self.limits.fuel_per_call)
    }

    /// [`Self::raw`] on a tank of `fuel` (`from-json`'s: [`Self::config_load_fuel`]).
    pub fn raw_on(&mut self, fuel: u64) -> (&mut Store<HostState>, &Instance) {
        self.tank = fuel;
        self.store.data_mut().limits.refused = false;
        let _ = self.store.set_fuel(fuel);
        (&mut self.store, &self.instance)
    }

    /// The fault a call made through [`Self::raw`] failed with, typed as the
    /// typed calls type it (a refused `memory.grow` is the memory cap, not a trap).
    pub fn raw_fault(&self, error: &wasmtime::Error) -> PolicyFault {
        PolicyFault::of(error, self.store.data().limits.refused, self.tank, self.limits.max_memory_bytes)
    }

    /// The fuel `from-json` gets for a text of `config_bytes`: a call's, plus
    /// [`SandboxLimits::fuel_per_config_byte`] for each byte up to the 1 MiB
    /// limit (over it the policy refuses the text before reading it).
    pub fn config_load_fuel(&self, config_bytes: usize) -> u64 {
        let bytes = config_bytes.min(limits::MAX_CONFIG_BYTES) as u64;
        self.limits.fuel_per_call.saturating_add(self.limits.fuel_per_config_byte.saturating_mul(bytes))
    }

    /// The contract's key for an intended call; ids over 256 bytes are refused
    /// before they cross ([`PolicyFault::InputTooLarge`]).
    pub fn derive_idempotency_key(&mut self, run_id: &str, action_id: &str) -> Result<String, PolicyFault> {
        too_large(limits::check("run-id", run_id, limits::MAX_ID_BYTES))?;
        too_large(limits::check("action-id", action_id, limits::MAX_ID_BYTES))?;
        self.guarded(|b, store| b.agent_retry_policy_policy().call_derive_idempotency_key(store, run_id, action_id))
    }

    /// Parses a configuration; `Ok(Err(_))` is a rejected configuration (one
    /// over 1 MiB without crossing the boundary, as the component would answer).
    pub fn load_policy(&mut self, config_json: &str) -> Result<Result<PolicyHandle, types::ConfigError>, PolicyFault> {
        if config_json.len() > limits::MAX_CONFIG_BYTES {
            let message = format!("the configuration is {} bytes, more than the {}-byte limit", config_json.len(), limits::MAX_CONFIG_BYTES);
            return Ok(Err(types::ConfigError { kind: types::ConfigErrorKind::TooLarge, field: String::new(), message }));
        }
        // Linear in the text and off the decision path: its own tank (FUEL_PER_CONFIG_BYTE).
        let fuel = self.config_load_fuel(config_json.len());
        let config_bytes = config_json.len();
        self.guarded_on(fuel, |b, store| Ok(b.agent_retry_policy_policy().policy().call_from_json(store, config_json)?.map(|p| PolicyHandle(p, config_bytes))))
    }

    pub fn effective_config(&mut self, policy: &PolicyHandle) -> Result<String, PolicyFault> {
        // Its cost is linear in the configuration, as the load's: the same tank.
        let fuel = self.config_load_fuel(policy.1);
        self.guarded_on(fuel, |b, store| b.agent_retry_policy_policy().policy().call_effective_config(store, policy.0))
    }

    /// Classifies an observation (within the host's limits).
    pub fn classify(&mut self, policy: &PolicyHandle, observation: &types::Observation, now_ms: u64) -> Result<types::Classification, PolicyFault> {
        let observation = limits::bounded_observation(observation);
        self.guarded(|b, store| b.agent_retry_policy_policy().policy().call_classify(store, policy.0, &observation, now_ms))
    }

    /// What an answer to the `server/discover` probe that is not a discovery
    /// result means: the policy's rule, not the host's.
    pub fn read_probe_answer(&mut self, http_status: Option<u16>, json_rpc_code: Option<i32>) -> Result<types::ProbeAnswer, PolicyFault> {
        self.guarded(|b, store| b.agent_retry_policy_policy().call_read_probe_answer(store, http_status, json_rpc_code))
    }

    pub fn next_delay(&mut self, policy: &PolicyHandle, retry: u32, hint_ms: Option<u64>, entropy: Option<u64>) -> Result<u64, PolicyFault> {
        self.guarded(|b, store| b.agent_retry_policy_policy().policy().call_next_delay(store, policy.0, retry, hint_ms, entropy))
    }

    /// Starts a run; `Ok(Err(too-large))` for a run id over 256 bytes (without
    /// crossing the boundary, as the component would answer).
    pub fn start_run(&mut self, policy: &PolicyHandle, run_id: &str) -> Result<Result<RunHandle, types::RunError>, PolicyFault> {
        if let Err(limit) = id_within_limit("run-id", run_id) {
            return Ok(Err(limit));
        }
        self.guarded(|b, store| Ok(b.agent_retry_policy_policy().policy().call_start_run(store, policy.0, run_id)?.map(RunHandle)))
    }

    /// Asks to begin a call; a tool name or key over 256 bytes is refused as
    /// the component would refuse it, without crossing. When the call is not
    /// admitted, [`Self::escalation`] has the hand-off.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_call(
        &mut self,
        run: &RunHandle,
        server: Option<&str>,
        tool: &str,
        idempotency_key: Option<&str>,
        hints: Option<types::ToolHints>,
        now_ms: u64,
    ) -> Result<Result<types::CallStart, types::RunError>, PolicyFault> {
        let ids = id_within_limit("tool", tool)
            .and_then(|()| server.map_or(Ok(()), |s| within_limit("server", s, limits::MAX_SERVER_BYTES)))
            .and_then(|()| idempotency_key.map_or(Ok(()), |k| id_within_limit("idempotency-key", k)));
        if let Err(limit) = ids {
            return Ok(Err(limit));
        }
        self.guarded(|b, store| b.agent_retry_policy_policy().run().call_begin_call(store, run.0, server, tool, idempotency_key, hints, now_ms))
    }

    /// The circuit breakers' changes the run's last `begin-call` or report made
    /// (ask when its `breaker-changed` says so).
    pub fn take_breaker_changes(&mut self, run: &RunHandle) -> Result<Vec<types::BreakerChange>, PolicyFault> {
        let changes = self.guarded(|b, store| b.agent_retry_policy_policy().run().call_take_breaker_changes(store, run.0))?;
        // Bounded as every text the guest hands out: a few changes of one line each.
        Ok(changes
            .into_iter()
            .take(16)
            .map(|mut c| {
                c.why = limits::cut(&c.why, 1024).to_string();
                c.server = limits::cut(&c.server, 256).to_string();
                c
            })
            .collect())
    }

    /// The names `verdict.rule-index` indexes, read once per instance.
    pub fn rule_names(&mut self) -> Result<Arc<[String]>, PolicyFault> {
        if let Some(names) = &self.rule_names {
            return Ok(Arc::clone(names));
        }
        let names: Arc<[String]> = self.guarded(|b, store| b.agent_retry_policy_policy().call_rule_names(store))?.into();
        self.rule_names = Some(Arc::clone(&names));
        Ok(names)
    }

    /// The name of the rule a verdict names (`rule-index`), or `?` for an index
    /// the component does not list.
    pub fn rule_name(&mut self, verdict: &types::Verdict) -> Result<String, PolicyFault> {
        let names = self.rule_names()?;
        Ok(names.get(usize::from(verdict.rule_index)).cloned().unwrap_or_else(|| String::from("?")))
    }

    /// Reports an attempt that returned a usable result.
    pub fn record_success(&mut self, run: &RunHandle, call_id: u32, attempt: u32, now_ms: u64) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        self.guarded(|b, store| b.agent_retry_policy_policy().run().call_record_success(store, run.0, call_id, attempt, now_ms))
    }

    /// Reports an attempt whose result was empty or unusable (`detail` within
    /// the body limit).
    pub fn record_empty_result(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        detail: &str,
        now_ms: u64,
    ) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        let detail = limits::cut(detail, limits::MAX_BODY_BYTES);
        self.guarded(|b, store| b.agent_retry_policy_policy().run().call_record_empty_result(store, run.0, call_id, attempt, detail, now_ms))
    }

    /// Reports a failed attempt as observed, within the host's limits.
    /// `time_left_ms` is the time to the call's or run's deadline, if there is
    /// one. With `entropy` `None`, the host's entropy source is used.
    #[allow(clippy::too_many_arguments)]
    pub fn record_failure(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        observation: &types::Observation,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: Option<u64>,
    ) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        let entropy = entropy.unwrap_or_else(|| self.store.data().services.entropy.next_u64());
        let observation = limits::bounded_observation(observation);
        self.guarded(|b, store| {
            b.agent_retry_policy_policy().run().call_record_failure(store, run.0, call_id, attempt, &observation, time_left_ms, now_ms, entropy)
        })
    }

    /// Reports what a status check found.
    #[allow(clippy::too_many_arguments)]
    pub fn record_status_check(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        result: types::StatusCheckResult,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: Option<u64>,
    ) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        let entropy = entropy.unwrap_or_else(|| self.store.data().services.entropy.next_u64());
        self.guarded(|b, store| {
            b.agent_retry_policy_policy().run().call_record_status_check(store, run.0, call_id, attempt, result, time_left_ms, now_ms, entropy)
        })
    }

    /// Reports what the server said of the call's task (its message and id within the host's limits).
    #[allow(clippy::too_many_arguments)]
    pub fn record_task_status(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        task: &types::TaskReport,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: Option<u64>,
    ) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        let entropy = entropy.unwrap_or_else(|| self.store.data().services.entropy.next_u64());
        let mut task = task.clone();
        task.message = limits::cut(&task.message, limits::MAX_BODY_BYTES).to_string();
        self.guarded(|b, store| {
            b.agent_retry_policy_policy().run().call_record_task_status(store, run.0, call_id, attempt, &task, time_left_ms, now_ms, entropy)
        })
    }

    /// Reports a failed poll of the call's task as observed, within the host's limits.
    #[allow(clippy::too_many_arguments)]
    pub fn record_poll_failure(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        observation: &types::Observation,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: Option<u64>,
    ) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        let entropy = entropy.unwrap_or_else(|| self.store.data().services.entropy.next_u64());
        let observation = limits::bounded_observation(observation);
        self.guarded(|b, store| {
            b.agent_retry_policy_policy().run().call_record_poll_failure(store, run.0, call_id, attempt, &observation, time_left_ms, now_ms, entropy)
        })
    }

    /// Reports what an attempt (or a status check) came to, through the one
    /// function of the contract that takes it.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        outcome: &Outcome,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: Option<u64>,
    ) -> Result<Result<types::Verdict, types::RunError>, PolicyFault> {
        match outcome {
            Outcome::Success => self.record_success(run, call_id, attempt, now_ms),
            Outcome::EmptyResult(detail) => self.record_empty_result(run, call_id, attempt, detail, now_ms),
            Outcome::Failure(observation) => self.record_failure(run, call_id, attempt, observation, time_left_ms, now_ms, entropy),
            Outcome::StatusCheck(result) => self.record_status_check(run, call_id, attempt, *result, time_left_ms, now_ms, entropy),
            Outcome::Task(task) => self.record_task_status(run, call_id, attempt, task, time_left_ms, now_ms, entropy),
            Outcome::PollFailure(observation) => self.record_poll_failure(run, call_id, attempt, observation, time_left_ms, now_ms, entropy),
        }
    }

    /// `begin-call`, with the run's hand-off read when the call is not admitted.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &mut self,
        run: &RunHandle,
        server: Option<&str>,
        tool: &str,
        idempotency_key: Option<&str>,
        hints: Option<types::ToolHints>,
        now_ms: u64,
    ) -> Result<Result<Admission, types::RunError>, PolicyFault> {
        let start = match self.begin_call(run, server, tool, idempotency_key, hints, now_ms)? {
            Ok(start) => start,
            Err(error) => return Ok(Err(error)),
        };
        if start.admitted {
            return Ok(Ok(Admission::Send(start)));
        }
        if start.replan {
            return match self.last_decision(run, start.call_id)? {
                Some(decision) => Ok(Ok(Admission::Replan(start, decision))),
                None => Err(PolicyFault::BoundaryViolation { cause: "begin-call answered a replan, and the call has no decision".into() }),
            };
        }
        match self.escalation(run)? {
            Some(escalation) => Ok(Ok(Admission::Escalate(escalation))),
            None => Err(PolicyFault::BoundaryViolation { cause: "begin-call did not admit the call, and the run has no escalation".into() }),
        }
    }

    /// [`Self::record`], answered with the decision in words (`last-decision`):
    /// for a host that shows or logs every decision.
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        outcome: &Outcome,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: Option<u64>,
    ) -> Result<Result<types::Decision, types::RunError>, PolicyFault> {
        if let Err(error) = self.record(run, call_id, attempt, outcome, time_left_ms, now_ms, entropy)? {
            return Ok(Err(error));
        }
        match self.last_decision(run, call_id)? {
            Some(decision) => Ok(Ok(decision)),
            None => Err(PolicyFault::BoundaryViolation { cause: format!("last-decision has no decision for call {call_id} right after its verdict") }),
        }
    }

    /// A fresh instance of the same component, with the same services (for
    /// a question asked off the run's instance, e.g. a probe's answer).
    pub fn sibling(&self) -> wasmtime::Result<PolicyInstance> {
        self.component.instantiate(self.store.data().services.clone())
    }

    /// Makes [`Self::sibling`]s later, from another thread.
    pub fn sibling_factory(&self) -> impl Fn() -> wasmtime::Result<PolicyInstance> + Send + Sync + 'static {
        let (component, services) = (self.component.clone(), self.store.data().services.clone());
        move || component.instantiate(services.clone())
    }

    /// Ends a call the host stopped before a verdict ended it (`why`: the
    /// caller cancelled it, or its deadline passed), so that it no longer
    /// counts as open. `sent`: whether `attempt` had left without an answer
    /// (then a write is listed as an `unknown` effect).
    pub fn abandon_call(
        &mut self,
        run: &RunHandle,
        call_id: u32,
        attempt: u32,
        sent: bool,
        why: types::AbandonReason,
    ) -> Result<Result<(), types::RunError>, PolicyFault> {
        self.guarded(|b, store| b.agent_retry_policy_policy().run().call_abandon_call(store, run.0, call_id, attempt, sent, why))
    }

    /// The run's last decision in words, if it was about `call_id`.
    pub fn last_decision(&mut self, run: &RunHandle, call_id: u32) -> Result<Option<types::Decision>, PolicyFault> {
        // Its texts are cut before any host code logs or returns them.
        Ok(self.guarded(|b, store| b.agent_retry_policy_policy().run().call_last_decision(store, run.0, call_id))?.map(limits::bounded_decision))
    }

    /// The run's hand-off, once it has escalated.
    pub fn escalation(&mut self, run: &RunHandle) -> Result<Option<types::Escalation>, PolicyFault> {
        Ok(self.guarded(|b, store| b.agent_retry_policy_policy().run().call_escalation(store, run.0))?.map(limits::bounded_escalation))
    }

    /// What happened in the run so far (its effects bounded: see [`Self::effects`]).
    pub fn report(&mut self, run: &RunHandle) -> Result<types::RunReport, PolicyFault> {
        self.guarded(|b, store| b.agent_retry_policy_policy().run().call_report(store, run.0))
    }

    /// The run's effects from the `start`-th, at most `max_count` (≤ 1,000) a page.
    pub fn effects(&mut self, run: &RunHandle, start: u32, max_count: u32) -> Result<Vec<types::EffectRecord>, PolicyFault> {
        self.guarded(|b, store| b.agent_retry_policy_policy().run().call_effects(store, run.0, start, max_count))
    }

    /// Every effect of the run, page by page.
    pub fn all_effects(&mut self, run: &RunHandle) -> Result<Vec<types::EffectRecord>, PolicyFault> {
        let mut all = Vec::new();
        loop {
            let page = self.effects(run, u32::try_from(all.len()).unwrap_or(u32::MAX), 1000)?;
            if page.is_empty() {
                return Ok(all);
            }
            all.extend(page);
        }
    }

    /// A snapshot of an escalated run, with the stopped call's arguments
    /// (JSON, at most 1 MiB): a versioned document any host resumes
    /// ([`Self::resume_run`]). `Ok(Err(_))` is a refusal (`not-escalated`,
    /// `calls-open`, `too-large`); a text past 2 MiB from the component is
    /// refused too (`too-large`), not passed on.
    pub fn snapshot(&mut self, run: &RunHandle, arguments_json: Option<&str>, now_ms: u64) -> Result<Result<String, types::SnapshotError>, PolicyFault> {
        if let Some(arguments) = arguments_json.filter(|a| a.len() > limits::MAX_ARGUMENTS_BYTES) {
            let message = format!("arguments-json is {} bytes, more than the {}-byte limit", arguments.len(), limits::MAX_ARGUMENTS_BYTES);
            return Ok(Err(snapshot_too_large(message)));
        }
        let taken = self.guarded(|b, store| b.agent_retry_policy_policy().run().call_snapshot(store, run.0, arguments_json, now_ms))?;
        Ok(taken.and_then(|text| match text.len() {
            n if n > limits::MAX_SNAPSHOT_BYTES => {
                Err(snapshot_too_large(format!("the component's snapshot is {n} bytes, more than the {}-byte limit", limits::MAX_SNAPSHOT_BYTES)))
            }
            _ => Ok(text),
        }))
    }

    /// Resumes an escalated run from its snapshot with a person's answer, under
    /// `policy`; then [`Self::resumed_call`] says what to do. `Ok(Err(_))` is a
    /// refused snapshot (tampered, of another contract major, malformed, too
    /// large: a text past 2 MiB is refused without crossing).
    pub fn resume_run(
        &mut self,
        policy: &PolicyHandle,
        snapshot: &str,
        answer: &types::ResumeAnswer,
        now_ms: u64,
    ) -> Result<Result<RunHandle, types::SnapshotError>, PolicyFault> {
        if snapshot.len() > limits::MAX_SNAPSHOT_BYTES {
            return Ok(Err(snapshot_too_large(format!("the snapshot is {} bytes, more than the {}-byte limit", snapshot.len(), limits::MAX_SNAPSHOT_BYTES))));
        }
        if let types::ResumeAnswer::Done(Some(result)) = answer
            && result.len() > limits::MAX_ARGUMENTS_BYTES
        {
            return Ok(Err(snapshot_too_large(format!(
                "the done answer's result is {} bytes, more than the {}-byte limit",
                result.len(),
                limits::MAX_ARGUMENTS_BYTES
            ))));
        }
        // Linear in the document and off the decision path: the configuration load's tank.
        let fuel = self.config_load_fuel(snapshot.len());
        self.guarded_on(fuel, |b, store| Ok(b.agent_retry_policy_policy().policy().call_resume_run(store, policy.0, snapshot, answer, now_ms)?.map(RunHandle)))
    }

    /// The call that stopped a resumed run and what to do with it; its texts
    /// bounded as every text the guest hands out.
    pub fn resumed_call(&mut self, run: &RunHandle) -> Result<Option<types::ResumedCall>, PolicyFault> {
        let call = self.guarded(|b, store| b.agent_retry_policy_policy().run().call_resumed_call(store, run.0))?;
        Ok(call.map(|mut c| {
            c.tool = limits::cut(&c.tool, limits::MAX_ID_BYTES).to_string();
            c.idempotency_key = c.idempotency_key.map(|k| limits::cut(&k, limits::MAX_ID_BYTES).to_string());
            c.server = c.server.map(|s| limits::cut(&s, limits::MAX_SERVER_BYTES).to_string());
            // Cut JSON is not JSON: arguments past the limit are dropped, not cut.
            c.arguments_json = c.arguments_json.filter(|a| a.len() <= limits::MAX_ARGUMENTS_BYTES);
            c.result_text = c.result_text.map(|r| limits::cut(&r, limits::MAX_ARGUMENTS_BYTES).to_string());
            c
        }))
    }

    /// Frees a run in the guest.
    pub fn drop_run(&mut self, run: RunHandle) -> Result<(), PolicyFault> {
        self.guarded(|_, store| run.0.resource_drop(store))
    }

    /// Frees a policy in the guest.
    pub fn drop_policy(&mut self, policy: PolicyHandle) -> Result<(), PolicyFault> {
        self.guarded(|_, store| policy.0.resource_drop(store))
    }
}

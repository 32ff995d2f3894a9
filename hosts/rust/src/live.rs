//! A policy that operators update while the host runs: a new `.wasm`, or a new
//! configuration, read from files the host watches (or on `reload()`), or
//! published once for a whole fleet in Redis ([`crate::fleet`]), checked by a
//! gate, and swapped in atomically; `rollback()` returns to the previous good
//! one. A rejected update leaves the last good policy serving and says why.
//!
//! The gate, before anything serves:
//! 1. integrity: the `.wasm`'s SHA-256 equals a pinned digest, or, under an
//!    Ed25519 key, the signed manifest ([`crate::manifest`]: `<wasm>.manifest`,
//!    or the fleet's `{prefix}:manifest`) covers exactly what was read (the
//!    `.wasm`, the configuration, the vectors or none, the fleet's revision or
//!    none) and its signature verifies; an unsigned publication, and a
//!    signature over the `.wasm` alone (before 0.7), are refused;
//! 2. the component compiles, speaks this host's contract version and imports
//!    nothing outside the contract ([`PolicyComponent::from_bytes`]);
//! 3. the configuration loads in it;
//! 4. the gate vectors: `tests/vectors/gate.json` (compiled in: the
//!    invariants every policy must keep for the host to stay safe, as data)
//!    and the operator's own files ([`PolicySource::gate_vectors`]), run by
//!    the conformance runner on the candidate; a case without `config` runs
//!    under the candidate's configuration. The first failing case is named;
//! 5. the vectors the update ships with, if any (a file in the format of
//!    `tests/vectors/*.json`): every case must pass on the candidate.
//!
//! Before the gate, the order: a candidate older than the serving policy is
//! refused as [`UpdateError::Older`] (a fleet publication with a lower
//! revision, or files whose newest modification time is before the serving
//! files'; the same is not older). `rollback()` is not an update and is never
//! refused so. One update at a time: `reload()`, `poll()` and `rollback()`
//! hold one lock from the read to the swap, so of two reloads at once the
//! second reads after the first swapped, and the newest serves.
//!
//! Runs in flight finish on the policy they started with: a host takes
//! [`LivePolicy::current`] when it starts a run (or a worker) and keeps that
//! [`Loaded`] policy for the run; an update changes what new runs get. Every
//! decision can be attributed to exactly one policy version ([`PolicyIdentity`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::events::{Event, PolicyUpdateEvent, PolicyUpdateOutcome, RetryHooks, Telemetry};
use crate::fleet::{FleetSource, Publication};
use crate::mcp::Metrics;
use crate::{EmbeddedAccounts, EntropySource, HostServices, LoadError, PolicyComponent};

/// The gate's vectors, shipped with the crate: every update runs them.
pub const GATE_VECTORS: &str = include_str!("../gate.json");

/// Which policy made a decision: the component's digest and the configuration's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyIdentity {
    /// SHA-256 of the `.wasm`, hex.
    pub wasm_sha256: String,
    /// SHA-256 of the configuration text, hex.
    pub config_sha256: String,
    /// 1 for the policy the host started with, then one more per accepted
    /// update (never reused: after a rollback the next update gets a new number).
    pub generation: u64,
}

impl std::fmt::Display for PolicyIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "generation {} (wasm {}, config {})", self.generation, &self.wasm_sha256[..12], &self.config_sha256[..12])
    }
}

/// A policy that passed the gate: its compiled component, configuration and identity.
pub struct Loaded {
    pub component: Arc<PolicyComponent>,
    pub config_json: String,
    pub identity: PolicyIdentity,
}

/// How updates are trusted.
#[derive(Clone, Debug, Default)]
pub enum Integrity {
    /// Any `.wasm` that passes the rest of the gate (a development setting).
    #[default]
    Unchecked,
    /// Only a `.wasm` with this SHA-256 (hex).
    PinnedSha256(String),
    /// Only a publication whose signed manifest (`<wasm>.manifest`, or the
    /// fleet's `{prefix}:manifest`) covers it all and verifies under this Ed25519 key.
    Ed25519([u8; 32]),
}

/// Why an update was refused. The last good policy keeps serving.
#[derive(Debug)]
pub enum UpdateError {
    /// A file could not be read.
    Read { path: PathBuf, reason: String },
    /// The digest or signature does not match.
    Integrity(String),
    /// The component cannot run here (invalid, another contract version, foreign imports).
    Load(LoadError),
    /// The configuration does not load in the component.
    Config(String),
    /// The candidate failed a gate vector (named) or the vectors it ships
    /// with, or trapped.
    Gate(String),
    /// The fleet's Redis cannot be read, or nothing is published there.
    Fleet(String),
    /// The candidate is older than the serving policy: a fleet publication
    /// with a lower revision (a stale replica, Redis restored from an old
    /// dump), or files whose newest modification time is before the serving
    /// files' (an old copy put back with its times). `candidate` and `serving`:
    /// the two revisions, or the two times in ns since the epoch. The Python and
    /// Node hosts' `UpdateOlderError` (kind `older`).
    Older { candidate: u64, serving: u64, reason: String },
    /// `rollback()` with no previous policy.
    NothingToRollBackTo,
}

impl UpdateError {
    /// Which check refused the update, as every host names it (the Python and
    /// Node hosts' `kind`): `read`, `integrity`, `load`, `config`,
    /// `self-test`, `fleet`, `older`, `nothing-to-roll-back-to`.
    pub fn kind(&self) -> &'static str {
        match self {
            UpdateError::Read { .. } => "read",
            UpdateError::Integrity(_) => "integrity",
            UpdateError::Load(_) => "load",
            UpdateError::Config(_) => "config",
            UpdateError::Gate(_) => "self-test",
            UpdateError::Fleet(_) => "fleet",
            UpdateError::Older { .. } => "older",
            UpdateError::NothingToRollBackTo => "nothing-to-roll-back-to",
        }
    }
}

impl std::fmt::Display for UpdateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpdateError::Read { path, reason } => write!(f, "cannot read {}: {reason}", path.display()),
            UpdateError::Integrity(why) => write!(f, "integrity check failed: {why}"),
            UpdateError::Load(e) => write!(f, "{e}"),
            UpdateError::Config(why) => write!(f, "the configuration does not load: {why}"),
            UpdateError::Gate(why) => write!(f, "the gate refused it: {why}"),
            UpdateError::Fleet(why) => write!(f, "cannot read the fleet's policy: {why}"),
            UpdateError::Older { reason, .. } => write!(f, "older than the serving policy: {reason}"),
            UpdateError::NothingToRollBackTo => write!(f, "there is no previous policy to roll back to"),
        }
    }
}

impl std::error::Error for UpdateError {}

/// Where the policy comes from, and how it is trusted.
#[derive(Clone, Debug)]
pub struct PolicySource {
    pub wasm: PathBuf,
    pub config: PathBuf,
    pub integrity: Integrity,
    /// Vectors the update ships with (the format of `tests/vectors/*.json`):
    /// every case must pass on a candidate before it serves.
    pub vectors: Option<PathBuf>,
    /// The operator's gate vectors (the format of `tests/vectors/*.json`),
    /// run after the built-in `gate.json` on every candidate: a case without
    /// `config` runs under the candidate's configuration.
    pub gate_vectors: Vec<PathBuf>,
}

/// What was last read, to notice a change when polling: the files' times and
/// sizes, or the fleet's revision.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
enum Seen {
    #[default]
    Nothing,
    Files {
        wasm: Option<(SystemTime, u64)>,
        config: Option<(SystemTime, u64)>,
        vectors: Option<(SystemTime, u64)>,
        /// The manifest's, under a key: a manifest written after the files is an update.
        manifest: Option<(SystemTime, u64)>,
    },
    Revision(u64),
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// How new a read is, to refuse an older one: the fleet's revision, or the
/// files' newest modification time in ns since the epoch.
fn order(seen: &Seen) -> u64 {
    match seen {
        Seen::Nothing => 0,
        Seen::Revision(revision) => *revision,
        Seen::Files { wasm, config, vectors, manifest } => [wasm, config, vectors, manifest]
            .into_iter()
            .flatten()
            .filter_map(|(time, _)| time.duration_since(UNIX_EPOCH).ok())
            .map(|since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0),
    }
}

/// A time in ns since the epoch as UTC, `2026-12-02T15:22:41.123456789Z`, for messages.
fn utc(ns: u64) -> String {
    let (secs, nanos) = (ns / 1_000_000_000, ns % 1_000_000_000);
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z", rest / 3_600, rest / 60 % 60, rest % 60)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read(path: &Path) -> Result<Vec<u8>, UpdateError> {
    std::fs::read(path).map_err(|e| UpdateError::Read { path: path.to_path_buf(), reason: e.to_string() })
}

/// Where updates come from.
enum Origin {
    Files(PolicySource),
    /// The fleet's Redis, its integrity, and the operator's gate vectors.
    Fleet(FleetSource, Integrity, Vec<PathBuf>),
}

/// An update as read, before the gate.
struct Candidate {
    wasm: Vec<u8>,
    config: Vec<u8>,
    /// The signed manifest, if one came with it (read only under a key).
    manifest: Option<Vec<u8>>,
    /// Where the manifest was looked for, for messages.
    manifest_at: String,
    /// Where a signature over the `.wasm` alone (before 0.7) was found, if one was.
    legacy_signature_at: Option<String>,
    /// The fleet's revision the publication was read under; `None` for files.
    revision: Option<u64>,
    integrity: Integrity,
    /// The vectors shipped with the update, if any.
    vectors: Option<Vec<u8>>,
    /// The operator's gate vectors: (file, text).
    gate_vectors: Vec<(PathBuf, Vec<u8>)>,
    seen: Seen,
}

fn read_gate_vectors(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Vec<u8>)>, UpdateError> {
    paths.iter().map(|path| Ok((path.clone(), read(path)?))).collect()
}

impl Origin {
    fn seen_now(&self) -> Result<Seen, UpdateError> {
        match self {
            Origin::Files(source) => {
                let manifest = match source.integrity {
                    Integrity::Ed25519(_) => stamp(&manifest_path(&source.wasm)),
                    _ => None,
                };
                Ok(Seen::Files { wasm: stamp(&source.wasm), config: stamp(&source.config), vectors: source.vectors.as_deref().and_then(stamp), manifest })
            }
            Origin::Fleet(fleet, ..) => fleet.revision().map(Seen::Revision).map_err(UpdateError::Fleet),
        }
    }

    /// Refuses a read older than the serving policy's order ([`order`]); the
    /// same is not older (the same files or revision may be read again).
    fn not_older(&self, seen: &Seen, serving: u64) -> Result<(), UpdateError> {
        let candidate = order(seen);
        if candidate >= serving {
            return Ok(());
        }
        let reason = match self {
            Origin::Fleet(fleet, ..) => format!(
                "the publication at {} (revision {candidate}) is older than the serving policy's, revision {serving} (a stale replica, or Redis restored from an old dump?)",
                fleet.prefix
            ),
            Origin::Files(_) => format!(
                "the files' newest modification time, {}, is before the serving policy's, {} (to return to an earlier policy, use rollback())",
                utc(candidate),
                utc(serving)
            ),
        };
        Err(UpdateError::Older { candidate, serving, reason })
    }

    fn read(&self) -> Result<Candidate, UpdateError> {
        match self {
            Origin::Files(source) => {
                let seen = self.seen_now()?;
                let manifest_at = manifest_path(&source.wasm);
                let signed = matches!(source.integrity, Integrity::Ed25519(_));
                let manifest = if signed { std::fs::read(&manifest_at).ok() } else { None };
                let legacy = signature_path(&source.wasm);
                Ok(Candidate {
                    wasm: read(&source.wasm)?,
                    config: read(&source.config)?,
                    manifest,
                    manifest_at: manifest_at.display().to_string(),
                    legacy_signature_at: (signed && legacy.exists()).then(|| legacy.display().to_string()),
                    revision: None,
                    integrity: source.integrity.clone(),
                    vectors: source.vectors.as_deref().map(read).transpose()?,
                    gate_vectors: read_gate_vectors(&source.gate_vectors)?,
                    seen,
                })
            }
            Origin::Fleet(fleet, integrity, gate_vectors) => {
                let Publication { wasm, config, manifest, legacy_signature, vectors, revision } = fleet.read().map_err(UpdateError::Fleet)?;
                Ok(Candidate {
                    wasm,
                    config,
                    manifest,
                    manifest_at: fleet.manifest_key(),
                    legacy_signature_at: legacy_signature.then(|| fleet.legacy_signature_key()),
                    // A fleet's publication always has a revision: 0 ("none stored") is
                    // "revision 0", which no manifest covers (a files manifest says "none").
                    revision: Some(revision),
                    integrity: integrity.clone(),
                    vectors,
                    gate_vectors: read_gate_vectors(gate_vectors)?,
                    seen: Seen::Revision(revision),
                })
            }
        }
    }
}

/// The serving policy, the previous good one, and what counts as an update.
pub struct LivePolicy {
    origin: Origin,
    current: RwLock<Arc<Loaded>>,
    previous: Mutex<Option<Arc<Loaded>>>,
    seen: Mutex<Seen>,
    /// The last refusal, for operators (`None` once an update is accepted).
    last_refusal: Mutex<Option<String>>,
    metrics: UpdateMetrics,
    /// Where `agent_retry.policy_update` events go (the log line always; hooks and metrics when set).
    telemetry: Telemetry,
    /// The generation the next candidate gets.
    next_generation: AtomicU64,
    /// One update at a time: held by `reload()`, `poll()` and `rollback()`
    /// from the read to the swap; it keeps the orders of what serves.
    updating: Mutex<Orders>,
}

/// The serving and previous policies' orders ([`order`]), swapped with them.
#[derive(Clone, Copy, Debug, Default)]
struct Orders {
    serving: u64,
    previous: u64,
}

/// Counters of what happened to updates, for a metrics endpoint.
#[derive(Debug, Default)]
pub struct UpdateMetrics {
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub rolled_back: AtomicU64,
}

impl LivePolicy {
    /// Loads the first policy from files, through the same gate as every update.
    pub fn open(source: PolicySource) -> Result<LivePolicy, UpdateError> {
        Self::open_origin(Origin::Files(source))
    }

    /// Loads the first policy from the fleet's Redis ([`crate::fleet`]), through
    /// the same gate; a worker started after a publication takes it here.
    pub fn open_fleet(fleet: FleetSource, integrity: Integrity) -> Result<LivePolicy, UpdateError> {
        Self::open_fleet_gated(fleet, integrity, Vec::new())
    }

    /// [`LivePolicy::open_fleet`], with the operator's gate vectors
    /// ([`PolicySource::gate_vectors`]) run on every candidate.
    pub fn open_fleet_gated(fleet: FleetSource, integrity: Integrity, gate_vectors: Vec<PathBuf>) -> Result<LivePolicy, UpdateError> {
        Self::open_origin(Origin::Fleet(fleet, integrity, gate_vectors))
    }

    fn open_origin(origin: Origin) -> Result<LivePolicy, UpdateError> {
        let read = origin.read()?;
        let seen = read.seen.clone();
        let first_order = order(&seen);
        let first = candidate(read, 1, None)?;
        Ok(LivePolicy {
            origin,
            current: RwLock::new(Arc::new(first)),
            previous: Mutex::new(None),
            seen: Mutex::new(seen),
            last_refusal: Mutex::new(None),
            metrics: UpdateMetrics::default(),
            telemetry: Telemetry::default(),
            next_generation: AtomicU64::new(2),
            updating: Mutex::new(Orders { serving: first_order, previous: 0 }),
        })
    }

    /// This live policy with `hooks` told every update (`on_policy_update`)
    /// and `metrics` counting them (`agent_retry_policy_updates_total`).
    pub fn with_telemetry(mut self, hooks: Option<Arc<dyn RetryHooks>>, metrics: Option<Arc<Metrics>>) -> Self {
        self.telemetry = Telemetry::new(hooks, metrics);
        self
    }

    /// This live policy with every update also counted through OpenTelemetry
    /// (`agent_retry.policy_updates`); after [`LivePolicy::with_telemetry`],
    /// which starts a new fan-out.
    #[cfg(feature = "otel")]
    pub fn with_meter(mut self, meter: crate::otel::OtelMeter) -> Self {
        self.telemetry = self.telemetry.with_meter(Some(meter));
        self
    }

    /// Emits one `agent_retry.policy_update` event.
    fn updated(&self, outcome: PolicyUpdateOutcome, message: &str, identity: Option<&PolicyIdentity>, refused: Option<&UpdateError>) {
        self.telemetry.emit(Event::PolicyUpdate(PolicyUpdateEvent {
            outcome,
            message: message.to_string(),
            identity: identity.map(ToString::to_string),
            serving: refused.map(|_| self.current().identity.to_string()),
            kind: refused.map(|e| e.kind().to_string()),
            reason: refused.map(ToString::to_string),
        }));
    }

    /// The policy new runs get. Keep it for the run: an update does not change it.
    pub fn current(&self) -> Arc<Loaded> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Why the last update was refused, if the last attempt was refused.
    pub fn last_refusal(&self) -> Option<String> {
        self.last_refusal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Updates accepted, refused and rolled back since the host started.
    pub fn metrics(&self) -> &UpdateMetrics {
        &self.metrics
    }

    /// Reads the files (or the fleet's publication) again, gates the candidate
    /// off the hot path, and swaps it in. On refusal the serving policy is
    /// unchanged and the reason is logged; a candidate older than the serving
    /// policy is refused as [`UpdateError::Older`]. One update at a time: a
    /// second `reload()` waits for the first to swap, then reads.
    pub fn reload(&self) -> Result<PolicyIdentity, UpdateError> {
        let mut orders = self.updating.lock().unwrap_or_else(|p| p.into_inner());
        self.reload_holding(&mut orders)
    }

    /// [`LivePolicy::reload`], the update lock held.
    fn reload_holding(&self, orders: &mut Orders) -> Result<PolicyIdentity, UpdateError> {
        let serving = self.current();
        // Noted first, so that an update that cannot even be read is tried once, not at every poll.
        if let Ok(now) = self.origin.seen_now() {
            *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = now;
        }
        let result = self.origin.read().and_then(|read| {
            *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = read.seen.clone();
            // Older than what serves: refused before it is even checked.
            self.origin.not_older(&read.seen, orders.serving)?;
            let read_order = order(&read.seen);
            candidate(read, 0, Some(&serving)).map(|loaded| (loaded, read_order))
        });
        match result {
            Ok((mut loaded, read_order)) => {
                *orders = Orders { serving: read_order, previous: orders.serving };
                loaded.identity.generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
                let identity = loaded.identity.clone();
                let old = std::mem::replace(&mut *self.current.write().unwrap_or_else(|p| p.into_inner()), Arc::new(loaded));
                *self.previous.lock().unwrap_or_else(|p| p.into_inner()) = Some(old);
                *self.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) = None;
                self.metrics.accepted.fetch_add(1, Ordering::Relaxed);
                self.updated(PolicyUpdateOutcome::Accepted, "policy update accepted", Some(&identity), None);
                Ok(identity)
            }
            Err(e) => {
                self.metrics.refused.fetch_add(1, Ordering::Relaxed);
                self.updated(PolicyUpdateOutcome::Refused, "policy update refused", None, Some(&e));
                *self.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Returns to the previous good policy (it passed the gate when it served).
    pub fn rollback(&self) -> Result<PolicyIdentity, UpdateError> {
        let mut orders = self.updating.lock().unwrap_or_else(|p| p.into_inner());
        let previous = self.previous.lock().unwrap_or_else(|p| p.into_inner()).take().ok_or(UpdateError::NothingToRollBackTo)?;
        let identity = previous.identity.clone();
        let old = std::mem::replace(&mut *self.current.write().unwrap_or_else(|p| p.into_inner()), previous);
        *self.previous.lock().unwrap_or_else(|p| p.into_inner()) = Some(old);
        // What comes next is compared with the policy rolled back to.
        *orders = Orders { serving: orders.previous, previous: orders.serving };
        self.metrics.rolled_back.fetch_add(1, Ordering::Relaxed);
        self.updated(PolicyUpdateOutcome::RolledBack, "policy rolled back", Some(&identity), None);
        Ok(identity)
    }

    /// Reloads if either file changed since it was last read (size or time), or
    /// the fleet's revision is one not tried yet. `None`: nothing changed (or the
    /// fleet's Redis cannot be reached: the serving policy stays, the next poll tries again).
    pub fn poll(&self) -> Option<Result<PolicyIdentity, UpdateError>> {
        // Checked under the update lock: of two polls at once (the channel's and
        // the timer's) the second sees what the first read, and reads only what is newer.
        let mut orders = self.updating.lock().unwrap_or_else(|p| p.into_inner());
        let now = match self.origin.seen_now() {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(target: "agent_retry", serving = %self.current().identity, reason = %e, "cannot check for a policy update");
                return None;
            }
        };
        if *self.seen.lock().unwrap_or_else(|p| p.into_inner()) == now {
            return None;
        }
        Some(self.reload_holding(&mut orders))
    }

    /// Polls every `interval` on a thread of its own (a file watcher that works
    /// on every filesystem, network ones included); for a fleet, a second
    /// thread listens on the update channel, so a publication is taken at once.
    /// The threads end when the `LivePolicy` is dropped.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> std::thread::JoinHandle<()> {
        if let Origin::Fleet(fleet, ..) = &self.origin {
            let live = Arc::downgrade(self);
            let fleet = fleet.clone();
            std::thread::spawn(move || {
                while live.strong_count() > 0 {
                    match fleet.wait_for_announcement(interval) {
                        Ok(true) => {
                            if let Some(live) = live.upgrade() {
                                let _ = live.poll();
                            }
                        }
                        Ok(false) => {}
                        // Redis is away: the polling thread carries on; try again later.
                        Err(_) => std::thread::sleep(interval),
                    }
                }
            });
        }
        let live = Arc::downgrade(self);
        std::thread::spawn(move || {
            while let Some(live) = live.upgrade() {
                let _ = live.poll();
                drop(live);
                std::thread::sleep(interval);
            }
        })
    }
}

/// Checks and compiles a candidate (a `.wasm` byte-identical to the serving
/// one is not compiled again: a configuration change costs its gate only);
/// runs the gate.
fn candidate(read: Candidate, generation: u64, serving: Option<&Loaded>) -> Result<Loaded, UpdateError> {
    if let Integrity::Ed25519(key) = &read.integrity {
        // Before anything of the publication is used: the manifest covers the bytes as read.
        crate::manifest::verify_publication(
            key,
            read.manifest.as_deref(),
            &read.manifest_at,
            read.legacy_signature_at.as_deref(),
            &read.wasm,
            &read.config,
            read.vectors.as_deref(),
            read.revision,
        )
        .map_err(|e| UpdateError::Integrity(e.to_string()))?;
    }
    let config_json = String::from_utf8(read.config).map_err(|_| UpdateError::Config("the configuration is not UTF-8".into()))?;
    let wasm_sha256 = hex(&Sha256::digest(&read.wasm));
    match &read.integrity {
        Integrity::Unchecked => {}
        Integrity::PinnedSha256(pinned) => {
            if !pinned.eq_ignore_ascii_case(&wasm_sha256) {
                return Err(UpdateError::Integrity(format!("the .wasm's SHA-256 is {wasm_sha256}, the pinned digest {pinned}")));
            }
        }
        Integrity::Ed25519(_) => {} // checked above
    }
    let component = match serving {
        Some(serving) if serving.identity.wasm_sha256 == wasm_sha256 => Arc::clone(&serving.component),
        _ => Arc::new(PolicyComponent::from_bytes(&read.wasm).map_err(UpdateError::Load)?),
    };
    config_loads(&component, &config_json)?;
    gate_vectors_pass(&component, "gate.json", GATE_VECTORS.as_bytes(), &config_json)?;
    for (path, text) in &read.gate_vectors {
        gate_vectors_pass(&component, &path.display().to_string(), text, &config_json)?;
    }
    if let Some(vectors) = &read.vectors {
        shipped_vectors_pass(&component, vectors, &config_json)?;
    }
    let config_sha256 = hex(&Sha256::digest(config_json.as_bytes()));
    Ok(Loaded { component, config_json, identity: PolicyIdentity { wasm_sha256, config_sha256, generation } })
}

/// Every case of the vectors an update ships with passes on the candidate, each
/// on a fresh instance (as the conformance runner runs them); a case that names
/// no configuration runs in the update's own (as in the Python and Node hosts).
fn shipped_vectors_pass(component: &PolicyComponent, vectors: &[u8], config_json: &str) -> Result<(), UpdateError> {
    let refuse = |why: String| UpdateError::Gate(format!("the update's vectors {why}"));
    let text = std::str::from_utf8(vectors).map_err(|_| refuse("are not UTF-8".into()))?;
    let file = crate::vectors::parse_file(text).map_err(|e| refuse(format!("are not a vector file: {e}")))?;
    for case in &file.cases {
        let mut subject = crate::dynamic::DynamicPolicy::new(component).map_err(|e| refuse(format!("cannot run: {e}")))?;
        if let Some(failure) = crate::vectors::run_case_in(case, config_json, &mut subject).failure {
            return Err(refuse(format!("fail: \"{}\" {failure}", case.description)));
        }
    }
    Ok(())
}

/// Where a `.wasm`'s signed manifest is looked for: `<wasm>.manifest`.
pub fn manifest_path(wasm: &Path) -> PathBuf {
    let mut path = wasm.as_os_str().to_owned();
    path.push(".manifest");
    PathBuf::from(path)
}

/// Where a signature over the `.wasm` alone was kept before 0.7 (`<wasm>.sig`):
/// no longer accepted, only named when found.
pub fn signature_path(wasm: &Path) -> PathBuf {
    let mut sig_path = wasm.as_os_str().to_owned();
    sig_path.push(".sig");
    PathBuf::from(sig_path)
}

/// The configuration loads in the candidate (a fresh instance with its own
/// account budget): a configuration it rejects is [`UpdateError::Config`].
fn config_loads(component: &PolicyComponent, config_json: &str) -> Result<(), UpdateError> {
    let mut instance = component
        .instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1)))
        .map_err(|e| UpdateError::Gate(format!("instantiation failed: {e:#}")))?;
    match instance.load_policy(config_json).map_err(|e| UpdateError::Gate(format!("from-json failed: {e}")))? {
        Ok(_) => Ok(()),
        Err(e) => Err(UpdateError::Config(format!("{}: {}", e.field, e.message))),
    }
}

/// Every case of a gate vector file passes on the candidate, each on a fresh
/// instance through the conformance runner; a case without `config` runs
/// under the candidate's configuration. A failure names the file and the case.
fn gate_vectors_pass(component: &PolicyComponent, name: &str, vectors: &[u8], config_json: &str) -> Result<(), UpdateError> {
    let refuse = |why: String| UpdateError::Gate(format!("{name} {why}"));
    let text = std::str::from_utf8(vectors).map_err(|_| refuse("is not UTF-8".into()))?;
    let file = crate::vectors::parse_file(text).map_err(|e| refuse(format!("is not a vector file: {e}")))?;
    for case in &file.cases {
        let mut subject = crate::dynamic::DynamicPolicy::new(component).map_err(|e| refuse(format!("cannot run: {e}")))?;
        if let Some(failure) = crate::vectors::run_case_in(case, config_json, &mut subject).failure {
            return Err(refuse(format!("case \"{}\" fails: {failure}", case.description)));
        }
    }
    Ok(())
}

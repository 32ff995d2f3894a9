//! `agent-retry watch`: a worker that keeps a live policy, from files or from the
//! fleet's Redis, and says on stdout (one JSON line each) which policy serves
//! and every update it accepts or refuses. `SIGHUP` or a `reload` line on stdin
//! reloads, a `rollback` line rolls back, a `status` line prints the serving
//! policy, and a `decide` line runs a persistent 503 through a fresh run of the
//! serving policy (the attempts it allows), so an operator sees a budget change.
//!
//! `agent-retry publish`: writes a policy for every worker of a fleet into Redis
//! in one transaction and announces it.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agent_retry_host::component::types::{Action, FailureKind, Observation};
use agent_retry_host::{Admission, Outcome};
use agent_retry_host::{EmbeddedAccounts, EntropySource, FleetSource, HostServices, Integrity, LivePolicy, PolicyIdentity, PolicySource, publish_policy};

pub struct WatchOptions {
    pub wasm: PathBuf,
    pub config: Option<PathBuf>,
    pub fleet: Option<String>,
    pub prefix: String,
    pub interval_ms: u64,
    pub pin_sha256: Option<String>,
    pub public_key_hex: Option<String>,
    pub vectors: Option<PathBuf>,
    /// The operator's gate vector files, run on every candidate after gate.json.
    pub gate_vectors: Vec<PathBuf>,
}

pub fn integrity(pin: Option<&str>, key_hex: Option<&str>) -> anyhow::Result<Integrity> {
    Ok(match (pin, key_hex) {
        (Some(pin), _) => Integrity::PinnedSha256(pin.to_string()),
        (None, Some(key)) => {
            let bytes: Vec<u8> = (0..key.len())
                .step_by(2)
                .map(|i| key.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| anyhow::anyhow!("--public-key is not hex"))?;
            Integrity::Ed25519(bytes.try_into().map_err(|_| anyhow::anyhow!("--public-key must be 32 bytes (64 hex digits)"))?)
        }
        (None, None) => Integrity::Unchecked,
    })
}

fn identity_json(identity: &PolicyIdentity) -> Value {
    json!({ "generation": identity.generation, "wasm-sha256": identity.wasm_sha256, "config-sha256": identity.config_sha256 })
}

fn say(line: Value) {
    println!("{line}");
}

/// Attempts a fresh run of the serving policy makes against a persistent 503 on a read.
fn attempts_against_a_persistent_503(live: &LivePolicy) -> anyhow::Result<u32> {
    let loaded = live.current();
    let mut instance = loaded.component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1)))?;
    let policy = instance.load_policy(&loaded.config_json)?.map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
    let run = instance.start_run(&policy, "watch-probe")?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let Admission::Send(ticket) = instance.begin(&run, None, "probe", None, None, 1)?.map_err(|e| anyhow::anyhow!("{e:?}"))? else { return Ok(0) };
    let failure = Outcome::Failure(Observation::new(FailureKind::HttpStatus(503), &[], ""));
    let mut attempts = 1;
    while let Action::Retry(plan) = instance.decide(&run, ticket.call_id, attempts, &failure, None, 1, Some(1))?.map_err(|e| anyhow::anyhow!("{e:?}"))?.action {
        attempts = plan.attempt;
    }
    Ok(attempts)
}

pub async fn watch(options: WatchOptions) -> anyhow::Result<()> {
    let integrity = integrity(options.pin_sha256.as_deref(), options.public_key_hex.as_deref())?;
    let live = Arc::new(match (&options.fleet, &options.config) {
        (Some(url), _) => {
            LivePolicy::open_fleet_gated(FleetSource::new(url.clone()).with_prefix(options.prefix.clone()), integrity, options.gate_vectors.clone())?
        }
        (None, Some(config)) => LivePolicy::open(PolicySource {
            wasm: options.wasm.clone(),
            config: config.clone(),
            integrity,
            vectors: options.vectors.clone(),
            gate_vectors: options.gate_vectors.clone(),
        })?,
        (None, None) => anyhow::bail!("watch needs --config (files) or --fleet (Redis)"),
    });
    say(json!({ "event": "serving", "policy": identity_json(&live.current().identity) }));
    // Updates are reported from the watcher's thread as they happen.
    let interval = Duration::from_millis(options.interval_ms.max(10));
    let reporter = Arc::clone(&live);
    let mut last = live.current().identity.clone();
    let mut last_refusal = None;
    let report = move || {
        let now = reporter.current().identity.clone();
        if now != last {
            say(json!({ "event": "serving", "policy": identity_json(&now) }));
            last = now;
        }
        let refusal = reporter.last_refusal();
        if refusal.is_some() && refusal != last_refusal {
            say(json!({ "event": "refused", "reason": refusal, "serving": identity_json(&last) }));
        }
        last_refusal = refusal;
    };
    let report = Arc::new(std::sync::Mutex::new(report));
    let _watcher = live.watch(interval);
    {
        let report = Arc::clone(&report);
        tokio::spawn(async move {
            loop {
                // Says what the watcher's threads did, soon after they did it.
                tokio::time::sleep(Duration::from_millis(100)).await;
                (*report.lock().unwrap_or_else(|p| p.into_inner()))();
            }
        });
    }
    #[cfg(unix)]
    {
        let live = Arc::clone(&live);
        let report = Arc::clone(&report);
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let _ = live.reload();
                (*report.lock().unwrap_or_else(|p| p.into_inner()))();
            }
        });
    }
    // Commands on stdin; the worker ends when stdin closes.
    let (lines, mut receive) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = receive.recv().await {
        match line.trim() {
            "reload" => {
                if let Err(e) = live.reload() {
                    say(json!({ "event": "refused", "reason": e.to_string(), "serving": identity_json(&live.current().identity) }));
                }
            }
            "rollback" => match live.rollback() {
                Ok(identity) => say(json!({ "event": "rolled-back", "policy": identity_json(&identity) })),
                Err(e) => say(json!({ "event": "error", "reason": e.to_string() })),
            },
            "status" => {
                let m = live.metrics();
                let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
                say(json!({ "event": "status", "policy": identity_json(&live.current().identity),
                    "accepted": count(&m.accepted), "refused": count(&m.refused), "rolled-back": count(&m.rolled_back) }))
            }
            "decide" => match attempts_against_a_persistent_503(&live) {
                Ok(attempts) => {
                    say(json!({ "event": "decided", "policy": identity_json(&live.current().identity), "attempts-against-a-persistent-503": attempts }))
                }
                Err(e) => say(json!({ "event": "error", "reason": format!("{e:#}") })),
            },
            "" => {}
            other => say(json!({ "event": "error", "reason": format!("unknown command {other:?}: reload, rollback, status or decide") })),
        }
        (*report.lock().unwrap_or_else(|p| p.into_inner()))();
    }
    Ok(())
}

pub fn publish(url: &str, prefix: &str, wasm: &Path, config: &Path, manifest: Option<&Path>, vectors: Option<&Path>) -> anyhow::Result<()> {
    let read = |path: &Path| std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()));
    let wasm_bytes = read(wasm)?;
    let config_text = String::from_utf8(read(config)?).map_err(|_| anyhow::anyhow!("{} is not UTF-8", config.display()))?;
    let manifest = manifest.map(read).transpose()?.map(String::from_utf8).transpose().map_err(|_| anyhow::anyhow!("the manifest is not UTF-8"))?;
    let vectors = vectors.map(read).transpose()?.map(String::from_utf8).transpose().map_err(|_| anyhow::anyhow!("the vectors are not UTF-8"))?;
    let fleet = FleetSource::new(url).with_prefix(prefix);
    let revision = publish_policy(&fleet, &wasm_bytes, &config_text, manifest.as_deref(), vectors.as_deref()).map_err(anyhow::Error::msg)?;
    say(json!({ "event": "published", "revision": revision, "prefix": prefix, "wasm-bytes": wasm_bytes.len(), "signed": manifest.is_some() }));
    Ok(())
}

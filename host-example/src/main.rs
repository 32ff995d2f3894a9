//! `agent-retry`: the sample host's command line. The commands live in
//! `commands`; this file only parses arguments.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod commands;
mod proxy;

use crate::commands::{call, decide, demo, exam, explain, lab, serve, sign, timeline, watch};
use agent_retry_host::default_wasm_path;

#[derive(Parser)]
#[command(
    name = "agent-retry",
    version,
    about = "Sample host for the agent-retry policy component: wraps MCP tool calls with retries, replans, status checks and escalations"
)]
struct Cli {
    /// The policy component to load.
    #[arg(long, global = true, default_value_os_t = default_wasm_path())]
    wasm: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the demo MCP server on a free loopback port and run scripted refund-desk
    /// agent runs against it through the wrapper; print runs completed, replanned,
    /// escalated (with notes), retries, calls, duplicate effects and time waited.
    Demo {
        /// How many agent runs.
        #[arg(long, default_value_t = 12)]
        runs: u32,
        /// How many runs at once (workers sharing one account).
        #[arg(long, default_value_t = 4)]
        workers: u32,
        /// Seed the jitter entropy (default: OS randomness).
        #[arg(long)]
        seed: Option<u64>,
        /// Where to write the JSON log (one line per attempt).
        #[arg(long, default_value_os_t = std::env::temp_dir().join("agent-retry-demo.jsonl"))]
        log: PathBuf,
        /// Also print the counters in Prometheus text format.
        #[arg(long)]
        prometheus: bool,
    },
    /// Make one tool call through the wrapper against any MCP server; the JSON log
    /// goes to stderr, the final outcome to stdout.
    Call {
        /// A streamable-HTTP MCP server, e.g. http://127.0.0.1:8080/mcp.
        #[arg(long, conflicts_with = "stdio")]
        url: Option<String>,
        /// A command that speaks MCP on stdio, e.g. "agent-retry serve --stdio".
        #[arg(long)]
        stdio: Option<String>,
        /// The tool to call.
        tool: String,
        /// Its arguments, a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
        /// The policy configuration (JSON).
        #[arg(long, default_value = "{}")]
        config: String,
        /// Seed the jitter entropy (default: OS randomness).
        #[arg(long)]
        seed: Option<u64>,
        /// Also trust the CA certificates in this PEM file (an https server whose
        /// certificate a private CA signed).
        #[arg(long, requires = "url")]
        ca_file: Option<PathBuf>,
    },
    /// Read steps as JSON lines on stdin (the vectors' format, tests/vectors/README.md)
    /// and print the component's answers as JSON lines.
    Decide {
        /// Fuel for one call into the component (the sandbox's limit).
        #[arg(long, default_value_t = agent_retry_host::component::FUEL_PER_CALL)]
        fuel_per_call: u64,
        /// More fuel for loading a configuration, per byte of its text.
        #[arg(long, default_value_t = agent_retry_host::component::FUEL_PER_CONFIG_BYTE)]
        fuel_per_config_byte: u64,
    },
    /// Run a scripted sequence of failures through the policy and print every
    /// decision (simulated clock, seeded jitter: reproducible).
    Explain {
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Print what the component imports and exports, and its size.
    Inspect,
    /// The refund lab of the article "Agent Retry Policies": 40 scripted runs, no network, through our policy
    /// (the component) and through retry-everything and peers' retry policies; one
    /// table per fault mix and variant (deterministic).
    Lab {
        /// A fault mix of your own (the format of tests/lab/faults.json).
        #[arg(long)]
        faults: Option<PathBuf>,
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Brooker's contention simulation: clients racing to write one row, with no,
    /// full (the component), equal and decorrelated jitter, and the account budget
    /// coordinating them (deterministic: simulated time, seeded).
    Simulate {
        /// Client counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10,20,30,40,50,60,70,80,90,100")]
        clients: Vec<u32>,
        /// Simulations averaged per point.
        #[arg(long, default_value_t = 100)]
        runs: u32,
        #[arg(long, default_value_t = 12345)]
        seed: u64,
        /// Write the SVG plots into this directory.
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// The host-conformance judge: serve the exam's faults, run a host's exam client
    /// (`COMMAND... --url URL --exam PATH`), check from the server side what a
    /// correct host must do, print a verdict per rule.
    Judge {
        /// The exam.
        #[arg(long, default_value = "tests/judge/exam.json")]
        exam: PathBuf,
        /// The exam client's command, e.g. `-- agent-retry exam`.
        #[arg(last = true, required = true)]
        client: Vec<String>,
    },
    /// The Rust host's exam client (run by `judge`).
    Exam {
        #[arg(long)]
        url: String,
        #[arg(long)]
        exam: PathBuf,
        /// Skip the policy: retry everything at once with a new key (a bad host, for the judge to fail).
        #[arg(long)]
        no_policy: bool,
        /// Take the exam as an agent host behind `agent-retry proxy`: a plain MCP
        /// client (no retries of its own) that starts the proxy as its stdio server.
        #[arg(long, conflicts_with = "no_policy")]
        through_proxy: bool,
    },
    /// Keep a live policy (from --wasm and --config files, or from the fleet's Redis)
    /// and print, as JSON lines, which policy serves and every update accepted or
    /// refused. SIGHUP or `reload` on stdin reloads; `rollback`, `status` and
    /// `decide` (attempts a persistent 503 gets) are the other stdin commands.
    Watch {
        /// The configuration file to watch with --wasm.
        #[arg(long, required_unless_present = "fleet")]
        config: Option<PathBuf>,
        /// Take the policy a fleet publishes in this Redis (redis://host:port/) instead of files.
        #[arg(long, conflicts_with = "config")]
        fleet: Option<String>,
        /// The fleet's key prefix.
        #[arg(long, default_value = agent_retry_host::fleet::DEFAULT_PREFIX)]
        prefix: String,
        /// How often to look for a change (files: times and sizes; fleet: the revision).
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Accept only a .wasm with this SHA-256 (hex).
        #[arg(long, conflicts_with = "public_key")]
        pin_sha256: Option<String>,
        /// Accept only a publication signed by this Ed25519 public key (64 hex
        /// digits): its signed manifest (`agent-retry sign`) is <wasm>.manifest,
        /// or the fleet's manifest key, and covers the .wasm, the configuration,
        /// the vectors and the revision.
        #[arg(long)]
        public_key: Option<String>,
        /// Vectors (the format of tests/vectors/*.json) every candidate must pass (files; a
        /// fleet ships its own in the vectors key).
        #[arg(long, conflicts_with = "fleet")]
        vectors: Option<PathBuf>,
        /// Gate vector files of the operator's (the format of tests/vectors/*.json;
        /// repeat it for several): every candidate must pass them after the built-in
        /// gate.json, cases without `config` under the candidate's configuration.
        #[arg(long = "gate-vectors")]
        gate_vectors: Vec<PathBuf>,
    },
    /// Publish a policy (--wasm and --config, optionally its signed manifest) for
    /// every worker of a fleet, in one Redis script, and announce it.
    Publish {
        /// The fleet's Redis (redis://host:port/).
        #[arg(long)]
        redis: String,
        /// The fleet's key prefix.
        #[arg(long, default_value = agent_retry_host::fleet::DEFAULT_PREFIX)]
        prefix: String,
        /// The configuration (JSON).
        #[arg(long)]
        config: PathBuf,
        /// The publication's signed manifest (`agent-retry sign`): published under
        /// its revision, and refused before anything is written unless it covers
        /// --wasm, --config and --vectors.
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// Vectors (the format of tests/vectors/*.json) every worker's gate runs on it.
        #[arg(long)]
        vectors: Option<PathBuf>,
    },
    /// Write the signed manifest of a publication (--wasm, --config, --vectors and
    /// the fleet revision, or none for files) with an Ed25519 seed: workers
    /// configured with its public key take the publication only as signed.
    Sign {
        /// A file holding the Ed25519 seed (the secret key) as 64 hex digits.
        #[arg(long)]
        key: PathBuf,
        /// The configuration (JSON).
        #[arg(long)]
        config: PathBuf,
        /// The vectors published with it, if any.
        #[arg(long)]
        vectors: Option<PathBuf>,
        /// The fleet revision to publish under (default: now, in ms).
        #[arg(long, conflicts_with = "files")]
        revision: Option<u64>,
        /// Sign for files (`<wasm>.manifest`): revision none.
        #[arg(long)]
        files: bool,
        /// Write the manifest here (and a JSON line with the public key to stdout) instead of to stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Draw the wrapper's JSON log lines (docs/events.md; any host, any logger
    /// prefix before the first `{`) as an SVG on a time axis: attempts, waits,
    /// status checks, task polls, replans, escalations. One run: a lane per
    /// call; several: a lane per run.
    Timeline {
        /// The log (JSON lines), or `-` for stdin.
        log: PathBuf,
        /// Write the SVG here (default: stdout).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Draw this run only.
        #[arg(long)]
        run: Option<String>,
    },
    /// Stand between any MCP client and any MCP server (docs/proxy.md): every tool call
    /// is retried, replanned, status-checked or escalated as the policy decides, and
    /// everything else passes through. The client starts `agent-retry proxy -- SERVER
    /// COMMAND...` instead of the server (stdio), or `--upstream URL`; `--listen ADDR`
    /// serves streamable HTTP (stateless) instead of stdio.
    Proxy(proxy::ProxyOptions),
    /// Serve the demo MCP server (refund desk, asset store) over streamable HTTP or stdio;
    /// with tasks (`issue_refund`, `archive_orders`), a continuation
    /// (`confirm_order`) and progress (`export_report`) for MCP 2026-07-28 clients.
    Serve {
        /// Serve streamable HTTP at http://ADDR/mcp, e.g. 127.0.0.1:8080.
        #[arg(long, conflicts_with = "stdio", required_unless_present = "stdio")]
        http: Option<String>,
        /// Serve MCP on stdin/stdout.
        #[arg(long)]
        stdio: bool,
        /// A fault script (JSON; see demo-server/src/faults.rs).
        #[arg(long)]
        faults: Option<PathBuf>,
        /// At most this many tool calls per window, shared by all clients (429 past it).
        #[arg(long)]
        allowance: Option<u32>,
        /// The allowance window.
        #[arg(long, default_value_t = 60_000)]
        window_ms: u64,
        /// Keep the ledger in this JSON file: read at start, written after every
        /// call, so a restarted server still knows what it applied.
        #[arg(long)]
        ledger: Option<PathBuf>,
        /// Over HTTP, give clients of protocol versions before 2026-07-28 a
        /// session (`Mcp-Session-Id`), lost when the server restarts.
        #[arg(long, requires = "http")]
        sessions: bool,
        /// Over HTTP, the MCP revisions served: `dual` (2026-07-28 and those with
        /// an `initialize` handshake), `modern` (2026-07-28 only: `initialize`
        /// is answered HTTP 400, JSON-RPC -32022) or `handshake` (2025-11-25:
        /// `server/discover` lists it alone, as go-sdk's stateful servers do).
        #[arg(long, requires = "http", default_value = "dual", value_parser = agent_retry_demo_server::Era::parse)]
        era: agent_retry_demo_server::Era,
        /// Serve https, with a certificate signed by a CA made at start; that CA's
        /// certificate (PEM) is written to this file before the URL is printed.
        #[arg(long, requires = "http")]
        tls_ca_out: Option<PathBuf>,
        /// How long a task works before it completes or asks for input (tasks,
        /// SEP-2663: `issue_refund` for a client that declares the extension
        /// `io.modelcontextprotocol/tasks`, `archive_orders` always).
        #[arg(long, default_value_t = 300)]
        task_work_ms: u64,
        /// The `pollIntervalMs` a task carries (0: none).
        #[arg(long, default_value_t = 100)]
        task_poll_interval_ms: u64,
        /// The `ttlMs` a task carries (0: none). Past it an unfinished task is
        /// `failed` and its work stopped (no refund).
        #[arg(long, default_value_t = 60_000)]
        task_ttl_ms: u64,
        /// How often `export_report` sends `notifications/progress`.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
        progress_interval_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let wasm = cli.wasm;
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Demo { runs, workers, seed, log, prometheus } => demo::demo(demo::DemoOptions { wasm, runs, workers, seed, log, prometheus }).await,
            Command::Call { url, stdio, tool, arguments, config, seed, ca_file } => {
                let options = call::CallOptions {
                    wasm: &wasm,
                    url: url.as_deref(),
                    stdio: stdio.as_deref(),
                    tool: &tool,
                    arguments: &arguments,
                    config: &config,
                    seed,
                    ca_file: ca_file.as_deref(),
                };
                call::call(options).await
            }
            Command::Decide { fuel_per_call, fuel_per_config_byte } => decide::decide(&wasm, fuel_per_call, fuel_per_config_byte),
            Command::Explain { seed } => explain::explain(&wasm, seed),
            Command::Inspect => inspect(&wasm),
            Command::Lab { faults, seed } => lab::lab(&wasm, faults.as_deref(), seed),
            Command::Simulate { clients, runs, seed, svg } => lab::simulate(&wasm, &clients, runs, seed, svg.as_deref()),
            Command::Judge { exam, client } => exam::judge(&exam, &client).await,
            Command::Exam { url, exam, no_policy: _, through_proxy: true } => exam::exam_through_proxy(&wasm, &url, &exam).await,
            Command::Exam { url, exam, no_policy, through_proxy: false } => exam::exam(&wasm, &url, &exam, no_policy).await,
            Command::Watch { config, fleet, prefix, interval_ms, pin_sha256, public_key, vectors, gate_vectors } => {
                watch::watch(watch::WatchOptions { wasm, config, fleet, prefix, interval_ms, pin_sha256, public_key_hex: public_key, vectors, gate_vectors })
                    .await
            }
            Command::Publish { redis, prefix, config, manifest, vectors } => {
                watch::publish(&redis, &prefix, &wasm, &config, manifest.as_deref(), vectors.as_deref())
            }
            Command::Timeline { log, out, run } => timeline::timeline(timeline::TimelineOptions { log, out, run }),
            Command::Sign { key, config, vectors, revision, files, out } => sign::sign(sign::SignOptions { key, wasm, config, vectors, revision, files, out }),
            Command::Proxy(options) => proxy::proxy(wasm, options).await,
            Command::Serve {
                http,
                stdio: _,
                faults,
                allowance,
                window_ms,
                ledger,
                sessions,
                era,
                tls_ca_out,
                task_work_ms,
                task_poll_interval_ms,
                task_ttl_ms,
                progress_interval_ms,
            } => {
                let timings = agent_retry_demo_server::Timings { task_work_ms, task_poll_interval_ms, task_ttl_ms, progress_interval_ms };
                let options =
                    serve::ServeOptions { http: http.as_deref(), faults: faults.as_deref(), allowance, window_ms, ledger, sessions, era, tls_ca_out, timings };
                serve::serve(options).await
            }
        }
    });
    // Not waiting for blocking tasks: the proxy's read of stdin blocks until
    // the client closes it, and must not keep a stopped proxy alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn inspect(wasm: &std::path::Path) -> anyhow::Result<()> {
    let component = agent_retry_host::PolicyComponent::from_file(wasm)?;
    let size = std::fs::metadata(wasm)?.len();
    println!("{} ({size} bytes)", wasm.display());
    for name in component.imports() {
        println!("import {name}");
    }
    for name in component.exports() {
        println!("export {name}");
    }
    Ok(())
}

//! A load of concurrent workers against the demo MCP server: each worker its own
//! policy instance and MCP client, all starting together, the server counting.
//! Used by the account-budget tests and benchmark.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_retry_demo_server::tools::lock;
use agent_retry_demo_server::{Allowance, DemoState, FaultRule, FaultScript, serve_http};
use serde_json::json;

use agent_retry_host::accounts::AccountBudgetBackend;
use agent_retry_host::mcp::{Clock, Metrics, RetryingToolCaller, RetryingToolCallerOptions, connect_http};
use agent_retry_host::{EntropySource, HostServices, PolicyComponent, default_wasm_path};

/// What the server saw and what the hosts did.
pub struct LoadOutcome {
    pub admitted_per_window: Vec<u32>,
    pub refused: u32,
    pub server_calls: usize,
    pub host_attempts: u64,
    pub host_retries: u64,
    /// Server-side times (ms since its start) of each call.
    pub times: Vec<u64>,
}

/// `workers` workers (each its own policy instance and MCP client), each making
/// `calls` lookups, all starting together.
#[allow(clippy::too_many_arguments)]
pub fn run_workers(
    workers: u32,
    allowance: Option<(u32, u64)>,
    faults: Vec<FaultRule>,
    config: &str,
    calls: u32,
    backend: impl Fn(u32) -> Arc<dyn AccountBudgetBackend>,
    entropy: impl Fn(u32) -> EntropySource,
) -> LoadOutcome {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let allowance = allowance.map(|(n, ms)| Allowance::new(n, Duration::from_millis(ms)));
        let state = DemoState::new(FaultScript::new(faults), allowance);
        let server = serve_http("127.0.0.1:0".parse().unwrap(), Arc::clone(&state)).await.unwrap();
        let component = Arc::new(PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first"));
        let metrics = Arc::new(Metrics::new());
        let start = Arc::new(tokio::sync::Barrier::new(workers as usize));
        let mut tasks = Vec::new();
        for w in 0..workers {
            let client = connect_http(&server.url).await.unwrap();
            let instance = component.instantiate(HostServices::new(backend(w), entropy(w))).unwrap();
            let options = RetryingToolCallerOptions {
                attempt_timeout_ms: Some(5000),
                key_argument: "idempotency_key".into(),
                clock: Clock::real(),
                ..Default::default()
            };
            let mut caller =
                RetryingToolCaller::start(client.peer().clone(), instance, config, &format!("worker-{w}"), options, Arc::clone(&metrics)).await.unwrap();
            let start = Arc::clone(&start);
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                for i in 0..calls {
                    let args = json!({"order_id": format!("W{w}-{i}")}).as_object().cloned().unwrap();
                    caller.call("lookup_order", args).await.expect("every call gets an answer");
                }
                let _ = client.cancel().await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let counts = metrics.snapshot();
        let (admitted_per_window, refused) = lock(&state.allowance).as_ref().map_or((vec![], 0), |a| (a.admitted_per_window.clone(), a.refused));
        let times = lock(&state.calls).iter().map(|c| c.at_ms).collect();
        let server_calls = lock(&state.calls).len();
        server.stop().await;
        LoadOutcome { admitted_per_window, refused, server_calls, host_attempts: counts.attempts, host_retries: counts.retries, times }
    })
}

/// A redis-server of our own on a free loopback port, for tests and benchmarks;
/// killed on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: apt-get install redis-server (.ci/run does)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer { child, port }
    }

    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Self::start_on(port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

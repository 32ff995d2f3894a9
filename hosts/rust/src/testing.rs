//! Helpers for tests of code that runs under the policy: a fake clock whose
//! sleeps return at once (and are recorded), the documented fixed entropy
//! source (SplitMix64 from a seed, the same sequence in every host), and the
//! demo MCP server with a fault script (Python `demo_server`, Node
//! `startDemoServer`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use crate::entropy::EntropySource;
use crate::time_source::TimeSource;

/// A clock that starts at `start_ms` and moves only when slept on: a sleep
/// advances it by its length at once and is recorded.
#[derive(Debug, Default)]
pub struct FakeClock {
    now_ms: AtomicU64,
    sleeps: Mutex<Vec<u64>>,
}

impl FakeClock {
    pub fn new(start_ms: u64) -> Self {
        FakeClock { now_ms: AtomicU64::new(start_ms), sleeps: Mutex::new(Vec::new()) }
    }

    /// Moves the clock on without a sleep (time spent elsewhere).
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Every sleep asked for, in ms, in order.
    pub fn sleeps(&self) -> Vec<u64> {
        self.sleeps.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl TimeSource for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep(&self, ms: u64) -> BoxFuture<'_, ()> {
        self.sleeps.lock().unwrap_or_else(|p| p.into_inner()).push(ms);
        self.advance(ms);
        Box::pin(std::future::ready(()))
    }

    /// Never fires: this clock moves only when slept on, so a deadline
    /// raced against work would pass at once.
    fn timer(&self, _ms: u64) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
}

/// The fixed entropy source of every host's tests: SplitMix64 from `seed`
/// (Python `fixed_entropy(seed)`, Node `fixedEntropy(seed)`).
pub fn fixed_entropy(seed: u64) -> EntropySource {
    EntropySource::seeded(seed)
}

/// Where [`DemoServer::start`] looks for the `agent-retry` binary first.
pub const BIN_ENV: &str = "AGENT_RETRY_BIN";

/// The demo MCP server (`agent-retry serve`) on a free loopback port, running
/// a fault script (demo-server/src/faults.rs), for as long as this value lives.
///
/// ```no_run
/// let server = agent_retry_host::testing::DemoServer::start(
///     r#"[{"tool": "lookup_order", "call": 1, "fault": {"kind": "http", "status": 503}}]"#,
/// ).unwrap();
/// // connect a RetryingToolCaller to server.url(); the server stops when `server` drops.
/// ```
#[derive(Debug)]
pub struct DemoServer {
    child: std::process::Child,
    url: String,
    _faults: Option<TempFile>,
}

impl DemoServer {
    /// Starts `agent-retry serve` with this fault script (JSON text; `""` for
    /// none). The binary: `$AGENT_RETRY_BIN`, else `agent-retry` on `PATH`.
    pub fn start(faults_json: &str) -> std::io::Result<DemoServer> {
        let binary = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()).unwrap_or_else(|| "agent-retry".into());
        DemoServer::start_with(std::path::Path::new(&binary), faults_json, &[])
    }

    /// Starts `binary serve --http 127.0.0.1:0` with the fault script and more arguments.
    pub fn start_with(binary: &std::path::Path, faults_json: &str, args: &[&str]) -> std::io::Result<DemoServer> {
        use std::io::BufRead;
        let faults = if faults_json.trim().is_empty() { None } else { Some(TempFile::new(faults_json)?) };
        let mut command = std::process::Command::new(binary);
        command.args(["serve", "--http", "127.0.0.1:0"]).args(args);
        if let Some(file) = &faults {
            command.arg("--faults").arg(&file.0);
        }
        let mut child = command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn()?;
        let stderr = child.stderr.take().expect("piped");
        // The server prints its URL on stderr; the rest is drained so that it never blocks on a full pipe.
        let (found, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut found = Some(found);
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(sender) = found.take_if(|_| line.starts_with("demo MCP server at ")) {
                    let _ = sender.send(Ok(line["demo MCP server at ".len()..].split(' ').next().unwrap_or_default().to_owned()));
                } else if found.is_some() && seen.len() < 20 {
                    seen.push(line);
                }
            }
            if let Some(sender) = found {
                let _ = sender.send(Err(seen.join("\n")));
            }
        });
        let mut server = DemoServer { child, url: String::new(), _faults: faults };
        match url.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(Ok(url)) => {
                server.url = url;
                Ok(server)
            }
            Ok(Err(said)) => Err(std::io::Error::other(format!("the demo server exited before serving: {said}"))),
            Err(_) => Err(std::io::Error::other("the demo server printed no URL within 30 s")),
        }
    }

    /// `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fault script written to a temporary file, removed on drop.
#[derive(Debug)]
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(text: &str) -> std::io::Result<TempFile> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!("agent-retry-faults-{}-{}.json", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst)));
        // A new file of this user's only: never one planted at the predictable name.
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(&path)?.write_all(text.as_bytes())?;
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sleep_moves_the_fake_clock_at_once_and_is_recorded() {
        let clock = FakeClock::new(1_700_000_000_000);
        let started = std::time::Instant::now();
        clock.sleep(3_600_000).await;
        clock.sleep(5).await;
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(clock.now_ms(), 1_700_000_000_000 + 3_600_005);
        assert_eq!(clock.sleeps(), vec![3_600_000, 5]);
    }

    #[test]
    fn the_fixed_source_replays() {
        let (a, b) = (fixed_entropy(7), fixed_entropy(7));
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_eq!(fixed_entropy(0).next_u64(), 0xE220_A839_7B1D_CDAF, "SplitMix64's reference value");
    }
}

//! The `agent-retry` subcommands. `main.rs` only parses the command line.

pub mod call;
pub mod decide;
pub mod demo;
pub mod exam;
pub mod explain;
pub mod lab;
pub mod serve;
pub mod sign;
pub mod timeline;
pub mod watch;

/// Sends the wrapper's events (one JSON line per attempt, and run summaries),
/// and nothing else, to `writer`.
pub fn init_json_log<W>(writer: W)
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let layer = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(false)
        .with_writer(writer)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| meta.target() == "agent_retry"));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

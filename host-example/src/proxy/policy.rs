//! Which policy decides each call: a fixed component and configuration, or a
//! live one (files or the fleet's Redis) that operators update while the proxy
//! serves. A call takes the policy serving when it starts and keeps it.

use std::sync::Arc;
use std::time::Duration;

use agent_retry_host::{LivePolicy, PolicyComponent};

pub enum ProxyPolicy {
    Fixed { component: Arc<PolicyComponent>, config_json: String },
    Live(Arc<LivePolicy>),
}

/// The policy one call runs under.
pub struct Serving {
    pub component: Arc<PolicyComponent>,
    pub config_json: String,
    /// For the `policy` field of the log lines (a live policy's identity).
    pub identity: Option<String>,
}

impl ProxyPolicy {
    pub fn serving(&self) -> Serving {
        match self {
            ProxyPolicy::Fixed { component, config_json } => Serving { component: Arc::clone(component), config_json: config_json.clone(), identity: None },
            ProxyPolicy::Live(live) => {
                let loaded = live.current();
                Serving { component: Arc::clone(&loaded.component), config_json: loaded.config_json.clone(), identity: Some(loaded.identity.to_string()) }
            }
        }
    }

    /// Starts looking for updates every `interval` (a live policy only). A
    /// refused update is logged; the last good policy keeps serving.
    pub fn watch(&self, interval: Duration) -> Option<std::thread::JoinHandle<()>> {
        match self {
            ProxyPolicy::Fixed { .. } => None,
            ProxyPolicy::Live(live) => Some(live.watch(interval)),
        }
    }
}

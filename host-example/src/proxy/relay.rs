//! The upstream side's client handler: what the upstream server asks or says
//! goes on to the client behind the proxy, when there is one to reach.
//!
//! Over stdio the proxy has one client for its whole life: the server's
//! requests (elicitation, sampling, roots) and notifications (logging,
//! resources, list changes) are relayed to it. Over stateless HTTP there is no
//! client between requests: the server's requests are refused (a continuation
//! then ends as `input-required`, which the policy answers) and its
//! notifications dropped. Progress and task status are not relayed as
//! received: the proxy's runs consume them (progress goes on to the client
//! under the client's own token; a task is driven to its end by the policy).

use std::sync::{Arc, Mutex, OnceLock, Weak};

use rmcp::model::{ClientConfig, ClientResult, ServerNotification, ServerRequest};
use rmcp::service::{NotificationContext, Peer, RequestContext, Service};
use rmcp::{ErrorData, RoleClient, RoleServer};

use agent_retry_host::mcp::SharedConnection;

/// The client behind the proxy, as far as the upstream side needs it.
#[derive(Default)]
pub struct Downstream {
    /// The stdio client's peer (none over HTTP, or before it said anything).
    peer: Mutex<Option<Peer<RoleServer>>>,
    /// What the client declared of itself: the upstream session declares the same.
    client: Mutex<Option<ClientConfig>>,
    /// The upstream connection, to forget its tool listing when the server changes it.
    upstream: OnceLock<Weak<SharedConnection>>,
}

impl Downstream {
    pub fn set_peer(&self, peer: Peer<RoleServer>) {
        *self.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer);
    }

    pub fn set_client(&self, client: ClientConfig) {
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client);
    }

    pub fn set_upstream(&self, upstream: &Arc<SharedConnection>) {
        let _ = self.upstream.set(Arc::downgrade(upstream));
    }

    fn peer(&self) -> Option<Peer<RoleServer>> {
        self.peer.lock().unwrap_or_else(|p| p.into_inner()).clone().filter(|peer| !peer.is_transport_closed())
    }
}

pub struct Relay {
    pub downstream: Arc<Downstream>,
}

impl Service<RoleClient> for Relay {
    async fn handle_request(&self, request: ServerRequest, _context: RequestContext<RoleClient>) -> Result<ClientResult, ErrorData> {
        if let ServerRequest::PingRequest(_) = request {
            return Ok(ClientResult::empty(()));
        }
        let Some(peer) = self.downstream.peer() else {
            return Err(ErrorData::internal_error("agent-retry proxy: no client to relay this request to (the HTTP form is stateless)", None));
        };
        peer.send_request(request).await.map_err(|e| match e {
            rmcp::service::ServiceError::McpError(error) => error,
            other => ErrorData::internal_error(format!("agent-retry proxy: the client did not answer: {other}"), None),
        })
    }

    async fn handle_notification(&self, notification: ServerNotification, _context: NotificationContext<RoleClient>) -> Result<(), ErrorData> {
        match &notification {
            // Consumed by the proxy's runs (see the module's doc); a cancellation names upstream request ids.
            ServerNotification::ProgressNotification(_) | ServerNotification::TaskStatusNotification(_) | ServerNotification::CancelledNotification(_) => {
                return Ok(());
            }
            ServerNotification::ToolListChangedNotification(_) => {
                if let Some(upstream) = self.downstream.upstream.get().and_then(Weak::upgrade) {
                    upstream.forget_listed_tools();
                }
            }
            _ => {}
        }
        if let Some(peer) = self.downstream.peer() {
            let _ = peer.send_notification(notification).await;
        }
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        self.downstream.client.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default()
    }
}

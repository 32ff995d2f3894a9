//! The client side of a session the wrapper owns: what it says of itself (the
//! application's handler or configuration, with the tasks extension
//! declared), who answers what the server asks (the application's handler:
//! elicitation, sampling, roots; rmcp's defaults without one), and where
//! progress notifications go (to the attempt that waits for them).

use std::sync::Arc;

use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::{ClientConfig, ClientResult, ServerNotification, ServerRequest, TASKS_EXTENSION_ID};
use rmcp::service::{DynService, NotificationContext, RequestContext, Service};
use rmcp::{ErrorData, RoleClient};

/// The application's client handler (any `rmcp::ClientHandler`, boxed with
/// `rmcp::ServiceExt::into_dyn`): it answers the server's requests and the
/// input a continuation or a task asks for.
pub type ClientHandlerRef = Arc<dyn DynService<RoleClient>>;

/// The service every session of an [`super::McpConnection`] runs.
#[derive(Clone)]
pub(crate) struct SessionClient {
    config: ClientConfig,
    handler: Option<ClientHandlerRef>,
    progress: ProgressDispatcher,
}

impl SessionClient {
    pub fn new(config: ClientConfig, handler: Option<ClientHandlerRef>, progress: ProgressDispatcher) -> Self {
        SessionClient { config, handler, progress }
    }
}

/// `config` with the tasks extension (`io.modelcontextprotocol/tasks`)
/// declared, so that a server may answer a tool call with a task.
pub(crate) fn with_tasks_declared(mut config: ClientConfig) -> ClientConfig {
    config.capabilities.extensions.get_or_insert_with(Default::default).entry(TASKS_EXTENSION_ID.to_string()).or_default();
    config
}

impl Service<RoleClient> for SessionClient {
    async fn handle_request(&self, request: ServerRequest, context: RequestContext<RoleClient>) -> Result<ClientResult, ErrorData> {
        match &self.handler {
            Some(handler) => handler.handle_request(request, context).await,
            None => Service::handle_request(&self.config, request, context).await,
        }
    }

    async fn handle_notification(&self, notification: ServerNotification, context: NotificationContext<RoleClient>) -> Result<(), ErrorData> {
        if let ServerNotification::ProgressNotification(progress) = &notification {
            self.progress.handle_notification(progress.params.clone()).await;
        }
        match &self.handler {
            Some(handler) => handler.handle_notification(notification, context).await,
            None => Ok(()),
        }
    }

    fn get_info(&self) -> ClientConfig {
        with_tasks_declared(self.handler.as_ref().map_or_else(|| self.config.clone(), |handler| handler.get_info()))
    }
}

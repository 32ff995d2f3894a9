//! Input a server asks for (MCP 2026-07-28 `inputRequests`: elicitation,
//! sampling, roots), in a continuation (`input_required`) or a task: answered
//! by the application's client handler, as rmcp's own MRTR driver does, or
//! put in words for the policy when nobody can answer.

use rmcp::RoleClient;
use rmcp::model::{ClientResult, InputRequest, InputRequests, InputResponses, NumberOrString, ServerRequest};
use rmcp::service::{Peer, RequestContext};
use serde_json::Value;

use super::session_client::ClientHandlerRef;

/// Rounds of one continuation answered before it is reported as nobody's
/// (rmcp's, Python's and TypeScript's default cap).
pub const MAX_ROUNDS: usize = rmcp::model::DEFAULT_MRTR_MAX_ROUNDS;

/// The server's questions, one a line: each request's `message` (an
/// elicitation's), or what it asks for.
pub fn questions(requests: &InputRequests) -> String {
    requests
        .iter()
        .map(|(key, request)| {
            let wire = serde_json::to_value(request).unwrap_or(Value::Null);
            match wire.pointer("/params/message").and_then(Value::as_str) {
                Some(message) => message.to_string(),
                None => {
                    let method = wire.get("method").and_then(Value::as_str).unwrap_or("an input request");
                    format!("{key}: {method}")
                }
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Answers every request with `handler`. An error is the handler's (it
/// refused, or it has no answer for that kind): the input stays unanswered.
pub async fn answer(handler: &ClientHandlerRef, peer: &Peer<RoleClient>, requests: InputRequests) -> Result<InputResponses, String> {
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let request = match request {
            InputRequest::CreateMessage(r) => ServerRequest::CreateMessageRequest(r),
            InputRequest::Elicitation(r) => ServerRequest::ElicitRequest(r),
            InputRequest::ListRoots(r) => ServerRequest::ListRootsRequest(r),
            other => return Err(format!("{key}: an input request this client does not know ({other:?})")),
        };
        let context = RequestContext::new(NumberOrString::String(key.clone().into()), peer.clone());
        let answered = handler.handle_request(request, context).await.map_err(|e| format!("{key}: {}", e.message))?;
        let value = match answered {
            ClientResult::CreateMessageResult(r) => serde_json::to_value(r),
            ClientResult::ElicitResult(r) => serde_json::to_value(r),
            ClientResult::ListRootsResult(r) => serde_json::to_value(r),
            other => return Err(format!("{key}: the handler answered with {other:?}")),
        }
        .map_err(|e| format!("{key}: {e}"))?;
        responses.insert(key, value);
    }
    Ok(responses)
}

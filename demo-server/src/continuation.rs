//! A continuation on a plain request (MRTR, SEP-2322): `confirm_order` first
//! answers `input_required`, asking a person to confirm, with a
//! `requestState`; the same call sent again with the answer in
//! `inputResponses` and that `requestState` confirms the order (the effect) or
//! not. Every round is recorded in the ledger, so a test can show the effect
//! was applied once, and only on the round that carried the answer.

use rmcp::RoleServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ErrorData, InputRequest, InputRequests, InputRequiredResult, ProtocolVersion};
use rmcp::service::RequestContext;
use serde_json::json;

use crate::ledger::{ConfirmRound, RoundOutcome};
use crate::tasks::accepted;
use crate::tools::{DemoServer, OrderArgs, args, text_result};

/// The `inputRequests` key of the confirmation.
pub const CONFIRM_KEY: &str = "confirm";

/// The elicitation that asks a person to confirm the order.
fn confirmation_request(order_id: &str) -> Result<InputRequest, ErrorData> {
    let request = json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": format!("Confirm order {order_id}?"),
            "requestedSchema": {
                "type": "object",
                "properties": { "confirm": { "type": "boolean", "description": "confirm the order" } },
                "required": ["confirm"],
            },
        },
    });
    serde_json::from_value(request).map_err(|e| ErrorData::internal_error(format!("confirmation request: {e}"), None))
}

/// The `requestState` of a round: it names the order (checked when it comes
/// back) and the round, and needs nothing kept on the server, so a restarted
/// server still takes it.
fn request_state(order_id: &str, round: usize) -> String {
    format!("confirm_order/{order_id}/{round}")
}

fn state_order(state: &str) -> Option<&str> {
    let rest = state.strip_prefix("confirm_order/")?;
    Some(rest.rsplit_once('/')?.0)
}

impl DemoServer {
    pub(crate) fn confirm_order(&self, request: &CallToolRequestParams, context: &RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let a: OrderArgs = args(&request.arguments.clone().unwrap_or_default())?;
        // rmcp refuses `input_required` to older clients; say why first.
        let modern = context.protocol_version().is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if !modern {
            return Err(ErrorData::invalid_request("confirm_order answers input_required, which needs protocol version 2026-07-28", None));
        }
        let answer = request.input_responses.as_ref().and_then(|r| r.get(CONFIRM_KEY));
        let returned_state = request.request_state.clone();
        if let Some(state) = &returned_state
            && state_order(state) != Some(a.order_id.as_str())
        {
            return Err(ErrorData::invalid_params(format!("requestState {state:?} is not a confirmation of order {}", a.order_id), None));
        }
        let outcome = match (answer, &returned_state) {
            (Some(answer), Some(_)) if accepted(answer, "confirm") => RoundOutcome::Confirmed,
            (Some(_), Some(_)) => RoundOutcome::Declined,
            // No answer (or an answer without the state): ask (again).
            _ => RoundOutcome::Asked,
        };
        let round = ConfirmRound { order_id: a.order_id.clone(), request_state: returned_state, outcome };
        let rounds = self.with_ledger(|ledger| {
            ledger.confirmations.push(round);
            ledger.confirmations.len()
        })?;
        let order_id = a.order_id;
        Ok(match outcome {
            RoundOutcome::Asked => {
                let requests = InputRequests::from([(CONFIRM_KEY.to_string(), confirmation_request(&order_id)?)]);
                InputRequiredResult::new(Some(requests), Some(request_state(&order_id, rounds))).into()
            }
            RoundOutcome::Confirmed => text_result(&format!("order {order_id} confirmed"), json!({ "order_id": order_id, "confirmed": true })).into(),
            RoundOutcome::Declined => text_result(&format!("order {order_id} not confirmed"), json!({ "order_id": order_id, "confirmed": false })).into(),
        })
    }
}

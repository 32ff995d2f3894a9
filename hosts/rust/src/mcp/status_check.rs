//! A status check for writes whose effects a read tool lists: call the read,
//! and look for an item that matches the write's arguments.

use rmcp::model::CallToolRequestParams;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::caller::StatusCheck;
use crate::component::types::StatusCheckResult;

/// How to check a write: e.g. `issue_refund` by `list_refunds(order_id)`, looking
/// in `structuredContent.refunds` for an item with the same `order_id` and `amount_paise`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ListedCheck {
    /// The read tool.
    pub tool: String,
    /// The write's arguments the read takes.
    pub arguments: Vec<String>,
    /// Where the items are in the read's `structuredContent`.
    pub list: String,
    /// The fields an item must share with the write's arguments.
    #[serde(rename = "match")]
    pub match_fields: Vec<String>,
}

impl ListedCheck {
    pub fn new(tool: &str, arguments: &[&str], list: &str, match_fields: &[&str]) -> Self {
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        ListedCheck { tool: tool.into(), arguments: strings(arguments), list: list.into(), match_fields: strings(match_fields) }
    }

    /// `found` if a listed item matches, `absent` if none does, `unknown` if the read failed.
    pub fn into_check(self) -> StatusCheck {
        Box::new(move |peer, arguments| {
            let spec = self.clone();
            Box::pin(async move {
                let read: Map<String, Value> = spec.arguments.iter().filter_map(|k| arguments.get(k).map(|v| (k.clone(), v.clone()))).collect();
                match peer.call_tool(CallToolRequestParams::new(spec.tool.clone()).with_arguments(read)).await {
                    Ok(result) if result.is_error != Some(true) => {
                        let items = result.structured_content.as_ref().and_then(|s| s.get(&spec.list)).and_then(Value::as_array).cloned().unwrap_or_default();
                        let found = items.iter().any(|item| spec.match_fields.iter().all(|f| item.get(f) == arguments.get(f)));
                        if found { StatusCheckResult::Found } else { StatusCheckResult::Absent }
                    }
                    _ => StatusCheckResult::Unknown,
                }
            })
        })
    }
}

//! Tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension), through
//! rmcp's `TaskManager`: for a client that declared the extension,
//! `issue_refund` answers with a task that applies the refund when its work is
//! done (once, recorded in the ledger once), asking a person first above the
//! approval limit (`input_required`, answered through `tasks/update`);
//! `archive_orders` runs only as a task. Every `tasks/get`, `tasks/update` and
//! `tasks/cancel` is recorded, with its task id, so a test can count polls and
//! see a cancel.
//!
//! At its TTL, rmcp marks a task that has not finished `failed` ("task expired:
//! TTL elapsed before completion", -32603) and aborts its work, and keeps it
//! one more TTL before `tasks/get` answers -32602 (unknown task). rmcp does
//! this only when its `TaskManager` is next called; this server calls it at
//! each task's TTL, so the work stops then (no refund), polled or not.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{CallToolResponse, CallToolResult, ClientCapabilities, CreateTaskResult, ErrorData, InputRequest};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture, TaskOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::faults::Fault;
use crate::ledger::Archive;
use crate::tools::{APPROVAL_LIMIT_PAISE, AssignedFault, DemoServer, DemoState, RefundArgs, args, lock, refund_refusal, tool_error};

/// One `tasks/get`, `tasks/update` or `tasks/cancel` the server received.
#[derive(Clone, Debug, Serialize)]
pub struct TaskEvent {
    /// ms since the server started.
    pub at_ms: u64,
    /// `tasks/get`, `tasks/update` or `tasks/cancel`.
    pub method: String,
    pub task_id: String,
    /// What the handler answered: the task's status after the request
    /// (`working`, `input_required`, `completed`, `failed`, `cancelled`) or
    /// `error CODE`; `None` when the HTTP fault layer answered (`http`, `drop`).
    pub answer: Option<String>,
    /// The scripted fault, if any (`drop`, `http-503`, `json-rpc-…`, `timeout-after-apply`).
    pub fault: Option<String>,
}

/// A task the server made.
#[derive(Clone, Debug, Serialize)]
pub struct TaskRecord {
    pub at_ms: u64,
    pub task_id: String,
    pub tool: String,
    pub arguments: Value,
}

#[derive(Deserialize)]
struct ArchiveArgs {
    before: String,
}

/// The `inputRequests` key of a refund's approval.
pub const APPROVAL_KEY: &str = "approve-refund";

impl DemoState {
    pub fn record_task_event(&self, method: &str, task_id: &str, answer: Option<String>, fault: Option<String>) {
        let event = TaskEvent { at_ms: self.now_ms(), method: method.to_string(), task_id: task_id.to_string(), answer, fault };
        lock(&self.task_events).push(event);
        if method == "tasks/cancel" {
            let mut ledger = lock(&self.ledger);
            ledger.cancelled_tasks.push(task_id.to_string());
            if let Some(path) = &self.ledger_file {
                // Best effort: the in-memory record stays whatever the disk says.
                let _ = ledger.save(path);
            }
        }
    }

    /// The `method` requests (`tasks/get`...) received for `task_id`, faulted ones included.
    pub fn task_requests(&self, method: &str, task_id: &str) -> Vec<TaskEvent> {
        lock(&self.task_events).iter().filter(|e| e.method == method && e.task_id == task_id).cloned().collect()
    }

    /// The tasks made, in order.
    pub fn tasks_created(&self) -> Vec<TaskRecord> {
        lock(&self.tasks_created).clone()
    }

    /// The task a call of `tool` made, the `n`th (from 0).
    pub fn task_of(&self, tool: &str, n: usize) -> Option<TaskRecord> {
        self.tasks_created().into_iter().filter(|t| t.tool == tool).nth(n)
    }
}

/// Works for `ms`, or stops at `tasks/cancel` (the task is then `cancelled`).
async fn work(context: &TaskContext, ms: u64) -> Result<(), TaskExit> {
    tokio::select! {
        _ = context.cancelled() => Err(TaskExit::Cancelled),
        _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(()),
    }
}

/// The elicitation that asks a person to approve a refund.
fn approval_request(a: &RefundArgs) -> Result<InputRequest, ErrorData> {
    let rupees = a.amount_paise as f64 / 100.0;
    let request = json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": format!("Approve a refund of {rupees:.2} rupees on order {}?", a.order_id),
            "requestedSchema": {
                "type": "object",
                "properties": { "approve": { "type": "boolean", "description": "approve the refund" } },
                "required": ["approve"],
            },
        },
    });
    serde_json::from_value(request).map_err(|e| ErrorData::internal_error(format!("approval request: {e}"), None))
}

/// Whether an elicitation's answer accepts: `action: accept`, and `field` not
/// false (an accept without content accepts).
pub(crate) fn accepted(answer: &Value, field: &str) -> bool {
    answer.get("action").and_then(Value::as_str) == Some("accept") && answer.get("content").and_then(|c| c.get(field)) != Some(&Value::Bool(false))
}

impl DemoServer {
    /// Makes a task for a call of `tool`, with the server's timings.
    fn spawn_task(&self, tool: &str, arguments: &Map<String, Value>, make: impl FnOnce(TaskContext) -> TaskFuture) -> CallToolResponse {
        let timings = self.state.timings();
        let ttl_ms = (timings.task_ttl_ms > 0).then_some(timings.task_ttl_ms);
        let mut options = TaskOptions::new().with_ttl_ms(ttl_ms);
        options.poll_interval_ms = (timings.task_poll_interval_ms > 0).then_some(timings.task_poll_interval_ms);
        let task = self.state.tasks.spawn(options, make);
        let record =
            TaskRecord { at_ms: self.state.now_ms(), task_id: task.task_id.clone(), tool: tool.to_string(), arguments: Value::Object(arguments.clone()) };
        lock(&self.state.tasks_created).push(record);
        if let Some(ttl_ms) = ttl_ms {
            // rmcp expires tasks only when its TaskManager is called: call it at the TTL.
            let tasks = self.state.tasks.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ttl_ms + 1)).await;
                tasks.running_task_count();
            });
        }
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// `issue_refund` as a task: it works, asks a person above the approval
    /// limit, then applies the refund (once; the key still deduplicates).
    pub(crate) fn refund_task(&self, arguments: &Map<String, Value>) -> Result<CallToolResponse, ErrorData> {
        let a: RefundArgs = args(arguments)?;
        if let Some(refused) = refund_refusal(&a) {
            return Ok(refused.into());
        }
        let server = self.clone();
        let work_ms = self.state.timings().task_work_ms;
        Ok(self.spawn_task("issue_refund", arguments, move |context| {
            Box::pin(async move {
                work(&context, work_ms).await?;
                if a.amount_paise > APPROVAL_LIMIT_PAISE {
                    context.set_status_message("waiting for a person to approve the refund");
                    let answer = context.request_input(APPROVAL_KEY, approval_request(&a)?).await?;
                    if !accepted(&answer, "approve") {
                        // A tool error: under SEP-2663 the task is `completed` with `isError`.
                        return Ok(tool_error(Some(403), "the refund was not approved"));
                    }
                }
                let key = a.idempotency_key.as_deref();
                let (refund, _applied) = server.with_ledger(|ledger| ledger.issue_refund(&a.order_id, a.amount_paise, key))?;
                Ok(CallToolResult::structured(json!({ "refund": refund })))
            })
        }))
    }

    /// `archive_orders`: a task, or for a client without the extension the
    /// answer of a 2026-07-28 server to a tool that requires one (-32021,
    /// missing required client capability, naming the extension).
    pub(crate) fn archive_task(&self, arguments: &Map<String, Value>, tasks_declared: bool) -> Result<CallToolResponse, ErrorData> {
        if !tasks_declared {
            return Err(ErrorData::missing_required_client_capability(ClientCapabilities::builder().enable_tasks().build()));
        }
        let a: ArchiveArgs = args(arguments)?;
        let server = self.clone();
        let work_ms = self.state.timings().task_work_ms;
        Ok(self.spawn_task("archive_orders", arguments, move |context| {
            Box::pin(async move {
                work(&context, work_ms).await?;
                let archive = server.with_ledger(|ledger| {
                    let archive = Archive { archive_id: format!("AR-{}", ledger.archives.len() + 1), before: a.before };
                    ledger.archives.push(archive.clone());
                    archive
                })?;
                Ok(CallToolResult::structured(json!({ "archive_id": archive.archive_id, "archived_before": archive.before })))
            })
        }))
    }

    /// Serves a `tasks/*` request: its fault if one is scripted, else `serve`;
    /// recorded either way.
    pub(crate) async fn task_request<T>(
        &self,
        method: &str,
        task_id: &str,
        context: &RequestContext<RoleServer>,
        serve: impl FnOnce() -> Result<T, ErrorData>,
    ) -> Result<T, ErrorData> {
        let assigned = context.extensions.get::<axum::http::request::Parts>().and_then(|parts| parts.extensions.get::<AssignedFault>()).cloned();
        let over_http = assigned.is_some();
        let fault = match assigned {
            Some(AssignedFault(fault)) => fault,
            None => lock(&self.state.faults).next_for_task_request(method),
        };
        let fault_name = fault.as_ref().map(Fault::name);
        let answer = match fault {
            Some(Fault::JsonRpcError { code, message, data }) => Err(ErrorData::new(rmcp::model::ErrorCode(code), message, data)),
            // Over stdio there is no HTTP: the status comes as a JSON-RPC error.
            Some(Fault::Http { status, body, .. }) => {
                Err(ErrorData::internal_error(format!("HTTP {status} (scripted; stdio has no HTTP)"), Some(json!({ "status": status, "body": body }))))
            }
            Some(Fault::Drop) => Err(ErrorData::internal_error("connection dropped", None)),
            Some(Fault::TimeoutAfterApply { delay_ms }) => {
                let answer = serve();
                // Over HTTP the fault layer holds the answer back.
                if !over_http {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                answer
            }
            _ => serve(),
        };
        let status = match &answer {
            Ok(_) => self.state.tasks.get_task(task_id).map(|t| status_name(&t.task.status)).unwrap_or_else(|e| format!("error {}", e.code.0)),
            Err(e) => format!("error {}", e.code.0),
        };
        self.state.record_task_event(method, task_id, Some(status), fault_name);
        answer
    }
}

fn status_name(status: &rmcp::model::TaskStatus) -> String {
    serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

//! The tools, and the one place every call goes through: faults, the call log,
//! then the tool itself.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, ErrorCode, ErrorData, GetTaskParams, GetTaskResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::TaskManager;
use rmcp::{RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::allowance::Allowance;
use crate::faults::{Fault, FaultScript};
use crate::ledger::Ledger;
use crate::tasks::{TaskEvent, TaskRecord};

/// One tools/call the server received.
#[derive(Clone, Debug, Serialize)]
pub struct CallRecord {
    /// ms since the server started.
    pub at_ms: u64,
    pub tool: String,
    pub arguments: Value,
    /// The scripted fault, if any (`"http-429"` for an allowance refusal).
    pub fault: Option<String>,
}

/// How long the slow tools take, and what tasks promise (`agent-retry serve
/// --task-work-ms` and the like).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a task works before it completes (or asks for input).
    pub task_work_ms: u64,
    /// The `pollIntervalMs` a task carries; 0: none is given.
    pub task_poll_interval_ms: u64,
    /// The `ttlMs` a task carries; 0: none (`null`, kept for good).
    pub task_ttl_ms: u64,
    /// How often `export_report` sends `notifications/progress`.
    pub progress_interval_ms: u64,
}

impl Default for Timings {
    fn default() -> Self {
        Timings { task_work_ms: 300, task_poll_interval_ms: 100, task_ttl_ms: 60_000, progress_interval_ms: 200 }
    }
}

/// The server's state, shared by every session and transport.
pub struct DemoState {
    pub ledger: Mutex<Ledger>,
    pub faults: Mutex<FaultScript>,
    pub allowance: Mutex<Option<Allowance>>,
    pub calls: Mutex<Vec<CallRecord>>,
    /// The tasks (SEP-2663) of every client: shared, since a stateless HTTP
    /// server makes a handler per request and a poll may come on any of them.
    pub tasks: TaskManager,
    /// Every tasks/get, tasks/update and tasks/cancel received (see [`crate::tasks`]).
    pub task_events: Mutex<Vec<TaskEvent>>,
    /// Every task made, in order.
    pub tasks_created: Mutex<Vec<TaskRecord>>,
    timings: Mutex<Timings>,
    started: Instant,
    /// Where the ledger is kept across restarts (`agent-retry serve --ledger`).
    pub(crate) ledger_file: Option<PathBuf>,
}

/// Locks a mutex; a poisoned one still holds usable data for a demo server.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl DemoState {
    pub fn new(faults: FaultScript, allowance: Option<Allowance>) -> Arc<Self> {
        Arc::new(DemoState::build(faults, allowance, Ledger::default(), None))
    }

    fn build(faults: FaultScript, allowance: Option<Allowance>, ledger: Ledger, ledger_file: Option<PathBuf>) -> Self {
        DemoState {
            ledger: Mutex::new(ledger),
            faults: Mutex::new(faults),
            allowance: Mutex::new(allowance),
            calls: Mutex::new(Vec::new()),
            tasks: TaskManager::new(),
            task_events: Mutex::new(Vec::new()),
            tasks_created: Mutex::new(Vec::new()),
            timings: Mutex::new(Timings::default()),
            started: Instant::now(),
            ledger_file,
        }
    }

    /// A state whose ledger is read from `path` and written back after every
    /// call, so a restarted or respawned server still knows what was applied
    /// (and which idempotency keys it has seen).
    pub fn with_ledger_file(faults: FaultScript, allowance: Option<Allowance>, path: PathBuf) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(DemoState::build(faults, allowance, Ledger::load(&path)?, Some(path))))
    }

    pub fn timings(&self) -> Timings {
        *lock(&self.timings)
    }

    /// Sets the timings for the tasks and progress from now on.
    pub fn set_timings(&self, timings: Timings) {
        *lock(&self.timings) = timings;
    }

    /// ms since the server started.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn record(&self, tool: &str, arguments: &Map<String, Value>, fault: Option<String>) {
        let at_ms = self.now_ms();
        lock(&self.calls).push(CallRecord { at_ms, tool: tool.to_string(), arguments: Value::Object(arguments.clone()), fault });
    }

    /// Admits a call against the allowance, or gives the wait until it resets.
    pub fn admit(&self) -> Result<(), Duration> {
        match lock(&self.allowance).as_mut() {
            Some(allowance) => allowance.admit(),
            None => Ok(()),
        }
    }

    /// The calls received for `tool`.
    pub fn calls_to(&self, tool: &str) -> Vec<CallRecord> {
        lock(&self.calls).iter().filter(|c| c.tool == tool).cloned().collect()
    }
}

/// A fault the HTTP layer chose for the handler to act out (tool-level faults,
/// and a `tasks/*` request's JSON-RPC error); present on every `tools/call` and
/// `tasks/*` request served over HTTP, so the handler does not count it again.
#[derive(Clone, Debug)]
pub struct AssignedFault(pub Option<Fault>);

#[derive(Clone)]
pub struct DemoServer {
    pub state: Arc<DemoState>,
}

/// A tool error the way an MCP server wrapping an API reports one: `isError`,
/// the upstream status and message in `structuredContent.error`.
/// A tool error as a server relays an upstream failure: the message as text for
/// a person or model, and `{"error": {"status", "message"}}` as structured content.
pub fn tool_error(status: Option<u16>, message: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(message.to_string())]);
    result.structured_content = Some(json!({ "error": { "status": status, "message": message } }));
    result
}

#[derive(Deserialize)]
pub(crate) struct OrderArgs {
    pub order_id: String,
}

#[derive(Clone, Deserialize)]
pub(crate) struct RefundArgs {
    pub order_id: String,
    pub amount_paise: i64,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Deserialize)]
struct UploadArgs {
    asset_id: String,
    content: String,
}

#[derive(Deserialize)]
struct NoteArgs {
    order_id: String,
    text: String,
}

#[derive(Deserialize)]
struct AssetArgs {
    asset_id: String,
}

/// Refunds above this need a person (the seed's 5,000 rupees).
pub const APPROVAL_LIMIT_PAISE: i64 = 500_000;

pub(crate) fn args<T: for<'de> Deserialize<'de>>(arguments: &Map<String, Value>) -> Result<T, ErrorData> {
    serde_json::from_value(Value::Object(arguments.clone())).map_err(|e| ErrorData::invalid_params(format!("bad arguments: {e}"), None))
}

/// A result with `text` for a person or model and `data` as structured content.
pub(crate) fn text_result(text: &str, data: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text.to_string())]);
    result.structured_content = Some(data);
    result
}

impl DemoServer {
    pub fn new(state: Arc<DemoState>) -> Self {
        DemoServer { state }
    }

    /// Runs a tool with no fault (the tools that answer at once).
    pub fn run_tool(&self, name: &str, arguments: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let mut ledger = crate::tools::lock(&self.state.ledger);
        let result = match name {
            "lookup_order" => {
                let a: OrderArgs = args(arguments)?;
                json!({ "order_id": a.order_id, "customer": "Hansini", "amount_paise": 245_000, "status": "delivered" })
            }
            "check_refund_policy" => {
                let a: RefundArgs = args(arguments)?;
                json!({ "order_id": a.order_id, "allowed": a.amount_paise <= APPROVAL_LIMIT_PAISE,
                        "needs_approval": a.amount_paise > APPROVAL_LIMIT_PAISE })
            }
            "issue_refund" => {
                let a: RefundArgs = args(arguments)?;
                if let Some(refused) = refund_refusal(&a) {
                    return Ok(refused);
                }
                if a.amount_paise > APPROVAL_LIMIT_PAISE {
                    return Ok(tool_error(Some(403), "refunds above 5000 rupees need a person"));
                }
                let (refund, _applied) = ledger.issue_refund(&a.order_id, a.amount_paise, a.idempotency_key.as_deref());
                json!({ "refund": refund })
            }
            "list_refunds" => {
                let a: OrderArgs = args(arguments)?;
                let refunds: Vec<_> = ledger.refunds.iter().filter(|r| r.order_id == a.order_id).collect();
                json!({ "refunds": refunds })
            }
            "upload_asset" => {
                let a: UploadArgs = args(arguments)?;
                *ledger.uploads.entry(a.asset_id.clone()).or_default() += 1;
                ledger.assets.insert(a.asset_id.clone(), a.content);
                json!({ "asset_id": a.asset_id })
            }
            "delete_asset" => {
                let a: AssetArgs = args(arguments)?;
                if ledger.assets.remove(&a.asset_id).is_none() {
                    return Ok(tool_error(Some(404), &format!("no asset {}", a.asset_id)));
                }
                json!({ "deleted": a.asset_id })
            }
            "list_assets" => json!({ "assets": ledger.assets.keys().collect::<Vec<_>>() }),
            "record_note" => {
                let a: NoteArgs = args(arguments)?;
                ledger.notes.push(crate::ledger::Note { order_id: a.order_id.clone(), text: a.text });
                json!({ "order_id": a.order_id, "notes": ledger.notes.iter().filter(|n| n.order_id == a.order_id).count() })
            }
            "list_notes" => {
                let a: OrderArgs = args(arguments)?;
                json!({ "notes": ledger.notes.iter().filter(|n| n.order_id == a.order_id).collect::<Vec<_>>() })
            }
            other => return Err(ErrorData::invalid_params(format!("unknown tool {other}"), None)),
        };
        self.save_ledger(&ledger)?;
        Ok(CallToolResult::structured(result))
    }

    /// Applies a change to the ledger and writes the ledger file, if any.
    pub(crate) fn with_ledger<R>(&self, change: impl FnOnce(&mut Ledger) -> R) -> Result<R, ErrorData> {
        let mut ledger = lock(&self.state.ledger);
        let result = change(&mut ledger);
        self.save_ledger(&ledger)?;
        Ok(result)
    }

    fn save_ledger(&self, ledger: &Ledger) -> Result<(), ErrorData> {
        match &self.state.ledger_file {
            Some(path) => ledger.save(path).map_err(|e| ErrorData::internal_error(format!("ledger file {}: {e}", path.display()), None)),
            None => Ok(()),
        }
    }

    /// Runs the tool a call names: as a task, a continuation or with progress
    /// where the tool is one of those, else at once.
    async fn run_call(&self, request: &CallToolRequestParams, context: &RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.clone().unwrap_or_default();
        let tasks_declared = context.client_capabilities().is_some_and(|c| c.supports_tasks());
        match request.name.as_ref() {
            "issue_refund" if tasks_declared => self.refund_task(&arguments),
            "archive_orders" => self.archive_task(&arguments, tasks_declared),
            "confirm_order" => self.confirm_order(request, context),
            "export_report" => self.export_report(&arguments, context).await.map(Into::into),
            name => self.run_tool(name, &arguments).map(Into::into),
        }
    }

    /// Acts out a tool-level fault instead of running the tool.
    fn act_out(&self, fault: Fault) -> Result<CallToolResult, ErrorData> {
        match fault {
            Fault::JsonRpcError { code, message, data } => Err(ErrorData::new(ErrorCode(code), message, data)),
            Fault::ToolError { status, message } => Ok(tool_error(status, &message)),
            Fault::ToolText { text, structured } => {
                let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
                result.structured_content = structured;
                Ok(result)
            }
            // Over stdio there is no HTTP: an HTTP fault is reported as the tool's upstream status.
            Fault::Http { status, body, .. } => Ok(tool_error(Some(status), &body)),
            Fault::Empty => Ok(CallToolResult::success(Vec::<ContentBlock>::new())),
            Fault::Drop => Err(ErrorData::internal_error("connection dropped", None)),
            // Handled by the caller: it runs the tool, then holds the answer.
            Fault::TimeoutAfterApply { .. } => Err(ErrorData::internal_error("timeout-after-apply is acted out by the caller", None)),
        }
    }
}

/// A refund the desk refuses whatever the amount's approval.
pub(crate) fn refund_refusal(a: &RefundArgs) -> Option<CallToolResult> {
    (a.amount_paise <= 0).then(|| tool_error(Some(422), "amount must be a positive integer number of paise"))
}

fn tool(name: &str, description: &str, properties: Value, required: &[&str], annotations: Value) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": { "type": "object", "properties": properties, "required": required },
        "annotations": annotations,
    })
}

/// The tool list, with MCP annotations the policy can use.
pub fn tool_list() -> Value {
    let read = json!({ "readOnlyHint": true });
    let order = json!({ "order_id": { "type": "string" } });
    let refund = json!({ "order_id": { "type": "string" }, "amount_paise": { "type": "integer" },
                         "idempotency_key": { "type": "string", "description": "repeat-safe: a second call with the same key returns the first refund" } });
    let mut archive = tool(
        "archive_orders",
        "Archive the orders placed before a date (a write that runs only as a task: io.modelcontextprotocol/tasks)",
        json!({ "before": { "type": "string", "description": "an ISO 8601 date" } }),
        &["before"],
        json!({ "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false }),
    );
    // SEP-2663's marker; rmcp's `Tool` has no `execution` field, so
    // `tools/list` drops it (the test `the_listing_drops_task_support` shows it).
    archive["execution"] = json!({ "taskSupport": "required" });
    json!([
        tool("lookup_order", "Look up an order", order.clone(), &["order_id"], read.clone()),
        tool("check_refund_policy", "Check whether a refund is allowed without approval", refund.clone(), &["order_id", "amount_paise"], read.clone()),
        tool(
            "issue_refund",
            "Issue a refund (a write; accepts an idempotency key; a task for clients of the tasks extension, which asks a person above 5000 rupees)",
            refund,
            &["order_id", "amount_paise"],
            json!({ "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false })
        ),
        tool("list_refunds", "List the refunds of an order", order.clone(), &["order_id"], read.clone()),
        tool(
            "upload_asset",
            "Upload an asset under a caller-chosen id (a repeat overwrites)",
            json!({ "asset_id": { "type": "string" }, "content": { "type": "string" } }),
            &["asset_id", "content"],
            json!({ "readOnlyHint": false, "idempotentHint": true })
        ),
        tool(
            "delete_asset",
            "Delete an asset",
            json!({ "asset_id": { "type": "string" } }),
            &["asset_id"],
            json!({ "readOnlyHint": false, "destructiveHint": true, "idempotentHint": true })
        ),
        tool("list_assets", "List asset ids", json!({}), &[], read.clone()),
        tool(
            "record_note",
            "Add a note to an order (a write that takes no key: repeat only after checking)",
            json!({ "order_id": { "type": "string" }, "text": { "type": "string" } }),
            &["order_id", "text"],
            json!({ "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false })
        ),
        tool("list_notes", "List the notes of an order", json!({ "order_id": { "type": "string" } }), &["order_id"], read.clone()),
        archive,
        tool(
            "confirm_order",
            "Confirm an order after asking a person (answers input_required first: 2026-07-28)",
            order,
            &["order_id"],
            json!({ "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false })
        ),
        tool(
            "export_report",
            "Export a report, reporting progress while it works",
            json!({ "seconds": { "type": "number", "description": "how long the export takes" } }),
            &["seconds"],
            read
        ),
    ])
}

impl ServerHandler for DemoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_instructions("agent-retry demo: a refund desk and an asset store that fail on a script")
    }

    async fn list_tools(&self, _request: Option<PaginatedRequestParams>, _context: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        // Built by rmcp so that it carries `resultType: complete`, which a
        // 2026-07-28 client requires (rmcp leaves it out for older clients).
        let tools: Vec<Tool> = serde_json::from_value(tool_list()).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(&self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let arguments = request.arguments.clone().unwrap_or_default();
        let assigned = context.extensions.get::<axum::http::request::Parts>().and_then(|parts| parts.extensions.get::<AssignedFault>()).cloned();
        let fault = match assigned {
            // Over HTTP the fault layer already counted, logged and chose.
            Some(AssignedFault(fault)) => fault,
            // Over stdio this is the first place the call is seen.
            None => {
                if let Err(wait) = self.state.admit() {
                    self.state.record(&name, &arguments, Some("http-429".into()));
                    let message = format!("account allowance exhausted; retry in {} s", wait.as_secs().max(1));
                    return Ok(tool_error(Some(429), &message).into());
                }
                let fault = lock(&self.state.faults).next(&name, &arguments);
                self.state.record(&name, &arguments, fault.as_ref().map(Fault::name));
                fault
            }
        };
        match fault {
            None => self.run_call(&request, &context).await,
            // Over stdio (over HTTP the fault layer holds the answer back).
            Some(Fault::TimeoutAfterApply { delay_ms }) => {
                let response = self.run_call(&request, &context).await;
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                response
            }
            Some(fault) => self.act_out(fault).map(Into::into),
        }
    }

    async fn get_task(&self, request: GetTaskParams, context: RequestContext<RoleServer>) -> Result<GetTaskResult, ErrorData> {
        let task_id = request.task_id;
        self.task_request("tasks/get", &task_id, &context, || self.state.tasks.get_task(&task_id).map(GetTaskResult::new)).await
    }

    async fn update_task(&self, request: UpdateTaskParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let task_id = request.task_id;
        let responses = request.input_responses;
        self.task_request("tasks/update", &task_id, &context, || self.state.tasks.update_task(&task_id, responses)).await
    }

    async fn cancel_task(&self, request: CancelTaskParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let task_id = request.task_id;
        self.task_request("tasks/cancel", &task_id, &context, || self.state.tasks.cancel_task(&task_id)).await
    }
}

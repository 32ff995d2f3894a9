extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "agent-retry", path: "../../wit", generate_all });

use agent_retry::policy::types as wit;
use exports::agent_retry::policy::policy::{Guest, GuestPolicy, GuestRun, Policy as PolicyHandle, Run as RunHandle};

/// A bump allocator that never frees: the floor must not pay for an allocator,
/// and a benchmark's instance is dropped after its runs.
mod bump {
    use core::alloc::{GlobalAlloc, Layout};
    use core::cell::UnsafeCell;

    pub struct Bump(UnsafeCell<usize>);
    unsafe impl Sync for Bump {}

    impl Bump {
        pub const fn new() -> Self {
            Bump(UnsafeCell::new(0))
        }
    }

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let next = unsafe { &mut *self.0.get() };
            if *next == 0 {
                *next = core::arch::wasm32::memory_size(0) * 65536;
            }
            let start = (*next + layout.align() - 1) & !(layout.align() - 1);
            let end = start + layout.size();
            let have = core::arch::wasm32::memory_size(0) * 65536;
            if end > have && core::arch::wasm32::memory_grow(0, (end - have).div_ceil(65536)) == usize::MAX {
                return core::ptr::null_mut();
            }
            *next = end;
            start as *mut u8
        }

        unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
    }
}

#[global_allocator]
static ALLOC: bump::Bump = bump::Bump::new();

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// `memcmp` comes from wasi-libc in a `std` guest; `no_std` must bring its own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, len: usize) -> i32 {
    for i in 0..len {
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

struct Component;
struct Policy;
struct Run;

const VERDICT: wit::Verdict = wit::Verdict {
    action: wit::ActionKind::Retry,
    class: wit::OutcomeClass::Transient,
    attempt: 1,
    delay_ms: 0,
    hint_ms: None,
    rule_index: 0,
    has_note: false,
    reconnect: false,
    cancel_task: false,
    breaker_changed: false,
};

fn decision() -> wit::Decision {
    wit::Decision {
        action: wit::Action::CheckStatus,
        class: wit::OutcomeClass::Transient,
        attempt: 1,
        hint_ms: None,
        rule: String::new(),
        reason: String::new(),
        cancel_task: false,
    }
}

impl Guest for Component {
    type Policy = Policy;
    type Run = Run;

    fn derive_idempotency_key(_: String, _: String) -> String {
        String::new()
    }

    fn rule_names() -> Vec<String> {
        // The one rule its verdicts name (index 0), so that a host's check of
        // the index passes.
        alloc::vec![String::from("noop")]
    }

    fn read_probe_answer(_: Option<u16>, _: Option<i32>) -> wit::ProbeAnswer {
        wit::ProbeAnswer::OlderServer
    }
}

impl GuestPolicy for Policy {
    fn from_json(_: String) -> Result<PolicyHandle, wit::ConfigError> {
        Ok(PolicyHandle::new(Policy))
    }

    fn effective_config(&self) -> String {
        String::from("{}")
    }

    fn classify(&self, _: wit::Observation, _: u64) -> wit::Classification {
        wit::Classification {
            class: wit::OutcomeClass::Transient,
            hint_ms: None,
            hint_source: None,
            server_says_retry: None,
            rule: String::new(),
            reason: String::new(),
            header_problems: Vec::new(),
        }
    }

    fn next_delay(&self, _: u32, _: Option<u64>, _: Option<u64>) -> u64 {
        0
    }

    fn start_run(&self, _: String) -> Result<RunHandle, wit::RunError> {
        Ok(RunHandle::new(Run))
    }

    fn resume_run(&self, _: String, _: wit::ResumeAnswer, _: u64) -> Result<RunHandle, wit::SnapshotError> {
        Ok(RunHandle::new(Run))
    }
}

impl GuestRun for Run {
    fn begin_call(&self, _: Option<String>, _: String, _: Option<String>, _: Option<wit::ToolHints>, _: u64) -> Result<wit::CallStart, wit::RunError> {
        let (idle_timeout_ms, attempt_timeout_ms) = (30_000, 600_000);
        Ok(wit::CallStart {
            admitted: true,
            call_id: 1,
            delay_ms: 0,
            effect: wit::Effect::Read,
            safe_to_repeat: true,
            idle_timeout_ms,
            attempt_timeout_ms,
            replan: false,
            breaker_changed: false,
        })
    }

    fn record_success(&self, _: u32, _: u32, _: u64) -> Result<wit::Verdict, wit::RunError> {
        Ok(wit::Verdict { action: wit::ActionKind::Succeed, class: wit::OutcomeClass::Success, ..VERDICT })
    }

    fn record_empty_result(&self, _: u32, _: u32, _: String, _: u64) -> Result<wit::Verdict, wit::RunError> {
        Ok(wit::Verdict { action: wit::ActionKind::Replan, class: wit::OutcomeClass::Semantic, ..VERDICT })
    }

    fn record_failure(&self, _: u32, _: u32, _: wit::Observation, _: Option<u64>, _: u64, _: u64) -> Result<wit::Verdict, wit::RunError> {
        Ok(VERDICT)
    }

    fn record_status_check(&self, _: u32, _: u32, _: wit::StatusCheckResult, _: Option<u64>, _: u64, _: u64) -> Result<wit::Verdict, wit::RunError> {
        Ok(VERDICT)
    }

    fn record_task_status(&self, _: u32, _: u32, _: wit::TaskReport, _: Option<u64>, _: u64, _: u64) -> Result<wit::Verdict, wit::RunError> {
        Ok(VERDICT)
    }

    fn record_poll_failure(&self, _: u32, _: u32, _: wit::Observation, _: Option<u64>, _: u64, _: u64) -> Result<wit::Verdict, wit::RunError> {
        Ok(VERDICT)
    }

    fn abandon_call(&self, _: u32, _: u32, _: bool, _: wit::AbandonReason) -> Result<(), wit::RunError> {
        Ok(())
    }

    fn last_decision(&self, _: u32) -> Option<wit::Decision> {
        Some(decision())
    }

    fn escalation(&self) -> Option<wit::Escalation> {
        None
    }

    fn take_breaker_changes(&self) -> Vec<wit::BreakerChange> {
        Vec::new()
    }

    fn snapshot(&self, _: Option<String>, _: u64) -> Result<String, wit::SnapshotError> {
        Ok(String::new())
    }

    fn resumed_call(&self) -> Option<wit::ResumedCall> {
        None
    }

    fn report(&self) -> wit::RunReport {
        wit::RunReport {
            run_id: String::new(),
            calls: 0,
            attempts: 0,
            retries: 0,
            status_checks: 0,
            replans: 0,
            tasks: 0,
            polls: 0,
            succeeded_calls: 0,
            abandoned_calls: 0,
            waits: 0,
            waited_ms: 0,
            escalation: None,
            statuses: Vec::new(),
            effects: Vec::new(),
            effects_total: 0,
        }
    }

    fn effects(&self, _: u32, _: u32) -> Vec<wit::EffectRecord> {
        Vec::new()
    }
}

export!(Component);

/// wit-bindgen leaves `cabi_realloc` to wasi-libc, which a `no_std` guest lacks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    let ptr = unsafe { alloc(Layout::from_size_align_unchecked(new_len, align)) };
    if ptr.is_null() {
        core::arch::wasm32::unreachable()
    }
    if old_len > 0 {
        unsafe { core::ptr::copy_nonoverlapping(old, ptr, old_len.min(new_len)) };
    }
    ptr
}

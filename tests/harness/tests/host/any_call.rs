//! `PolicyRun::with_policy` around reqwest calls to a local faulty HTTP
//! server (a raw TcpListener answering from a script): 429 with hints, 503,
//! 401, a refused connection, a timeout; the key of a keyed call; the hooks,
//! a hook that panics; the attempts counted as the run report counts them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_retry_host::any_call::{AnyCallError, CallOptions, Observed, PolicyRun, ToObservation, WithPolicyOptions, observe_response};
use agent_retry_host::component::types::{Delivery, EscalationReason, FailureKind, Observation, StatusCheckResult, TransportError};
use agent_retry_host::events::{AttemptEvent, EscalationEvent, Event, RetryHooks, StatusCheckEvent, WaitEvent};
use agent_retry_host::mcp::Metrics;
use agent_retry_host::testing::{FakeClock, fixed_entropy};
use agent_retry_host::{EmbeddedAccounts, HostServices, PolicyComponent, default_wasm_path};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted answer of the faulty server.
#[derive(Clone)]
enum Answer {
    Status(u16, Vec<(&'static str, &'static str)>, &'static str),
    /// Reads the request and never answers.
    Hang,
}

/// A server answering each request with the script's next answer (the last
/// one again once the script is spent), recording each request's head.
struct Faulty {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

async fn faulty(script: Vec<Answer>) -> Faulty {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/thing", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&requests);
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let answer = script[n.min(script.len() - 1)].clone();
            n += 1;
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                seen.lock().unwrap().push(String::from_utf8_lossy(&head).to_lowercase());
                match answer {
                    Answer::Hang => tokio::time::sleep(Duration::from_secs(30)).await,
                    Answer::Status(status, headers, body) => {
                        let mut response = format!("HTTP/1.1 {status} Scripted\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
                        for (name, value) in headers {
                            response.push_str(&format!("{name}: {value}\r\n"));
                        }
                        response.push_str("\r\n");
                        response.push_str(body);
                        let _ = socket.write_all(response.as_bytes()).await;
                        let _ = socket.shutdown().await;
                    }
                }
            });
        }
    });
    Faulty { url, requests }
}

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
    waits: Mutex<Vec<WaitEvent>>,
    retries: Mutex<Vec<AttemptEvent>>,
    escalations: Mutex<Vec<EscalationEvent>>,
    checks: Mutex<Vec<StatusCheckEvent>>,
    panic_in_retry: bool,
}

impl RetryHooks for Recorder {
    fn on_wait(&self, event: &WaitEvent) {
        self.waits.lock().unwrap().push(event.clone());
    }
    fn on_retry(&self, event: &AttemptEvent) {
        self.retries.lock().unwrap().push(event.clone());
        if self.panic_in_retry {
            panic!("on_retry is broken");
        }
    }
    fn on_escalate(&self, event: &EscalationEvent) {
        self.escalations.lock().unwrap().push(event.clone());
    }
    fn on_status_check(&self, event: &StatusCheckEvent) {
        self.checks.lock().unwrap().push(event.clone());
    }
    fn on_event(&self, event: &Event) {
        self.events.lock().unwrap().push(event.clone());
    }
}

struct Setup {
    run: PolicyRun,
    clock: Arc<FakeClock>,
    recorder: Arc<Recorder>,
    metrics: Arc<Metrics>,
}

const CONFIG: &str = r#"{"tools": {"get_thing": {"effect": "read"}, "put_thing": {"effect": "write", "idempotent": true}, "send_thing": {"effect": "write"}}}"#;

fn setup(recorder: Recorder) -> Setup {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), fixed_entropy(7))).unwrap();
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    let recorder = Arc::new(recorder);
    let metrics = Arc::new(Metrics::new());
    let options = WithPolicyOptions { clock: clock.clone(), hooks: Some(recorder.clone()), metrics: Some(metrics.clone()), ..Default::default() };
    let run = PolicyRun::start(instance, CONFIG, "run-any-call", options).unwrap();
    Setup { run, clock, recorder, metrics }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap()
}

async fn get(client: &reqwest::Client, url: &str, key: Option<&str>) -> Result<String, Observed> {
    let mut request = client.get(url);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = observe_response(request.send().await?).await?;
    Ok(response.text().await?)
}

#[tokio::test]
async fn a_429_with_retry_after_waits_the_hint_and_a_keyed_write_keeps_its_key() {
    let server =
        faulty(vec![Answer::Status(429, vec![("retry-after", "2")], "slow down"), Answer::Status(503, vec![], "busy"), Answer::Status(200, vec![], "done")])
            .await;
    let mut s = setup(Recorder::default());
    let client = client();
    let value = s
        .run
        .with_policy("put_thing", |attempt| {
            let (client, url) = (client.clone(), server.url.clone());
            async move { get(&client, &url, attempt.idempotency_key.as_deref()).await }
        })
        .await
        .unwrap();
    assert_eq!(value, "done");
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    let keys: Vec<&str> = requests.iter().map(|r| r.lines().find(|l| l.starts_with("idempotency-key:")).expect("every attempt carries the key")).collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "the same key in every attempt: {keys:?}");
    // The policy read Retry-After: the first wait is at least its 2 s.
    let sleeps = s.clock.sleeps();
    assert_eq!(sleeps.len(), 2, "{sleeps:?}");
    assert!(sleeps[0] >= 2000, "{sleeps:?}");
    let waits = s.recorder.waits.lock().unwrap().clone();
    assert_eq!(waits.iter().map(|w| w.wait_ms).collect::<Vec<_>>(), sleeps, "a wait event before every sleep");
    assert_eq!(waits[0].hint_ms, Some(2000));
    let retries = s.recorder.retries.lock().unwrap().clone();
    assert_eq!(retries.iter().map(|r| r.outcome.as_str()).collect::<Vec<_>>(), ["http 429", "http 503"]);
    let report = s.run.finish().unwrap();
    assert_eq!(report.attempts, 3);
    assert_eq!(s.metrics.instruments().attempts_total(), 3);
}

#[tokio::test]
async fn a_503_that_says_x_should_retry_false_is_not_sent_again() {
    let server = faulty(vec![Answer::Status(503, vec![("x-should-retry", "false")], "no")]).await;
    let mut s = setup(Recorder::default());
    let client = client();
    let result = s.run.with_policy("get_thing", |_| get(&client, &server.url, None)).await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(server.requests.lock().unwrap().len(), 1, "the server said not to retry");
    assert!(s.clock.sleeps().is_empty());
}

#[tokio::test]
async fn repeated_503s_end_in_an_escalation_counted_as_the_report_counts() {
    let server = faulty(vec![Answer::Status(503, vec![], "busy")]).await;
    let mut s = setup(Recorder::default());
    let client = client();
    let result = s.run.with_policy("get_thing", |_| get(&client, &server.url, None)).await;
    let Err(AnyCallError::Escalated(escalation)) = result else { panic!("{result:?}") };
    let escalations = s.recorder.escalations.lock().unwrap().clone();
    assert_eq!(escalations.len(), 1);
    assert_eq!(escalations[0].note(), escalation.note);
    let sent = server.requests.lock().unwrap().len() as u32;
    let report = s.run.report().unwrap();
    assert_eq!(report.attempts, sent);
    assert_eq!(s.metrics.instruments().attempts_total(), u64::from(sent));
    assert_eq!(s.metrics.instruments().escalations.get(&escalation.reason.to_string()), Some(&1));
}

#[tokio::test]
async fn a_401_is_never_repeated_as_is() {
    let server = faulty(vec![Answer::Status(401, vec![("www-authenticate", "Bearer")], "who are you")]).await;
    let mut s = setup(Recorder::default());
    let client = client();
    let result = s.run.with_policy("get_thing", |_| get(&client, &server.url, None)).await;
    match result {
        Err(AnyCallError::Escalated(e)) => assert_eq!(e.reason, EscalationReason::PermissionDenied, "{e:?}"),
        other => panic!("a 401 escalates: {other:?}"),
    }
    assert_eq!(server.requests.lock().unwrap().len(), 1);
    let events = s.recorder.events.lock().unwrap().clone();
    let Some(Event::Attempt(attempt)) = events.first() else { panic!("{events:?}") };
    assert_eq!(attempt.outcome, "http 401");
    assert_eq!(attempt.action, "escalate");
}

#[tokio::test]
async fn a_refused_connection_is_observed_as_not_sent() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/thing");
    // The observation itself, as the mapping gives it.
    let error = client().get(&url).send().await.unwrap_err();
    let observation = error.to_observation().unwrap();
    assert!(matches!(observation.kind, FailureKind::Transport(TransportError::ConnectionRefused)), "{observation:?}");
    assert_eq!(observation.delivery, Delivery::NotSent);
    // Through the policy: a write not sent is safe to send again.
    let mut s = setup(Recorder::default());
    let client = client();
    let mut attempts = 0;
    let result = s
        .run
        .with_policy("send_thing", |_| {
            attempts += 1;
            let (client, url) = (client.clone(), url.clone());
            async move { get(&client, &url, None).await }
        })
        .await;
    assert!(result.is_err());
    assert!(attempts > 1, "a connection refused before sending is retried even for an unkeyed write: {attempts}");
    let outcomes: Vec<String> =
        s.recorder.events.lock().unwrap().iter().filter_map(|e| if let Event::Attempt(a) = e { Some(a.outcome.clone()) } else { None }).collect();
    assert!(outcomes.iter().all(|o| o == "transport connection-refused"), "{outcomes:?}");
}

#[tokio::test]
async fn a_timeout_of_an_unkeyed_write_goes_to_the_status_check_never_resent_blind() {
    let server = faulty(vec![Answer::Hang]).await;
    let mut s = setup(Recorder::default());
    let checked = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&checked);
    let mut run = s.run.with_status_check(
        "send_thing",
        Box::new(move || {
            *counter.lock().unwrap() += 1;
            Box::pin(async { StatusCheckResult::Absent })
        }),
    );
    let client = client();
    let result = run.with_policy("send_thing", |_| get(&client, &server.url, None)).await;
    let sent = server.requests.lock().unwrap().len();
    assert!(*checked.lock().unwrap() >= 1, "the ambiguous write was checked first: {result:?}");
    // Each resend came after a status check said the write was absent.
    assert!(sent <= *checked.lock().unwrap() + 1, "{sent} sends, {} checks", checked.lock().unwrap());
    let checks = s.recorder.checks.lock().unwrap().clone();
    assert!(checks.iter().all(|c| c.result == StatusCheckResult::Absent));
    let outcomes: Vec<String> =
        s.recorder.events.lock().unwrap().iter().filter_map(|e| if let Event::Attempt(a) = e { Some(a.outcome.clone()) } else { None }).collect();
    assert_eq!(outcomes[0], "transport timeout", "{outcomes:?}");
    s.run = run;
    let report = s.run.report().unwrap();
    assert_eq!(report.attempts as usize, sent);
}

#[tokio::test]
async fn a_panicking_hook_does_not_break_the_call() {
    let server = faulty(vec![Answer::Status(503, vec![], "busy"), Answer::Status(503, vec![], "busy"), Answer::Status(200, vec![], "ok")]).await;
    let mut s = setup(Recorder { panic_in_retry: true, ..Default::default() });
    let client = client();
    let value = s.run.with_policy("get_thing", |_| get(&client, &server.url, None)).await.unwrap();
    assert_eq!(value, "ok");
    assert_eq!(s.recorder.retries.lock().unwrap().len(), 2, "the hook is still called after it panicked");
    assert_eq!(s.clock.sleeps().len(), 2);
}

/// An error its mapping does not know.
#[derive(Debug, PartialEq)]
struct Bug(&'static str);

impl ToObservation for Bug {
    fn to_observation(&self) -> Option<Observation> {
        None
    }
}

#[tokio::test]
async fn an_error_the_mapping_does_not_know_is_handed_back_unchanged() {
    let mut s = setup(Recorder::default());
    let result: Result<(), _> = s.run.with_policy("get_thing", |_| async { Err(Bug("index out of range")) }).await;
    match result {
        Err(AnyCallError::Unobserved(bug)) => assert_eq!(bug, Bug("index out of range")),
        other => panic!("{other:?}"),
    }
    assert!(s.clock.sleeps().is_empty(), "not retried");
    // The run goes on: the next call is served.
    let next: Result<u32, AnyCallError<Observed>> = s.run.with_policy("get_thing", |_| async { Ok(7) }).await;
    assert_eq!(next.unwrap(), 7);
    assert_eq!(s.metrics.instruments().attempts_total(), u64::from(s.run.report().unwrap().attempts));
}

#[tokio::test]
async fn a_call_timeout_stops_before_a_wait_that_would_pass_it() {
    let server = faulty(vec![Answer::Status(429, vec![("retry-after", "30")], "")]).await;
    let component = PolicyComponent::from_file(&default_wasm_path()).unwrap();
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), fixed_entropy(7))).unwrap();
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    let metrics = Arc::new(Metrics::new());
    let options = WithPolicyOptions { clock: clock.clone(), call_timeout_ms: Some(5_000), metrics: Some(metrics.clone()), ..Default::default() };
    let mut run = PolicyRun::start(instance, CONFIG, "run-deadline", options).unwrap();
    let client = client();
    let result = run.with_policy_using("get_thing", CallOptions::default(), |_| get(&client, &server.url, None)).await;
    assert!(result.is_err(), "{result:?}");
    assert!(clock.sleeps().iter().sum::<u64>() <= 5_000, "never waits past the call's deadline: {:?}", clock.sleeps());
    // A stopped call's attempts are counted as the report counts them.
    assert_eq!(metrics.instruments().attempts_total(), u64::from(run.report().unwrap().attempts));
}

/// The liar asks for an hour's wait before the first send: the guard refuses it
/// and nothing is sent. Its line comes first, attempt 0, and counts as the run
/// report counts the admitted call (as in Python and Node).
#[tokio::test]
async fn a_first_send_the_guard_refuses_is_attempt_0_counted_as_the_report_counts_it() {
    let liar = default_wasm_path().parent().and_then(|p| p.parent()).expect("target/").join("hostile/liar.wasm");
    let component = PolicyComponent::from_file(&liar).unwrap_or_else(|e| panic!("{}: {e} (run `make hostile`)", liar.display()));
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), fixed_entropy(7))).unwrap();
    let recorder = Arc::new(Recorder::default());
    let metrics = Arc::new(Metrics::new());
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    let options = WithPolicyOptions { clock, hooks: Some(recorder.clone()), metrics: Some(metrics.clone()), ..Default::default() };
    let config = r#"{"base-delay-ms": 20, "x-liar": {"start-delay-ms": 3600000}}"#;
    let mut run = PolicyRun::start(instance, config, "LIAR-START", options).unwrap();
    let sent = Arc::new(Mutex::new(0u32));
    let counter = Arc::clone(&sent);
    let result: Result<&str, AnyCallError<Observed>> = run
        .with_policy("r", move |_| {
            let counter = Arc::clone(&counter);
            async move {
                *counter.lock().unwrap() += 1;
                Ok("value")
            }
        })
        .await;
    assert!(matches!(&result, Err(AnyCallError::Escalated(e)) if e.reason == EscalationReason::UnclassifiedFailure), "{result:?}");
    assert_eq!(*sent.lock().unwrap(), 0, "nothing was sent");
    let events = recorder.events.lock().unwrap().clone();
    let order: Vec<(&str, u32)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Attempt(a) => Some(("attempt", a.attempt)),
            Event::Escalation(x) => Some(("escalation", x.attempt)),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec![("attempt", 0), ("escalation", 0)], "{events:?}");
    assert_eq!(metrics.instruments().attempts_total(), u64::from(run.report().unwrap().attempts));
}

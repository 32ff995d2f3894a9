//! Scenario T8 of tests/fault-proxy/README.md: a caller on a bare peer whose
//! HTTP client is not the wrapper's capturing one warns once and says so in the
//! reason of every decision on such a failure.

use crate::capture::capture;

use std::sync::Arc;

use agent_retry_demo_server::faults::{Fault, rule_first};
use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::mcp::{CallError, Metrics, RetryingToolCaller, RetryingToolCallerOptions};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::json;

const CONFIG: &str = r#"{"base-delay-ms": 50, "max-delay-ms": 200}"#;

fn instance() -> agent_retry_host::PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(10))).unwrap()
}

#[tokio::test]
async fn t8_a_bare_peer_without_the_capturing_client_warns_once_and_says_so_in_the_reason() {
    let capture = capture();
    let captured = &capture.captured;
    let fault = Fault::Http { status: 429, headers: vec![("Retry-After".into(), "1".into())], body: "slow down".into() };
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::new(vec![rule_first("lookup_order", 2, fault)]), None)).await.unwrap();
    // rmcp's own reqwest client: it keeps no headers of a failed POST.
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(server.url.clone());
    let client = rmcp::ServiceExt::serve(rmcp::model::ClientConfig::default(), transport).await.unwrap();
    let mut caller =
        RetryingToolCaller::start(client.peer().clone(), instance(), CONFIG, "run-bare", RetryingToolCallerOptions::default(), Arc::new(Metrics::new()))
            .await
            .unwrap();
    // rmcp's client reports the 429 as an error of its own, without the status:
    // the policy cannot classify it, and the line says why.
    let error = caller.call("lookup_order", json!({"order_id": "T8"}).as_object().cloned().unwrap()).await.unwrap_err();
    assert!(matches!(error, CallError::Escalated(_)), "{error:?}");
    let text = captured.text();
    assert_eq!(text.matches("agent_retry.capture_missing").count(), 1, "{text}");
    let limited = text.lines().filter(|l| l.contains("agent_retry.attempt") && l.contains("the transport is not the wrapper's capturing one")).count();
    assert_eq!(limited, 1, "the decision on the uncaptured failure says so: {text}");
    server.stop().await;
}

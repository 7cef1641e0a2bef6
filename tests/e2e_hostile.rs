//! End-to-end proof, through a real kube-apiserver, that one hostile write cannot turn into a
//! flood of lease lookups against kube-apiserver: a 20,000-entry StorageVersion status (every
//! entry a distinct apiServerID with no lease) is sent through the apiserver, which calls the
//! webhook; the lease GETs kube-apiserver serves meanwhile are counted at the apiserver (its
//! `apiserver_request_total` for `leases`), and the webhook's own lookups in its metrics.
//!
//! Run alone: `cargo test --test e2e_hostile -- --nocapture`.

mod support;

use std::time::{Duration, Instant};

use storageversion_webhook::admission::DEFAULT_MAX_LEASE_LOOKUPS;
use support::*;

const SV_NAME: &str = "hostile.example.com.widgets";

/// The GETs of leases kube-apiserver has served, from its own metrics.
async fn apiserver_lease_gets(cp: &ControlPlane) -> f64 {
    let req = hyper::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = cp
        .client
        .request_text(req)
        .await
        .expect("GET kube-apiserver /metrics");
    metric_sum(
        &text,
        "apiserver_request_total",
        &["resource=\"leases\"", "verb=\"GET\""],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_ids_make_a_bounded_number_of_lease_gets_at_the_apiserver() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let (_certs, hook) = registered_webhook(&cp, &["--enforcement=deny", "--no-gc"], "Fail").await;
    create_sv(&cp, SV_NAME).await;

    let ids: Vec<String> = (0..20_000).map(|i| format!("hostile-{i:06}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let status = status_for("hostile.example.com", &ids);

    let gets_before = apiserver_lease_gets(&cp).await;
    let started = Instant::now();
    let result = put_status(&cp, SV_NAME, status).await;
    let took = started.elapsed();
    let gets_after = apiserver_lease_gets(&cp).await;
    let error = api_error_text(&result);
    eprintln!(
        "20,000-entry write answered in {took:?}: {}",
        &error[..error.len().min(300)]
    );
    assert!(
        result.is_err(),
        "a write naming 20,000 apiservers without leases was stored"
    );
    assert!(
        error.contains("lease-missing"),
        "the denial is the webhook's, summarised: {}",
        &error[..error.len().min(2000)]
    );

    let metrics = hook.metrics().await;
    let webhook_live = lease_lookups_total(&metrics, &[])
        - lease_lookups_total(&metrics, &["result=\"cache_hit\""]);
    eprintln!(
        "lease GETs at kube-apiserver: {} (webhook live lookups {webhook_live})",
        gets_after - gets_before
    );
    let limit = DEFAULT_MAX_LEASE_LOOKUPS as f64;
    assert!(
        webhook_live <= limit,
        "the webhook made {webhook_live} live lookups, want at most {limit}"
    );
    // The control plane's own components (leader election, the apiserver's identity lease)
    // also GET leases now and then; 20,000 would be the defect.
    assert!(
        gets_after - gets_before <= limit + 100.0,
        "kube-apiserver served {} lease GETs during one review",
        gets_after - gets_before
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    hook.wait_ready(Duration::from_secs(5)).await;
}

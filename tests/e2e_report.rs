//! End-to-end proof of the policy report (`serve --report`, docs/report.md) through a real
//! kube-apiserver with the real OpenReports CRDs (component `openreports` of
//! tests/controlplane/build, copied out of the pinned Go module) and the real `serve` binary.
//! The webhook is not registered, so the violating StorageVersions the tests write land.
//!
//! Run one alone: `cargo test --test e2e_report -- a_finding_appears_and_goes --nocapture`.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DeleteParams};
use storageversion_webhook::report::build::OMITTED_ANNOTATION;
use storageversion_webhook::report::types::{ClusterReport, ReportResult, Status};
use support::gc::create_lease;
use support::*;

const MINUTE: Duration = Duration::from_secs(60);
const REPORT: &str = "svw-e2e";
/// A new finding must be in the report this soon (the debounce is 0.5 s).
const SECONDS: Duration = Duration::from_secs(10);

/// `serve --report` flags: a quick leader election, a collector that changes nothing (so the
/// stale entries stay), a short resync.
fn report_flags(extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--report",
        "--report-resync-interval=2s",
        "--gc-dry-run",
        "--gc-leader-lease-namespace=default",
        "--gc-leader-lease-name=svw-report-test",
        "--gc-leader-lease-duration=6s",
        "--gc-leader-lease-grace=2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.push(format!("--report-name={REPORT}"));
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

async fn start(cp: &ControlPlane, certs: &Certs, extra: &[&str]) -> Webhook {
    let flags = report_flags(extra);
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    Webhook::start(cp, certs, &refs).await
}

fn reports(cp: &ControlPlane) -> Api<ClusterReport> {
    Api::all(cp.client.clone())
}

async fn report(cp: &ControlPlane) -> Option<ClusterReport> {
    reports(cp).get_opt(REPORT).await.ok().flatten()
}

/// Polls until the report satisfies `cond`, and returns it.
async fn wait_report(
    cp: &ControlPlane,
    hook: &Webhook,
    deadline: Duration,
    what: &str,
    cond: impl Fn(&ClusterReport) -> bool,
) -> ClusterReport {
    let end = Instant::now() + deadline;
    loop {
        let got = report(cp).await;
        if let Some(r) = got.as_ref().filter(|r| cond(r)) {
            return r.clone();
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for the report to have {what}; report:\n{}\nlogs:\n{}",
            serde_json::to_string_pretty(&got).unwrap_or_default(),
            hook.logs_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The result about `apiServerID` `id` of StorageVersion `sv` with rule `rule`, if listed.
fn finding<'a>(r: &'a ClusterReport, sv: &str, rule: &str, id: &str) -> Option<&'a ReportResult> {
    r.results.iter().find(|x| {
        x.rule.as_deref() == Some(rule)
            && x.resources.first().and_then(|o| o.name.as_deref()) == Some(sv)
            && x.properties.get("apiServerID").map(String::as_str) == Some(id)
    })
}

fn report_metric(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metric_sum(
        metrics,
        &format!("storageversion_webhook_report_{name}"),
        labels,
    )
}

/// Writes StorageVersion `name` with one entry of the control plane's own apiserver and one of
/// each of `ids`.
async fn write_sv(cp: &ControlPlane, own: &str, name: &str, group: &str, ids: &[&str]) {
    let mut all = vec![own];
    all.extend_from_slice(ids);
    if storage_versions(cp)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        create_sv(cp, name).await;
    }
    put_status(cp, name, status_for(group, &all))
        .await
        .unwrap_or_else(|e| panic!("writing {name}: {e}"));
}

/// (1) A StorageVersion entry naming an apiserver without a lease shows up as a failing result
/// within seconds; (2) it goes when its lease is created, and another when its entry is
/// removed; an unchanged cluster is not written again (also at resyncs); a report deleted by
/// someone comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_finding_appears_and_goes() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    install_openreports_crds(&cp);
    let own = own_apiserver_id(&cp).await;
    let certs = Certs::generate();
    let hook = start(&cp, &certs, &[]).await;

    // A clean cluster: every StorageVersion kube-apiserver wrote passes, nothing fails.
    let clean = wait_report(&cp, &hook, MINUTE, "a clean summary", |r| {
        r.summary.is_some_and(|s| s.pass > 0 && s.fail == 0)
    })
    .await;
    assert!(clean.results.is_empty(), "{:?}", clean.results);
    assert_eq!(
        clean
            .configuration
            .as_ref()
            .and_then(|c| c.limits.max_results),
        Some(1000)
    );

    // (1) Violations land (the webhook is not registered) and are reported within seconds.
    let (a, b) = ("e2e.example.com.widgets", "e2e.example.com.gadgets");
    write_sv(&cp, &own, a, "e2e.example.com", &["apiserver-gone-a"]).await;
    write_sv(&cp, &own, b, "e2e.example.com", &["apiserver-gone-b"]).await;
    let written = Instant::now();
    let r = wait_report(&cp, &hook, SECONDS, "both lease-missing results", |r| {
        finding(r, a, "lease-missing", "apiserver-gone-a").is_some()
            && finding(r, b, "lease-missing", "apiserver-gone-b").is_some()
    })
    .await;
    eprintln!("findings reported {:?} after the writes", written.elapsed());
    let f = finding(&r, a, "lease-missing", "apiserver-gone-a").expect("listed");
    assert_eq!(f.result, Some(Status::Fail));
    assert_eq!(f.policy, "storageversion-webhook");
    let subject = &f.resources[0];
    assert_eq!(
        subject.api_version.as_deref(),
        Some("internal.apiserver.k8s.io/v1alpha1")
    );
    assert_eq!(subject.kind.as_deref(), Some("StorageVersion"));
    assert!(subject.uid.is_some(), "{subject:?}");
    assert!(
        f.message
            .as_deref()
            .is_some_and(|m| m.contains("does not exist")),
        "{f:?}"
    );
    assert_eq!(r.summary.map(|s| s.fail), Some(2));
    let m = hook.metrics().await;
    assert_eq!(report_metric(&m, "results", &[r#"result="fail""#]), 2.0);
    assert!(report_metric(&m, "writes_total", &[r#"result="applied""#]) >= 2.0);

    // Nothing changes: no write, through several judgements and resyncs (every 2 s).
    let rv = r.metadata.resource_version.clone();
    let writes = report_metric(&m, "writes_total", &[]);
    let judged = report_metric(&m, "judgements_total", &[]);
    poll_until(MINUTE, "three more judgements", || async {
        report_metric(&hook.metrics().await, "judgements_total", &[]) >= judged + 3.0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let m = hook.metrics().await;
    assert_eq!(report_metric(&m, "writes_total", &[]), writes, "rewritten");
    let again = report(&cp).await.expect("report");
    assert_eq!(again.metadata.resource_version, rv, "the object changed");

    // (2) Fixed by a lease: gone within seconds; fixed by removing the entry: gone too.
    create_lease(&cp, &live_identity_lease("apiserver-gone-a")).await;
    wait_report(&cp, &hook, SECONDS, "no result for the leased entry", |r| {
        finding(r, a, "lease-missing", "apiserver-gone-a").is_none()
            && finding(r, b, "lease-missing", "apiserver-gone-b").is_some()
    })
    .await;
    write_sv(&cp, &own, b, "e2e.example.com", &[]).await;
    let r = wait_report(&cp, &hook, SECONDS, "no failing result", |r| {
        r.results.is_empty() && r.summary.is_some_and(|s| s.fail == 0)
    })
    .await;
    assert_eq!(r.summary.map(|s| s.warn), Some(0));

    // Deleted by someone: back by the next resync.
    reports(&cp)
        .delete(REPORT, &DeleteParams::default())
        .await
        .expect("delete the report");
    wait_report(&cp, &hook, SECONDS, "the report back", |r| {
        r.summary.is_some_and(|s| s.pass > 0)
    })
    .await;
}

/// (3) 300 violating StorageVersions with `--report-max-results 50`: 50 results, the summary
/// counts all 300, the annotation the 250 left out.
#[tokio::test(flavor = "multi_thread")]
async fn many_findings_stay_within_the_bound() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    install_openreports_crds(&cp);
    let own = own_apiserver_id(&cp).await;
    let certs = Certs::generate();
    let hook = start(&cp, &certs, &["--report-max-results=50"]).await;
    let started = Instant::now();
    let writes = (0..300).map(|i| {
        let cp = &cp;
        let own = own.as_str();
        async move {
            let name = format!("e2e{i:03}.example.com.widgets");
            let group = format!("e2e{i:03}.example.com");
            write_sv(cp, own, &name, &group, &["apiserver-gone"]).await;
        }
    });
    futures::stream::iter(writes)
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    eprintln!("300 StorageVersions written in {:?}", started.elapsed());
    let r = wait_report(&cp, &hook, MINUTE, "300 failing findings", |r| {
        r.summary.is_some_and(|s| s.fail == 300)
    })
    .await;
    assert_eq!(r.results.len(), 50);
    assert!(r.results.iter().all(|x| x.result == Some(Status::Fail)));
    assert_eq!(
        r.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OMITTED_ANNOTATION))
            .map(String::as_str),
        Some("250")
    );
    assert_eq!(
        r.configuration.as_ref().and_then(|c| c.limits.max_results),
        Some(50)
    );
    // The first 50 in the report's order: the same severity, so by name.
    let names: Vec<_> = r
        .results
        .iter()
        .filter_map(|x| x.resources.first()?.name.clone())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names[0], "e2e000.example.com.widgets");
    let bytes = serde_json::to_vec(&r).expect("encode").len();
    assert!(bytes < 256 * 1024, "report of {bytes} bytes");
    let m = hook.metrics().await;
    assert_eq!(report_metric(&m, "omitted_results", &[]), 250.0);
    assert_eq!(report_metric(&m, "results", &[r#"result="fail""#]), 300.0);
}

/// Without the CRD the leader says so once and retries with backoff (no spin, no crash); once
/// the CRD is installed the report appears. (4) A replica that does not lead writes nothing; it
/// writes once it leads.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_writes_and_a_missing_crd_is_waited_for() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let own = own_apiserver_id(&cp).await;
    let certs = Certs::generate();
    let mut a = start(&cp, &certs, &[]).await;
    poll_until(MINUTE, "replica a to lead", || async {
        metric_sum(&a.metrics().await, "storageversion_webhook_gc_leader", &[]) == 1.0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", a.logs_text()));
    let b = start(&cp, &certs, &[]).await;

    poll_until(MINUTE, "a to find the CRD missing", || async {
        report_metric(
            &a.metrics().await,
            "writes_total",
            &[r#"result="crd_missing""#],
        ) >= 1.0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", a.logs_text()));
    // Backoff, not a spin: over 8 s, at most a handful of attempts (1 s, 2 s, 4 s, ...), and the
    // warning once.
    let first = report_metric(&a.metrics().await, "writes_total", &[]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let attempts = report_metric(&a.metrics().await, "writes_total", &[]) - first;
    assert!(attempts <= 4.0, "{attempts} attempts in 8 s");
    let warned = a
        .logs_text()
        .lines()
        .filter(|l| l.contains("is not served"))
        .count();
    assert_eq!(warned, 1, "logs:\n{}", a.logs_text());
    assert!(a.child.try_wait().ok().flatten().is_none(), "a exited");

    install_openreports_crds(&cp);
    write_sv(
        &cp,
        &own,
        "e2e.example.com.widgets",
        "e2e.example.com",
        &["apiserver-gone"],
    )
    .await;
    wait_report(&cp, &a, Duration::from_secs(90), "a's finding", |r| {
        finding(
            r,
            "e2e.example.com.widgets",
            "lease-missing",
            "apiserver-gone",
        )
        .is_some()
    })
    .await;
    // (The log line follows the write: wait for it too.)
    poll_until(SECONDS, "a to log that the CRD is there", || async {
        a.logs_text().contains("installed now")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", a.logs_text()));

    // The follower judged nothing and wrote nothing.
    let m = b.metrics().await;
    assert_eq!(metric_sum(&m, "storageversion_webhook_gc_leader", &[]), 0.0);
    assert_eq!(report_metric(&m, "writes_total", &[]), 0.0);
    assert_eq!(report_metric(&m, "judgements_total", &[]), 0.0);

    // a stops (releasing the Lease): b leads and keeps the report.
    assert!(a.terminate().success());
    poll_until(MINUTE, "b to lead", || async {
        metric_sum(&b.metrics().await, "storageversion_webhook_gc_leader", &[]) == 1.0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", b.logs_text()));
    write_sv(
        &cp,
        &own,
        "e2e.example.com.gadgets",
        "e2e.example.com",
        &["apiserver-gone-too"],
    )
    .await;
    wait_report(&cp, &b, SECONDS, "b's finding", |r| {
        finding(
            r,
            "e2e.example.com.gadgets",
            "lease-missing",
            "apiserver-gone-too",
        )
        .is_some()
    })
    .await;
    assert!(report_metric(&b.metrics().await, "writes_total", &[r#"result="applied""#]) >= 1.0);
    // kubectl reads it too (the CRD's printer columns).
    let out = cp
        .kubectl()
        .args(["get", "clusterreports", REPORT])
        .output()
        .expect("kubectl get");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(REPORT), "{text}");
}

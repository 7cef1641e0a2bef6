//! Criterion micro-benchmarks of the admission rules (issue: "Rules alone"), on the realistic
//! `/status` UPDATE of `apps.deployments` with three entries and on a 60-entry object, plus the
//! decode step and the whole in-process review (decode, lease lookups, rules, response) for
//! comparison. Run: `cargo bench --bench rules` (`bench/run` does, and reports the medians).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::jiff::Timestamp;
use prometheus_client::registry::Registry;
use storageversion_webhook::admission::{decode_review, Admission, Enforcement};
use storageversion_webhook::leases::StaticLeases;
use storageversion_webhook::metrics::Metrics;
use storageversion_webhook::model::{LeaseLookup, LeaseRecord, StorageVersion};
use storageversion_webhook::rules::{self, LeaseFacts, RuleOptions};

use svw_testkit::fixtures;

struct Case {
    label: &'static str,
    new: StorageVersion,
    old: StorageVersion,
    facts: LeaseFacts,
    body: Vec<u8>,
    admission: Admission,
}

fn case(label: &'static str, entries: usize) -> Case {
    let ids = fixtures::apiserver_ids(entries);
    let review = fixtures::status_update_review(&ids);
    let object = &review["request"]["object"];
    let old_object = &review["request"]["oldObject"];
    let new: StorageVersion = serde_json::from_value(object.clone()).expect("fixture object");
    let old: StorageVersion =
        serde_json::from_value(old_object.clone()).expect("fixture oldObject");
    let facts: LeaseFacts = ids
        .iter()
        .map(|id| {
            (
                id.clone(),
                LeaseLookup::Found(LeaseRecord::live_apiserver(id.as_str())),
            )
        })
        .collect();
    let leases = StaticLeases::new(
        ids.iter()
            .map(|id| LeaseRecord::live_apiserver(id.as_str())),
    );
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let admission = Admission::new(
        Arc::new(leases),
        Enforcement::Deny,
        Duration::from_secs(30),
        metrics,
    );
    Case {
        label,
        new,
        old,
        facts,
        body: serde_json::to_vec(&review).expect("fixture review"),
        admission,
    }
}

fn bench(c: &mut Criterion) {
    let opts = RuleOptions {
        now: Timestamp::now(),
        lease_skew_allowance: Duration::from_secs(30),
    };
    for case in [case("3-entries", 3), case("60-entries", 60)] {
        // The verdict must be "allowed, no findings", or the benchmark measures the wrong path.
        let eval = rules::evaluate(&case.new, Some(&case.old), &case.facts, &opts);
        assert!(eval.findings.is_empty(), "{:?}", eval.findings);

        let mut g = c.benchmark_group(case.label);
        g.bench_function("rules_evaluate", |b| {
            b.iter(|| {
                rules::evaluate(
                    black_box(&case.new),
                    black_box(Some(&case.old)),
                    black_box(&case.facts),
                    &opts,
                )
            })
        });
        g.bench_function("rules_violations", |b| {
            b.iter(|| rules::violations(black_box(&case.new)))
        });
        g.bench_function("decode_object", |b| {
            let json = serde_json::to_string(&case.new).expect("object json");
            b.iter(|| serde_json::from_str::<StorageVersion>(black_box(&json)))
        });
        bench_review(&mut g, &case);
        g.finish();
    }

    // The second body of bench/run: a review captured from kube-apiserver, its apiServerID
    // replaced by a fixture apiserver's (as `bench_driver review --real` does).
    let real = real_review();
    let synthetic = case("3-entries", 3).body;
    // The one-pass decode of each body alone.
    for (label, body) in [("3-entries", &synthetic), ("real-review", &real.body)] {
        let mut g = c.benchmark_group(label);
        assert_eq!(
            decode_review(body),
            Some(if label == "3-entries" { 3 } else { 1 })
        );
        g.bench_function("decode_review", |b| {
            b.iter(|| decode_review(black_box(body)))
        });
        g.finish();
    }
    let mut g = c.benchmark_group("real-review");
    bench_review(&mut g, &real);
    g.finish();

    bench_crd_guard(c);
}

/// The CRD guard (`/validate-crd`) on an UPDATE of a CRD with two versions, each with a schema of
/// 40 properties: `unchanged` keeps the storage version (what every update the guard is called
/// for without `matchConditions` costs), `storage_change` flips it (a warning is written).
fn bench_crd_guard(c: &mut Criterion) {
    use kube::runtime::reflector;
    use storageversion_webhook::admission::CrdGuard;
    use storageversion_webhook::crd::guard::GuardMode;

    let properties: serde_json::Map<String, serde_json::Value> = (0..40)
        .map(|i| {
            (
                format!("field{i}"),
                serde_json::json!({"type": "string", "description": "a field of the widget's spec, described at some length"}),
            )
        })
        .collect();
    let versions = |storage: &str| -> serde_json::Value {
        serde_json::json!(["v1beta1", "v1"].map(|v| serde_json::json!({
            "name": v, "served": true, "storage": v == storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": properties}}}}})))
    };
    let object = |storage: &str| {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com", "uid": "u", "generation": 2},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions(storage)},
            "status": {"storedVersions": ["v1beta1", "v1"]}})
    };
    let review = |new: &str| {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "b", "operation": "UPDATE", "name": "widgets.example.com",
                        "resource": {"group": "apiextensions.k8s.io", "version": "v1",
                                     "resource": "customresourcedefinitions"},
                        "object": object(new), "oldObject": object("v1")}}))
        .expect("review")
    };
    let mut registry = Registry::default();
    let guard = CrdGuard::new(
        reflector::store().0,
        GuardMode::Deny,
        Some(Duration::from_secs(120)),
        "svw/storageversion-webhook-crd".into(),
        Metrics::register(&mut registry),
    );
    let mut g = c.benchmark_group("crd-guard");
    for (label, body) in [
        ("unchanged", review("v1")),
        ("storage_change", review("v1beta1")),
    ] {
        g.bench_function(label, |b| {
            b.iter(|| {
                let out = guard.review(black_box(&body));
                assert!(out.is_ok());
                out
            })
        });
    }
    g.finish();
}

/// `admission_review`: the whole in-process review of `case`'s body.
fn bench_review(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    case: &Case,
) {
    g.bench_function("admission_review", |b| {
        b.iter(|| {
            let out = futures::executor::block_on(case.admission.review(black_box(&case.body)));
            assert!(out.is_ok());
            out
        })
    });
}

fn real_review() -> Case {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/fixtures/real-review.json"
    );
    let text = std::fs::read(path).expect("bench/fixtures/real-review.json");
    let mut case = case("real-review", 1);
    case.body = fixtures::real_review_body(&text).expect("fixture JSON");
    // The verdict must be "allowed": the benchmark measures the path of a real write.
    let out = futures::executor::block_on(case.admission.review(&case.body)).expect("answer");
    let out: serde_json::Value = serde_json::from_slice(&out).expect("answer JSON");
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert!(out["response"]["warnings"].is_null(), "{out}");
    case
}

criterion_group!(benches, bench);
criterion_main!(benches);

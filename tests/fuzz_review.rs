//! Fuzzing `Admission::review` with proptest (a stable-Rust stand-in for `cargo fuzz`, which
//! needs nightly): arbitrary bytes, arbitrary JSON, and real AdmissionReviews with arbitrary
//! JSON put in place of one of their parts. Whatever comes in, the review never panics, and
//! when it answers, the answer is a well-formed admission.k8s.io/v1 AdmissionReview carrying the
//! request's uid. The case counts bound the run time (about a second in a debug build).
//!
//! `check`'s input reader is fuzzed the same way by the unit tests in `src/check/fuzz.rs`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use proptest::prelude::*;
use serde_json::{json, Value};

use storageversion_webhook::admission::{Admission, Enforcement};
use storageversion_webhook::leases::StaticLeases;
use storageversion_webhook::metrics::Metrics;
use storageversion_webhook::model::LeaseRecord;

fn admission() -> Admission {
    let mut registry = Registry::default();
    let leases = StaticLeases::new([LeaseRecord::live_apiserver(apiserver())]);
    Admission::new(
        Arc::new(leases),
        Enforcement::Deny,
        Duration::from_secs(30),
        Metrics::register(&mut registry),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A real-looking AdmissionReview of a status UPDATE by the apiserver whose lease
/// [`admission`] knows.
fn review() -> Value {
    svw_testkit::fixtures::status_update_review(&[apiserver()])
}

/// The one apiserver with a live lease.
fn apiserver() -> String {
    svw_testkit::fixtures::apiserver_id(0)
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "apiserver-a",
            "apps/v1",
            "v1",
            "status",
            "UPDATE",
            "CREATE",
            "internal.apiserver.k8s.io",
            "storageversions",
            "",
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "apiVersion",
                    "kind",
                    "request",
                    "uid",
                    "object",
                    "oldObject",
                    "status",
                    "storageVersions",
                    "apiServerID",
                    "decodableVersions",
                    "x",
                ])
                .prop_map(str::to_string),
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every node of `v` (objects' values and arrays' items), as JSON pointers.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        _ => {}
    }
}

/// Reviews the body and checks the answer.
fn check(admission: &Admission, rt: &tokio::runtime::Runtime, body: &[u8]) {
    let answer = rt.block_on(admission.review(body));
    let Ok(json) = answer else {
        return; // answered with HTTP 400 and a message
    };
    let out: Value = serde_json::from_slice(&json).expect("the answer is JSON");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert!(out["response"]["allowed"].is_boolean(), "{out}");
    if let Ok(input) = serde_json::from_slice::<Value>(body) {
        if let Some(uid) = input["request"]["uid"].as_str() {
            assert_eq!(out["response"]["uid"], uid);
        }
    }
    assert!(json.len() < 256 * 1024, "the answer stays small");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, max_shrink_iters: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&admission(), &runtime(), &body);
    }

    #[test]
    fn arbitrary_json_documents(doc in arbitrary_json()) {
        check(&admission(), &runtime(), doc.to_string().as_bytes());
    }

    #[test]
    fn real_reviews_with_one_part_replaced(pick in any::<prop::sample::Index>(), part in arbitrary_json()) {
        let mut doc = review();
        let mut all = Vec::new();
        pointers(&doc, String::new(), &mut all);
        let at = pick.get(&all).clone();
        if let Some(slot) = doc.pointer_mut(&at) {
            *slot = part;
        }
        check(&admission(), &runtime(), doc.to_string().as_bytes());
    }

    #[test]
    fn real_reviews_cut_short(cut in any::<prop::sample::Index>()) {
        let body = review().to_string();
        let at = cut.index(body.len());
        check(&admission(), &runtime(), &body.as_bytes()[..at]);
    }
}

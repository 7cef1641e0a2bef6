//! Realistic StorageVersion objects and AdmissionReviews for the benchmarks, shaped like what
//! kube-apiserver v1.37 writes and sends: metadata with managedFields, one entry per apiserver,
//! the common encoding version and the `AllEncodingVersionsEqual` condition.

use serde_json::{json, Value};

/// A kube-apiserver identity: `apiserver-` and 26 base32 characters, derived from `seed`.
pub fn apiserver_id(seed: u64) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut id = String::from("apiserver-");
    for _ in 0..26 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        id.push(ALPHABET[(x % 32) as usize] as char);
    }
    id
}

/// The IDs of `n` apiservers.
pub fn apiserver_ids(n: usize) -> Vec<String> {
    (0..n as u64).map(apiserver_id).collect()
}

/// One entry as kube-apiserver writes it for `apps.deployments`.
pub fn entry(id: &str, with_served: bool) -> Value {
    let mut e = json!({
        "apiServerID": id,
        "encodingVersion": "apps/v1",
        "decodableVersions": ["apps/v1"],
    });
    if with_served {
        e["servedVersions"] = json!(["apps/v1"]);
    }
    e
}

/// The StorageVersion `apps.deployments` with one entry per id (the last one without
/// `servedVersions` when `last_without_served`), as stored at `resource_version`.
pub fn storage_version(ids: &[String], resource_version: u64, last_without_served: bool) -> Value {
    let entries: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| entry(id, !(last_without_served && i + 1 == ids.len())))
        .collect();
    json!({
        "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
        "kind": "StorageVersion",
        "metadata": {
            "name": "apps.deployments",
            "uid": "6f1c2f4e-2b1d-4c35-9a55-0d7c9c0e8a11",
            "resourceVersion": resource_version.to_string(),
            "generation": 1,
            "creationTimestamp": "2026-03-02T09:12:40Z",
            "managedFields": [
                {
                    "manager": "kube-apiserver",
                    "operation": "Update",
                    "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
                    "time": "2026-03-02T09:12:40Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {}}
                },
                {
                    "manager": "kube-apiserver",
                    "operation": "Update",
                    "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
                    "time": "2026-03-02T09:14:05Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {
                        "f:commonEncodingVersion": {},
                        "f:conditions": {
                            ".": {},
                            "k:{\"type\":\"AllEncodingVersionsEqual\"}": {
                                ".": {}, "f:lastTransitionTime": {}, "f:message": {},
                                "f:reason": {}, "f:status": {}, "f:type": {}
                            }
                        },
                        "f:storageVersions": {}
                    }},
                    "subresource": "status"
                }
            ]
        },
        "spec": {},
        "status": agreed_status(entries, "apps/v1", "2026-03-02T09:12:40Z")
    })
}

/// A status whose `entries` all encode `version`, with the common version and the
/// `AllEncodingVersionsEqual` condition kube-apiserver writes for it (transition at `since`).
pub fn agreed_status(entries: Vec<Value>, version: &str, since: &str) -> Value {
    json!({
        "storageVersions": entries,
        "commonEncodingVersion": version,
        "conditions": [{
            "type": "AllEncodingVersionsEqual",
            "status": "True",
            "lastTransitionTime": since,
            "reason": "CommonEncodingVersionSet",
            "message": "Common encoding version set"
        }]
    })
}

/// The `/status` UPDATE kube-apiserver sends when the last of `ids` (re)writes its entry of
/// `apps.deployments`: every entry in `object`, the last one without `servedVersions` in
/// `oldObject`.
pub fn status_update_review(ids: &[String]) -> Value {
    let old = storage_version(ids, 412, true);
    let new = storage_version(ids, 412, false);
    let writer = ids
        .last()
        .map(String::as_str)
        .unwrap_or("apiserver-unknown");
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "9b2c4d6e-8f0a-4b1c-9d3e-5f7a9b1c3d5e",
            "kind": {"group": "internal.apiserver.k8s.io", "version": "v1alpha1", "kind": "StorageVersion"},
            "resource": {"group": "internal.apiserver.k8s.io", "version": "v1alpha1", "resource": "storageversions"},
            "subResource": "status",
            "requestKind": {"group": "internal.apiserver.k8s.io", "version": "v1alpha1", "kind": "StorageVersion"},
            "requestResource": {"group": "internal.apiserver.k8s.io", "version": "v1alpha1", "resource": "storageversions"},
            "requestSubResource": "status",
            "name": "apps.deployments",
            "operation": "UPDATE",
            "userInfo": {
                "username": "system:apiserver",
                "uid": "2d7f3a1c-9b4e-4c6d-8a0f-1e3b5d7f9a2c",
                "groups": ["system:authenticated", "system:masters"],
                "extra": {"authentication.kubernetes.io/credential-id": [format!("X509SHA256={writer}")]}
            },
            "object": new,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}
        }
    })
}

/// A body of exactly `len` bytes (at least ~60) that is valid JSON but not an AdmissionReview:
/// the server reads and scans it, then answers 400 without judging anything.
pub fn not_a_review(len: usize) -> String {
    let head = r#"{"apiVersion":"v1","kind":"NotAReview","padding":""#;
    let tail = r#""}"#;
    let pad = len.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(pad))
}

/// A review captured from kube-apiserver (`bench/fixtures/real-review.json`), its entries'
/// apiServerIDs replaced by the first fixture apiserver's, compact as kube-apiserver sends it.
pub fn real_review_body(captured: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let mut review: Value = serde_json::from_slice(captured)?;
    let id = apiserver_id(0);
    for which in ["object", "oldObject"] {
        // pointer_mut, not indexing: `v["missing"]` on a mutable value inserts a null.
        let at = format!("/request/{which}/status/storageVersions");
        if let Some(entries) = review.pointer_mut(&at).and_then(|v| v.as_array_mut()) {
            for e in entries {
                e["apiServerID"] = Value::String(id.clone());
            }
        }
    }
    serde_json::to_vec(&review)
}

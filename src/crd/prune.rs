//! The prune: `status.storedVersions` set to `[storage version]` after a rewrite of ours
//! succeeded. The CRD is read again, the decision made again on that copy
//! ([`super::decide::pruned`]), and the write carries that copy's resourceVersion: a change in
//! between (a storage flip, another version joining, kube-controller-manager's own prune or its
//! condition) fails it with 409 instead of losing a version (I7).

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};

use super::decide::{self, Record};
use super::types::Crd;

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pruned {
    /// Written: storedVersions went from `from` to `to`.
    Pruned {
        from: Vec<String>,
        to: Vec<String>,
    },
    /// The copy read now does not allow it (changed, or up to date already).
    NotNeeded,
    /// The CRD changed between the read and the write (409), or went away (404).
    Conflict,
    Failed(String),
}

/// Prunes CRD `name` if `record` still allows it on the copy read now.
pub async fn prune(client: &kube::Client, name: &str, record: Option<&Record>) -> Pruned {
    let api: Api<Crd> = Api::all(client.clone());
    let fresh = match tokio::time::timeout(CALL_TIMEOUT, api.get_opt(name)).await {
        Ok(Ok(Some(c))) => c,
        Ok(Ok(None)) => return Pruned::NotNeeded,
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => return Pruned::NotNeeded,
        Ok(Err(e)) => return Pruned::Failed(format!("cannot read the CRD: {e}")),
        Err(_) => return Pruned::Failed("reading the CRD timed out".to_string()),
    };
    let snap = fresh.snapshot();
    let Some(to) = decide::pruned(&snap, record) else {
        return Pruned::NotNeeded;
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": snap.resource_version},
        "status": {"storedVersions": to},
    });
    let result = tokio::time::timeout(
        CALL_TIMEOUT,
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    match result {
        Ok(Ok(_)) => Pruned::Pruned {
            from: snap.stored,
            to,
        },
        Ok(Err(kube::Error::Api(s))) if s.code == 409 || s.code == 404 => Pruned::Conflict,
        Ok(Err(e)) => Pruned::Failed(e.to_string()),
        Err(_) => Pruned::Failed("the status patch timed out".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::decide::{Method, Phase};
    use http::{Request, Response};
    use kube::client::Body;

    const PATH: &str =
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";

    fn crd(rv: &str, generation: i64, stored: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com", "uid": "u1", "generation": generation,
                         "resourceVersion": rv},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1beta1", "served": true, "storage": false},
                                  {"name": "v1", "served": true, "storage": true}]},
            "status": {"storedVersions": stored,
                       "conditions": [{"type": "Established", "status": "True"}]},
        })
    }

    fn succeeded() -> Record {
        let began: Crd = serde_json::from_value(crd("5", 2, &["v1beta1", "v1"])).expect("crd");
        let mut r = Record::begin(&began.snapshot(), "m-1", 1, Method::Rewrite).expect("storage");
        if let Some(m) = r.migration.as_mut() {
            m.phase = Phase::Succeeded;
        }
        r
    }

    fn reply(code: u16, v: &serde_json::Value) -> Response<Body> {
        let mut r = Response::new(Body::from(serde_json::to_vec(v).unwrap_or_default()));
        *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }

    /// Runs `prune` against a mock that answers the GET with `got` and the PATCH with
    /// `patched`; returns the outcome and the PATCH body sent (if any).
    async fn run(
        got: (u16, serde_json::Value),
        patched: u16,
    ) -> (Pruned, Option<serde_json::Value>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let server = tokio::spawn(async move {
            let mut sent = None;
            while let Some((req, send)) = handle.next_request().await {
                let method = req.method().clone();
                let path = req.uri().path().to_string();
                let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
                if method == http::Method::GET && path == PATH {
                    send.send_response(reply(got.0, &got.1));
                } else if method == http::Method::PATCH && path == format!("{PATH}/status") {
                    sent = serde_json::from_slice(&bytes).ok();
                    send.send_response(reply(
                        patched,
                        &serde_json::json!({"kind": "Status", "code": patched}),
                    ));
                } else {
                    send.send_response(reply(
                        500,
                        &serde_json::json!({"kind": "Status", "code": 500}),
                    ));
                }
            }
            sent
        });
        let record = succeeded();
        let out = prune(&client, "widgets.example.com", Some(&record)).await;
        drop(client);
        (out, server.await.unwrap_or_default())
    }

    #[tokio::test]
    async fn the_write_carries_the_resource_version_it_was_decided_on() {
        let (out, sent) = run((200, crd("7", 2, &["v1beta1", "v1"])), 200).await;
        assert_eq!(
            out,
            Pruned::Pruned {
                from: vec!["v1beta1".into(), "v1".into()],
                to: vec!["v1".into()]
            }
        );
        assert_eq!(
            sent,
            Some(serde_json::json!({"metadata": {"resourceVersion": "7"},
                                    "status": {"storedVersions": ["v1"]}}))
        );
    }

    #[tokio::test]
    async fn a_change_between_read_and_write_fails_the_write_and_loses_nothing() {
        let (out, sent) = run((200, crd("7", 2, &["v1beta1", "v1"])), 409).await;
        assert_eq!(out, Pruned::Conflict);
        assert!(sent.is_some());
    }

    #[tokio::test]
    async fn a_copy_that_changed_since_the_migration_began_is_not_written() {
        // A new generation, a version that joined, already pruned, gone: no PATCH at all.
        for got in [
            (200, crd("8", 3, &["v1beta1", "v1"])),
            (200, crd("8", 2, &["v1alpha1", "v1beta1", "v1"])),
            (200, crd("8", 2, &["v1"])),
            (
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": "NotFound", "code": 404}),
            ),
        ] {
            let (out, sent) = run(got.clone(), 200).await;
            assert_eq!((out, sent), (Pruned::NotNeeded, None), "{got:?}");
        }
    }
}

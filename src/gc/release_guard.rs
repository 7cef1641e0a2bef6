//! The leader election's client: kube-lease-manager's release of the leader Lease made safe.
//!
//! kube-lease-manager clears a Lease it judged expired with a patch that carries no
//! precondition, and it judges from its cached copy: a follower whose copy is old clears a Lease
//! that the holder has just renewed. The holder then leads on, unaware, with a Lease that names
//! no one, until its own watch shows it (the simulation found this: seed 127, a ConfigMap patch
//! and an Event applied while the Lease named no one).
//!
//! This layer sits under the election's client only. It keeps the last copy of the leader Lease
//! the election read or wrote and sends every patch (claim, renewal, release) with that copy's
//! resourceVersion: a write decided on an old copy, or held up in flight while another replica
//! claimed the Lease, fails with 409 instead of overwriting. A patch that clears the holder goes
//! through only when that
//! copy (read just before: the crate re-reads the Lease before it releases) names this replica,
//! no one, or a claim that has run out; it is then sent with that copy's resourceVersion, so a
//! renewal in between makes it fail with 409 instead of clearing a live claim. Otherwise the
//! layer answers 409 Conflict itself, which the crate takes as "someone else moved first" and
//! backs off from. Invariant: **no replica clears a leader Lease whose claim is live and not its
//! own.**

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::client::Body;

/// The leader Lease's last copy as the election saw it.
#[derive(Clone, Debug, Default)]
struct Seen {
    resource_version: Option<String>,
    holder: Option<String>,
    expiry: Option<Timestamp>,
}

/// `client` with the release guard in front, for the Lease `namespace/name` held as `identity`.
pub fn client(client: kube::Client, namespace: &str, name: &str, identity: &str) -> kube::Client {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}");
    let identity = identity.to_string();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let default_ns = client.default_namespace().to_string();
    let service = tower::service_fn(move |req: Request<Body>| {
        let client = client.clone();
        let path = path.clone();
        let identity = identity.clone();
        let seen = Arc::clone(&seen);
        async move {
            if req.uri().path() != path {
                return client.send(req).await;
            }
            let req = if req.method() == Method::PATCH {
                let (parts, body) = req.into_parts();
                let bytes = body.collect().await?.to_bytes();
                match guard(&bytes, &last(&seen), &identity, Timestamp::now()) {
                    Verdict::Send(bytes) => Request::from_parts(parts, Body::from(bytes)),
                    Verdict::Refuse(why) => {
                        tracing::info!(reason = why, "not releasing the GC leader Lease");
                        return Ok(conflict(why));
                    }
                }
            } else {
                req
            };
            let resp = client.send(req).await?;
            if !resp.status().is_success() {
                return Ok(resp);
            }
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            if let Ok(lease) = serde_json::from_slice::<Lease>(&bytes) {
                *lock(&seen) = seen_of(&lease);
            }
            Ok(Response::from_parts(parts, Body::from(bytes)))
        }
    });
    kube::Client::new(service, default_ns)
}

fn lock(m: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn last(seen: &Mutex<Seen>) -> Seen {
    lock(seen).clone()
}

fn seen_of(lease: &Lease) -> Seen {
    let spec = lease.spec.as_ref();
    let renew = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
    let secs = spec.and_then(|s| s.lease_duration_seconds);
    Seen {
        resource_version: lease.metadata.resource_version.clone(),
        holder: spec.and_then(|s| s.holder_identity.clone()),
        expiry: renew
            .zip(secs)
            .and_then(|(r, s)| r.checked_add(SignedDuration::from_secs(s.into())).ok()),
    }
}

#[derive(Debug, PartialEq)]
enum Verdict {
    Send(Vec<u8>),
    Refuse(&'static str),
}

/// What to do with a patch of the leader Lease: every patch is sent with the resourceVersion of
/// the copy it was decided on (a claim or a renewal that was held up in flight fails with 409
/// instead of overwriting a claim made since: simulation seed 455, an acquire applied 15 s late
/// over another replica's fresh claim); a release goes only on a copy that allows it.
fn guard(body: &[u8], seen: &Seen, identity: &str, now: Timestamp) -> Verdict {
    let Ok(mut patch) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Verdict::Send(body.to_vec());
    };
    let Some(spec) = patch.pointer("/spec").and_then(|s| s.as_object()) else {
        return Verdict::Send(body.to_vec());
    };
    let releases = spec.get("holderIdentity").is_some_and(|h| h.is_null());
    if releases {
        let theirs = seen.holder.as_deref().is_some_and(|h| h != identity);
        let live = seen.expiry.is_some_and(|e| e > now);
        if theirs && live {
            return Verdict::Refuse("the Lease is held by another replica whose claim is live");
        }
    }
    let Some(rv) = seen.resource_version.clone() else {
        if releases {
            return Verdict::Refuse("the Lease has not been read");
        }
        return Verdict::Send(body.to_vec());
    };
    if let Some(obj) = patch.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("resourceVersion".to_string(), serde_json::Value::String(rv));
        }
    }
    match serde_json::to_vec(&patch) {
        Ok(bytes) => Verdict::Send(bytes),
        Err(_) => Verdict::Refuse("the patch could not be written"),
    }
}

fn conflict(message: &str) -> Response<Body> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Conflict",
        "code": 409,
    });
    let mut resp = Response::new(Body::from(status.to_string().into_bytes()));
    *resp.status_mut() = StatusCode::CONFLICT;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELEASE: &str = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","spec":{"acquireTime":null,"renewTime":null,"holderIdentity":null,"leaseDurationSeconds":null}}"#;
    const RENEW: &str =
        r#"{"spec":{"renewTime":"2026-01-01T00:00:10Z","leaseDurationSeconds":15}}"#;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn seen(holder: Option<&str>, expiry: &str) -> Seen {
        Seen {
            resource_version: Some("7".to_string()),
            holder: holder.map(str::to_string),
            expiry: Some(at(expiry)),
        }
    }

    #[test]
    fn a_live_claim_of_another_is_never_cleared() {
        let s = seen(Some("svw-0"), "2026-01-01T00:00:25Z");
        assert!(matches!(
            guard(RELEASE.as_bytes(), &s, "svw-1", at("2026-01-01T00:00:20Z")),
            Verdict::Refuse(_)
        ));
    }

    #[test]
    fn an_expired_or_own_claim_is_released_on_the_copy_read() {
        for (holder, now) in [
            (Some("svw-0"), "2026-01-01T00:00:30Z"),
            (Some("svw-1"), "2026-01-01T00:00:20Z"),
            (None, "2026-01-01T00:00:20Z"),
        ] {
            let s = seen(holder, "2026-01-01T00:00:25Z");
            let Verdict::Send(body) = guard(RELEASE.as_bytes(), &s, "svw-1", at(now)) else {
                panic!("{holder:?} at {now}: refused");
            };
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            assert_eq!(v.pointer("/metadata/resourceVersion"), Some(&"7".into()));
            assert_eq!(
                v.pointer("/spec/holderIdentity"),
                Some(&serde_json::Value::Null)
            );
        }
    }

    #[test]
    fn renewals_and_claims_carry_the_copy_they_were_decided_on() {
        let s = seen(Some("svw-0"), "2026-01-01T00:00:25Z");
        let Verdict::Send(body) = guard(RENEW.as_bytes(), &s, "svw-1", at("2026-01-01T00:00:20Z"))
        else {
            panic!("a renewal was refused");
        };
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(v.pointer("/metadata/resourceVersion"), Some(&"7".into()));
        assert_eq!(v.pointer("/spec/leaseDurationSeconds"), Some(&15.into()));
        // Before any read, and for what is not a Lease patch, nothing is added.
        assert_eq!(
            guard(
                RENEW.as_bytes(),
                &Seen::default(),
                "svw-1",
                Timestamp::now()
            ),
            Verdict::Send(RENEW.as_bytes().to_vec())
        );
        assert_eq!(
            guard(b"not json", &s, "svw-1", at("2026-01-01T00:00:20Z")),
            Verdict::Send(b"not json".to_vec())
        );
    }

    #[test]
    fn nothing_is_released_before_the_lease_was_read() {
        assert!(matches!(
            guard(
                RELEASE.as_bytes(),
                &Seen::default(),
                "svw-1",
                Timestamp::now()
            ),
            Verdict::Refuse(_)
        ));
    }
}

//! Our own migration of a CRD's objects, where no StorageVersionMigration API is served (or
//! `--crd-migrate-method=rewrite`): list the objects a page at a time and write each back
//! unchanged. kube-apiserver encodes every write in the current storage version, so an object
//! stored in another version has different bytes and is written; one already in it is a no-op.
//!
//! - A 404 on an object: deleted since the list; nothing of it is stored any more.
//! - A 409: changed since the list; that write was encoded in the storage version already (the
//!   CRD held still for the settle time before we began, so every apiserver had it).
//! - Any other error is retried a few times, then the migration fails (nothing is pruned).
//! - A 404 on the list: the CRD is gone; the migration ends, nothing is pruned.
//! - A 410 on a page (the continue token expired): the list starts again from the beginning;
//!   writing an object twice is harmless.
//!
//! Costs: one page (at most [`PAGE`] objects) in memory; one LIST per page and one PUT per object,
//! paced by `--crd-migrate-rate` over all rewrites of the process ([`Pace`]). Every request
//! stops when `stop` is cancelled (the term ended, or the CRD changed): none is sent after.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::CrdMetrics;
use super::types::Target;

/// Objects per LIST page.
pub const PAGE: u32 = 500;
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries of one object before the migration fails.
const TRIES: u32 = 4;
/// Starts of the list from the beginning (after a 410) before the migration fails.
const RESTARTS: u32 = 3;

/// How many objects ended how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub rewritten: u64,
    pub gone: u64,
    pub conflicts: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The CRD's resource is not served any more (deleted).
    Gone,
    /// Stopped from outside.
    Stopped,
    Error(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Gone => write!(f, "the resource is not served any more"),
            Failure::Stopped => write!(f, "stopped"),
            Failure::Error(e) => write!(f, "{e}"),
        }
    }
}

/// One write every `1/rate` seconds, shared by every rewrite of the process.
#[derive(Clone)]
pub struct Pace {
    next: Arc<Mutex<Instant>>,
    every: Duration,
}

impl Pace {
    pub fn new(rate: f64) -> Pace {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        };
        Pace {
            next: Arc::new(Mutex::new(Instant::now())),
            every: Duration::from_secs_f64(1.0 / rate),
        }
    }

    /// Waits for this caller's slot.
    pub async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let at = (*next).max(now);
            *next = at + self.every;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

/// What one object's write came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Rewritten,
    Gone,
    Conflict,
}

/// Sorts a write's answer: the outcome, or the error text to retry on.
pub fn judge(result: &Result<DynamicObject, kube::Error>) -> Result<Written, String> {
    match result {
        Ok(_) => Ok(Written::Rewritten),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Written::Gone),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
        Err(e) => Err(e.to_string()),
    }
}

async fn within<T>(
    stop: &CancellationToken,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, Failure> {
    tokio::select! {
        biased;
        () = stop.cancelled() => Err(Failure::Stopped),
        r = tokio::time::timeout(CALL_TIMEOUT, f) => {
            r.map_err(|_| Failure::Error(format!("a request timed out after {CALL_TIMEOUT:?}")))
        }
    }
}

/// Rewrites every object of `target`.
pub async fn rewrite(
    client: kube::Client,
    target: Target,
    pace: Pace,
    metrics: CrdMetrics,
    stop: CancellationToken,
) -> Result<Counts, Failure> {
    let ar = target.api_resource();
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut counts = Counts::default();
    let mut restarts = 0;
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = match within(&stop, all.list(&lp)).await? {
            Ok(page) => page,
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(Failure::Gone),
            Err(kube::Error::Api(s)) if s.code == 410 && restarts < RESTARTS => {
                restarts += 1;
                token = None;
                continue;
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                metrics.error("list_objects");
                return Err(Failure::Error(format!(
                    "not allowed to list {}.{}: grant get, list and update of them (the chart's \
                     crdMigrate.resourceRules), or let kube-controller-manager's migrator do it \
                     where StorageVersionMigrations are served: {}",
                    ar.plural, ar.group, s.message
                )));
            }
            Err(e) => {
                metrics.error("list_objects");
                return Err(Failure::Error(format!("cannot list {}: {e}", ar.plural)));
            }
        };
        for obj in &page.items {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let api: Api<DynamicObject> = match (&obj.metadata.namespace, target.namespaced) {
                (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &ar),
                _ => Api::all_with(client.clone(), &ar),
            };
            let mut tries = 0;
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return Err(Failure::Stopped),
                    () = pace.wait() => {}
                }
                let written =
                    within(&stop, api.replace(&name, &PostParams::default(), obj)).await?;
                match judge(&written) {
                    Ok(Written::Rewritten) => {
                        counts.rewritten += 1;
                        metrics.object("rewritten");
                    }
                    Ok(Written::Gone) => {
                        counts.gone += 1;
                        metrics.object("gone");
                    }
                    Ok(Written::Conflict) => {
                        counts.conflicts += 1;
                        metrics.object("conflict");
                    }
                    Err(e) => {
                        tries += 1;
                        metrics.object("failed");
                        if tries < TRIES {
                            let backoff = Duration::from_millis(500 << tries);
                            tokio::select! {
                                () = stop.cancelled() => return Err(Failure::Stopped),
                                () = tokio::time::sleep(backoff) => {}
                            }
                            continue;
                        }
                        let at = match &obj.metadata.namespace {
                            Some(ns) => format!("{ns}/{name}"),
                            None => name.clone(),
                        };
                        return Err(Failure::Error(format!(
                            "cannot rewrite {} {at} ({TRIES} tries): {e}",
                            ar.kind
                        )));
                    }
                }
                break;
            }
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok(counts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn gone_and_conflict_end_an_object_other_errors_are_retried() {
        assert_eq!(
            judge(&Ok(DynamicObject::new(
                "a",
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
            ))),
            Ok(Written::Rewritten)
        );
        assert_eq!(judge(&Err(api_error(404))), Ok(Written::Gone));
        assert_eq!(judge(&Err(api_error(409))), Ok(Written::Conflict));
        assert!(judge(&Err(api_error(422))).is_err());
        assert!(judge(&Err(api_error(500))).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_pace_spaces_writes_by_the_rate_over_all_callers() {
        let pace = Pace::new(10.0);
        let t0 = Instant::now();
        let (a, b) = (pace.clone(), pace.clone());
        let both = tokio::join!(
            async move {
                for _ in 0..5 {
                    a.wait().await;
                }
            },
            async move {
                for _ in 0..5 {
                    b.wait().await;
                }
            }
        );
        let () = both.0;
        // Ten slots at 100 ms: the first at once, the last 900 ms later.
        assert_eq!(Instant::now() - t0, Duration::from_millis(900));
    }
}

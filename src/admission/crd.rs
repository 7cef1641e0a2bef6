//! `POST /validate-crd`: AdmissionReviews of CustomResourceDefinition UPDATEs, judged by the CRD
//! guard (`crd::guard::judge`) against our record of the CRD's last migration, which every
//! replica reads from a watch of the CRD migrator's state ConfigMap.
//!
//! The webhook entry's `matchConditions` keep kube-apiserver from calling for an update that
//! leaves the versions (name, served, storage) unchanged, and its `failurePolicy` is `Ignore`:
//! this is never in the way of a CRD write. What it cannot read, it allows: no denial without
//! the record as evidence.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::Store;
use serde_json::value::RawValue;

use super::{
    log_field, parse_review, AdmissionResponse, AdmissionReviewOut, BadReview, ResponseStatus,
    ADMISSION_API_VERSION, ADMISSION_KIND,
};
use crate::crd::decide::Record;
use crate::crd::guard::{self, Context, GuardMode, Verdict};
use crate::crd::types::{self, Crd};
use crate::metrics::{Metrics, ResultLabels};

/// The CRD guard of one replica.
pub struct CrdGuard {
    /// The state ConfigMap (one object at most, from a watch by name).
    records: Store<ConfigMap>,
    mode: GuardMode,
    /// The migrator's settle time when `--crd-migrate` is on.
    migrator: Option<Duration>,
    /// `namespace/name` of the state ConfigMap.
    state: String,
    metrics: Metrics,
}

impl CrdGuard {
    pub fn new(
        records: Store<ConfigMap>,
        mode: GuardMode,
        migrator: Option<Duration>,
        state: String,
        metrics: Metrics,
    ) -> Self {
        CrdGuard {
            records,
            mode,
            migrator,
            state,
            metrics,
        }
    }

    /// Our record of CRD `name`, if the state ConfigMap has a readable one.
    fn record(&self, name: &str) -> Option<Record> {
        let maps = self.records.state();
        let value = maps.first()?.data.as_ref()?.get(name)?;
        crate::crd::state::parse(value)
    }

    /// Answers one review; `Err` for a body that is not an AdmissionReview (HTTP 400).
    pub fn review(&self, body: &[u8]) -> Result<Vec<u8>, BadReview> {
        let req = parse_review(body)?.into_request()?;
        let subresource = req.sub_resource.as_deref().unwrap_or("");
        let ours = req.resource.group == types::GROUP
            && req.resource.resource == types::PLURAL
            && subresource.is_empty()
            && req.operation == "UPDATE";
        let (result, verdict) = if !ours {
            ("ignored", Verdict::default())
        } else {
            match (decode(req.object), decode(req.old_object)) {
                (Some(new), Some(old)) => {
                    let record = self.record(old.name());
                    let cx = Context {
                        record: record.as_ref(),
                        migrator: self.migrator,
                        mode: self.mode,
                        state: &self.state,
                    };
                    let v = guard::judge(&old, &new, &cx);
                    let result = match (v.code, v.denied.is_some()) {
                        ("storage_change_during_migration", true) => "denied",
                        ("storage_change_during_migration", false) => "warned_during_migration",
                        ("storage_change", _) => "storage_change",
                        _ => "unchanged",
                    };
                    (result, v)
                }
                _ => ("unreadable", Verdict::default()),
            }
        };
        self.metrics
            .crd_guard_reviews
            .get_or_create(&ResultLabels { result })
            .inc();
        tracing::info!(
            uid = log_field(&req.uid),
            name = log_field(req.name.as_deref().unwrap_or("")),
            operation = log_field(&req.operation),
            result,
            "CRD review"
        );
        let out = AdmissionReviewOut {
            api_version: ADMISSION_API_VERSION,
            kind: ADMISSION_KIND,
            response: AdmissionResponse {
                uid: req.uid.as_ref(),
                allowed: verdict.denied.is_none(),
                status: verdict.denied.map(|message| ResponseStatus {
                    status: "Failure",
                    code: 403,
                    reason: "Forbidden",
                    message,
                }),
                warnings: verdict.warnings,
                audit_annotations: Default::default(),
            },
        };
        serde_json::to_vec(&out).map_err(|e| BadReview::NotAdmissionReview(e.to_string()))
    }
}

/// A CRD from the review, or None (then nothing is judged).
fn decode(raw: Option<&RawValue>) -> Option<Crd> {
    serde_json::from_str(raw?.get()).ok()
}

//! AdmissionReview in, AdmissionReview out: decodes the request straight into typed structs,
//! looks up the leases the rules need, runs the rules and turns their findings into a response.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::leases::{LeaseView, Requester};
use crate::metrics::{
    operation_label, requester_label, subresource_label, FindingLabels, Metrics, ResultLabels,
    ReviewLabels,
};
use crate::model::{
    LeaseLookup, StorageVersion, StorageVersionSpec, StorageVersionStatus, GROUP, PLURAL,
};
use crate::rules::{self, Evaluation, Finding, LeaseFacts, RuleOptions, Severity};

pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
pub const ADMISSION_KIND: &str = "AdmissionReview";

/// Default for [`ReviewLimits::max_lease_lookups`].
pub const DEFAULT_MAX_LEASE_LOOKUPS: usize = 16;
/// Default for [`ReviewLimits::max_findings`].
pub const DEFAULT_MAX_FINDINGS: usize = 32;
/// Longest request-derived string written to a log line, in bytes (longer ones are cut).
pub const MAX_LOGGED_FIELD_BYTES: usize = 128;

/// What one review may cost, whatever the body says. A real StorageVersion has one entry per
/// kube-apiserver and a handful of versions, so no real write comes near these limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewLimits {
    /// Distinct apiServerIDs whose identity lease is looked up in one review (from the cache or,
    /// on a miss, live). The IDs past this many get `lease-lookup-failed`, which only warns.
    pub max_lease_lookups: usize,
    /// Findings listed in the response's warnings, denial message and audit annotation; the rest
    /// are summarised as "and N more". Every finding still counts for the verdict.
    pub max_findings: usize,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        ReviewLimits {
            max_lease_lookups: DEFAULT_MAX_LEASE_LOOKUPS,
            max_findings: DEFAULT_MAX_FINDINGS,
        }
    }
}

/// `s` cut to at most [`MAX_LOGGED_FIELD_BYTES`] (on a character boundary), for log lines.
pub fn log_field(s: &str) -> &str {
    if s.len() <= MAX_LOGGED_FIELD_BYTES {
        return s;
    }
    let mut end = MAX_LOGGED_FIELD_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What a violation does to a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Violations deny the write.
    Deny,
    /// Violations become warnings; the write is allowed.
    Warn,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Deny => "deny",
            Enforcement::Warn => "warn",
        }
    }
}

/// The AdmissionReview as read. `O` is how `object` is held: decoded straight into a
/// [`ReviewedObject`] (the fast path, one pass over the body), or as raw JSON that is decoded
/// afterwards (when the fast path fails, so that every error says what it always said).
/// `oldObject` is always kept as raw JSON: it is decoded only when the new object has findings
/// (its one use is ratcheting them), so a clean write never pays for it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReviewIn<'a, O> {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(borrow, default = "none")]
    request: Option<AdmissionRequest<'a, O>>,
}

impl<'a, O> AdmissionReviewIn<'a, O> {
    /// The request of an `admission.k8s.io/v1` AdmissionReview; anything else is a bad review.
    fn into_request(self) -> Result<AdmissionRequest<'a, O>, BadReview> {
        if self.api_version.as_deref() != Some(ADMISSION_API_VERSION)
            || self.kind.as_deref() != Some(ADMISSION_KIND)
        {
            return Err(BadReview::NotAdmissionReview(format!(
                "apiVersion {:?} and kind {:?}, want {ADMISSION_API_VERSION:?} and {ADMISSION_KIND:?}",
                self.api_version.as_deref().unwrap_or(""),
                self.kind.as_deref().unwrap_or("")
            )));
        }
        self.request
            .ok_or_else(|| BadReview::NotAdmissionReview("it has no request".to_string()))
    }
}

/// The review with its objects kept as raw JSON; what is not JSON, or not a review, is a bad
/// review.
fn parse_review(body: &[u8]) -> Result<AdmissionReviewIn<'_, &RawValue>, BadReview> {
    serde_json::from_slice(body).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            BadReview::NotJson(e.to_string())
        } else {
            BadReview::NotAdmissionReview(e.to_string())
        }
    })
}

fn none<T>() -> Option<T> {
    None
}

#[derive(Deserialize, Default, Debug)]
struct GroupResource<'a> {
    #[serde(borrow, default)]
    group: Cow<'a, str>,
    #[serde(borrow, default)]
    resource: Cow<'a, str>,
}

#[derive(Deserialize, Default, Debug)]
struct UserInfo<'a> {
    #[serde(borrow, default)]
    username: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionRequest<'a, O> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    #[serde(borrow, default)]
    resource: GroupResource<'a>,
    #[serde(borrow, default)]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    operation: Cow<'a, str>,
    #[serde(borrow, default)]
    user_info: UserInfo<'a>,
    #[serde(default = "none")]
    object: Option<O>,
    #[serde(borrow, default = "none")]
    old_object: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: AdmissionResponse<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    audit_annotations: BTreeMap<&'static str, String>,
}

#[derive(Serialize)]
struct ResponseStatus {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: String,
}

/// A request body that is not an AdmissionReview at all: answered with HTTP 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadReview {
    #[error("request body is not valid JSON: {0}")]
    NotJson(String),
    #[error("request body is not an admission.k8s.io/v1 AdmissionReview: {0}")]
    NotAdmissionReview(String),
}

/// The admission logic shared by every replica.
pub struct Admission {
    leases: Arc<dyn LeaseView>,
    enforcement: Enforcement,
    lease_skew_allowance: Duration,
    metrics: Metrics,
    limits: ReviewLimits,
}

/// Lookup failures logged one by one per review; the rest are only counted.
const LOGGED_LOOKUP_FAILURES: usize = 3;

/// What one review decided, for the log line and metrics.
struct Outcome<'a> {
    verdict: &'static str,
    allowed: bool,
    status: Option<ResponseStatus>,
    warnings: Vec<String>,
    audit: BTreeMap<&'static str, String>,
    codes: Vec<&'static str>,
    findings: &'a [Finding],
}

impl Admission {
    pub fn new(
        leases: Arc<dyn LeaseView>,
        enforcement: Enforcement,
        lease_skew_allowance: Duration,
        metrics: Metrics,
    ) -> Self {
        Admission {
            leases,
            enforcement,
            lease_skew_allowance,
            metrics,
            limits: ReviewLimits::default(),
        }
    }

    /// The same, with other limits on what one review may cost.
    pub fn with_limits(mut self, limits: ReviewLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> ReviewLimits {
        self.limits
    }

    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }

    /// Answers one AdmissionReview body with the JSON of the response AdmissionReview.
    pub async fn review(&self, body: &[u8]) -> Result<Vec<u8>, BadReview> {
        let started = Instant::now();
        let result = self.review_inner(body).await;
        self.metrics
            .review_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            let result = match e {
                BadReview::NotJson(_) => "not_json",
                BadReview::NotAdmissionReview(_) => "not_admission_review",
            };
            self.metrics
                .http_errors
                .get_or_create(&ResultLabels { result })
                .inc();
        }
        result
    }

    async fn review_inner(&self, body: &[u8]) -> Result<Vec<u8>, BadReview> {
        // Fast path: the objects decoded in the same pass as the review. Anything it cannot read
        // goes the two-pass way, which finds and reports the problem exactly as before.
        // (sonic-rs was tried for this pass and measured slower than serde_json on both benchmark
        // bodies: BENCHMARKS.md, section 2 of the 2026-12-01 run.)
        if let Some(review) = decode_fast(body) {
            return self.answer(review).await;
        }
        self.answer(parse_review(body)?).await
    }

    async fn answer<O: ReviewObject>(
        &self,
        review: AdmissionReviewIn<'_, O>,
    ) -> Result<Vec<u8>, BadReview> {
        let mut req = review.into_request()?;

        let subresource = req.sub_resource.as_deref().unwrap_or("");
        let ours = req.resource.group == GROUP
            && req.resource.resource == PLURAL
            && (subresource.is_empty() || subresource == "status");
        let judged = ours && (req.operation == "CREATE" || req.operation == "UPDATE");

        let mut no_findings: [Finding; 0] = [];
        let evaluation;
        let outcome = if !judged {
            if !ours {
                tracing::info!(
                    uid = log_field(&req.uid),
                    group = log_field(&req.resource.group),
                    resource = log_field(&req.resource.resource),
                    subresource = log_field(subresource),
                    operation = log_field(&req.operation),
                    "allowing a review for a resource this webhook does not judge; check the webhook's rules"
                );
            }
            Outcome::allowed("ignored", &mut no_findings)
        } else {
            let judged = match decode_object(req.object.take()) {
                Ok(new) => self
                    .judge(
                        &new,
                        req.old_object.take(),
                        &req.operation,
                        Requester::from_username(&req.user_info.username),
                    )
                    .await
                    .map(|evaluation| (new, evaluation)),
                Err(message) => Err(message),
            };
            match judged {
                Err(message) => Outcome {
                    verdict: "error",
                    allowed: false,
                    status: Some(ResponseStatus {
                        status: "Failure",
                        code: 400,
                        reason: "BadRequest",
                        message,
                    }),
                    warnings: Vec::new(),
                    audit: BTreeMap::new(),
                    codes: Vec::new(),
                    findings: &[],
                },
                Ok((new, judged)) => {
                    evaluation = judged;
                    self.outcome(&new, &evaluation)
                }
            }
        };

        self.record(&req, subresource, &outcome);
        let out = AdmissionReviewOut {
            api_version: ADMISSION_API_VERSION,
            kind: ADMISSION_KIND,
            response: AdmissionResponse {
                uid: req.uid.as_ref(),
                allowed: outcome.allowed,
                status: outcome.status,
                warnings: outcome.warnings,
                audit_annotations: outcome.audit,
            },
        };
        // Serialising plain structs of strings cannot fail; map the impossible error anyway.
        serde_json::to_vec(&out).map_err(|e| BadReview::NotAdmissionReview(e.to_string()))
    }

    /// Looks up the leases the rules need and runs them on `new`. The old object (UPDATE only)
    /// is decoded only if `new` has findings: ratcheting is its one use, and it can only soften
    /// a finding, never add one, so a write without findings is judged the same without it. An
    /// unreadable old object is an error only then.
    async fn judge(
        &self,
        new: &StorageVersion,
        old: Option<&RawValue>,
        operation: &str,
        who: Requester,
    ) -> Result<Evaluation, String> {
        let facts = self.lease_facts(new, who).await;
        let opts = RuleOptions {
            now: Timestamp::now(),
            lease_skew_allowance: self.lease_skew_allowance,
        };
        let evaluation = rules::evaluate(new, None, &facts, &opts);
        match old {
            Some(old) if operation == "UPDATE" && !evaluation.findings.is_empty() => {
                let old = old.into_storage_version("oldObject")?;
                Ok(rules::evaluate(new, Some(&old), &facts, &opts))
            }
            _ => Ok(evaluation),
        }
    }

    /// Looks up the leases the rules need. At most [`ReviewLimits::max_lease_lookups`] leases
    /// are looked up; the other IDs are `lease-lookup-failed` (a warning, never a denial).
    async fn lease_facts(&self, new: &StorageVersion, who: Requester) -> LeaseFacts {
        let ids = rules::lease_ids(new, None);
        let cap = self.limits.max_lease_lookups.min(ids.len());
        let (looked_up, skipped) = ids.split_at(cap);
        let lookups = self.lookup_all(looked_up, who).await;
        let mut facts = LeaseFacts::new();
        let mut failed = 0usize;
        for (id, lookup) in looked_up.iter().zip(lookups) {
            if let LeaseLookup::Failed(err) = &lookup {
                failed += 1;
                if failed <= LOGGED_LOOKUP_FAILURES {
                    tracing::warn!(
                        api_server_id = log_field(id),
                        error = log_field(err),
                        "identity lease lookup failed; not denying on it"
                    );
                }
            }
            facts.insert((*id).to_string(), lookup);
        }
        if !skipped.is_empty() {
            tracing::warn!(
                looked_up = looked_up.len(),
                not_looked_up = skipped.len(),
                "a review names more apiServerIDs than leases are looked up per review; the rest get lease-lookup-failed (a warning)"
            );
            let why = format!(
                "not looked up: the object names more than {cap} distinct apiServerIDs, the most this webhook looks up per review"
            );
            for id in skipped {
                facts.insert((*id).to_string(), LeaseLookup::Failed(why.clone()));
            }
        }
        facts
    }

    /// Looks up every lease at once. Lookups answered from the lease view's cache are ready on
    /// their first poll and are taken as they are; only the others (live GETs) are awaited,
    /// concurrently.
    async fn lookup_all(&self, ids: &[&str], who: Requester) -> Vec<LeaseLookup> {
        use futures::FutureExt;
        let mut pending = Vec::new();
        let mut done: Vec<Option<LeaseLookup>> = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            if let Some(found) = self.leases.cached(id) {
                done.push(Some(found));
                continue;
            }
            let mut lookup = self.leases.lookup_as(id, who);
            match (&mut lookup).now_or_never() {
                Some(found) => done.push(Some(found)),
                None => {
                    done.push(None);
                    pending.push(lookup.map(move |found| (i, found)));
                }
            }
        }
        for (i, found) in futures::future::join_all(pending).await {
            done[i] = Some(found);
        }
        done.into_iter()
            .map(|found| found.unwrap_or_else(|| LeaseLookup::Failed("lookup did not run".into())))
            .collect()
    }

    fn outcome<'a>(&self, new: &StorageVersion, evaluation: &'a Evaluation) -> Outcome<'a> {
        let max = self.limits.max_findings;
        let denials: Vec<&Finding> = evaluation.denials().collect();
        let deny = self.enforcement == Enforcement::Deny && !denials.is_empty();
        let mut warnings = Vec::new();
        let mut unlisted = 0usize;
        for f in &evaluation.findings {
            if deny && f.severity == Severity::Deny {
                continue;
            }
            if warnings.len() < max {
                warnings.push(warning_text(f));
            } else {
                unlisted += 1;
            }
        }
        if unlisted > 0 {
            warnings.push(format!(
                "and {unlisted} more finding{} (only the first {max} are listed)",
                plural(unlisted)
            ));
        }
        let mut codes: Vec<&'static str> = evaluation
            .findings
            .iter()
            .map(|f| f.violation.code.as_str())
            .collect();
        codes.sort_unstable();
        codes.dedup();
        let mut audit = BTreeMap::new();
        if !evaluation.findings.is_empty() {
            audit.insert("enforcement", self.enforcement.as_str().to_string());
            audit.insert("findings", findings_summary(&evaluation.findings, max));
        }
        if deny {
            Outcome {
                verdict: "denied",
                allowed: false,
                status: Some(ResponseStatus {
                    status: "Failure",
                    code: 403,
                    reason: "Forbidden",
                    message: denial_message(new.name(), &denials, max),
                }),
                warnings,
                audit,
                codes,
                findings: &evaluation.findings,
            }
        } else {
            Outcome {
                verdict: if warnings.is_empty() {
                    "allowed"
                } else {
                    "warned"
                },
                allowed: true,
                status: None,
                warnings,
                audit,
                codes,
                findings: &evaluation.findings,
            }
        }
    }

    fn record<O>(&self, req: &AdmissionRequest<'_, O>, subresource: &str, outcome: &Outcome<'_>) {
        let operation = operation_label(&req.operation);
        let subresource_label = subresource_label(subresource);
        self.metrics
            .reviews
            .get_or_create(&ReviewLabels {
                operation,
                subresource: subresource_label,
                verdict: outcome.verdict,
                requester: requester_label(&req.user_info.username),
            })
            .inc();
        // One counter update per (code, severity), however many findings there are.
        let mut counts: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
        for f in outcome.findings {
            let severity = if outcome.allowed || f.severity == Severity::Warn {
                "warn"
            } else {
                "deny"
            };
            *counts
                .entry((f.violation.code.as_str(), severity))
                .or_insert(0) += 1;
        }
        for ((code, severity), n) in counts {
            self.metrics
                .findings
                .get_or_create(&FindingLabels {
                    operation,
                    subresource: subresource_label,
                    code,
                    severity,
                })
                .inc_by(n);
        }
        tracing::info!(
            uid = log_field(&req.uid),
            name = log_field(req.name.as_deref().unwrap_or("")),
            operation = log_field(&req.operation),
            subresource = log_field(subresource),
            user = log_field(&req.user_info.username),
            verdict = outcome.verdict,
            findings = outcome.findings.len(),
            codes = %outcome.codes.join(","),
            "review"
        );
    }
}

impl<'a> Outcome<'a> {
    fn allowed(verdict: &'static str, findings: &'a mut [Finding]) -> Self {
        Outcome {
            verdict,
            allowed: true,
            status: None,
            warnings: Vec::new(),
            audit: BTreeMap::new(),
            codes: Vec::new(),
            findings,
        }
    }
}

/// A StorageVersion as a review decodes it: every field of the model, but of `metadata` only
/// what the rules read (name and generation). Decoding k8s-openapi's whole `ObjectMeta`, whose
/// `managedFields` become JSON values, took about half of the decoding time; the other metadata
/// fields are skipped without being allocated.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewedObject {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: ReviewedMetadata,
    #[serde(default)]
    spec: StorageVersionSpec,
    #[serde(default)]
    status: StorageVersionStatus,
}

#[derive(Deserialize, Default)]
struct ReviewedMetadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
}

impl From<ReviewedObject> for StorageVersion {
    fn from(o: ReviewedObject) -> Self {
        StorageVersion {
            api_version: o.api_version,
            kind: o.kind,
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: o.metadata.name,
                generation: o.metadata.generation,
                ..Default::default()
            },
            spec: o.spec,
            status: o.status,
        }
    }
}

/// The one-pass decode of the review and its object (`oldObject` kept raw), or `None` if that
/// pass cannot read it. A body that is valid UTF-8 as a whole (every body kube-apiserver sends)
/// is checked once and then read as text, so the reader does not validate each string again
/// (about a sixth of the decode); any other body is read as bytes, as before.
fn decode_fast(body: &[u8]) -> Option<AdmissionReviewIn<'_, ReviewedObject>> {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text).ok(),
        Err(_) => serde_json::from_slice(body).ok(),
    }
}

/// Decodes `body` as a review's one-pass decode does (the review and its object); the number of
/// entries of `request.object`, or `None` if it could not. For the benchmark.
#[doc(hidden)]
pub fn decode_review(body: &[u8]) -> Option<usize> {
    let review = decode_fast(body)?;
    let object = review.request?.object?;
    Some(StorageVersion::from(object).status.storage_versions.len())
}

/// `request.object` or `request.oldObject` as read: turned into a [`StorageVersion`].
trait ReviewObject {
    fn into_storage_version(self, which: &str) -> Result<StorageVersion, String>;
}

impl ReviewObject for ReviewedObject {
    fn into_storage_version(self, _: &str) -> Result<StorageVersion, String> {
        Ok(StorageVersion::from(self))
    }
}

impl ReviewObject for &RawValue {
    fn into_storage_version(self, which: &str) -> Result<StorageVersion, String> {
        serde_json::from_str::<ReviewedObject>(self.get())
            .map(StorageVersion::from)
            .map_err(|e| format!("request.{which} is not a readable StorageVersion: {e}"))
    }
}

fn decode_object<O: ReviewObject>(object: Option<O>) -> Result<StorageVersion, String> {
    let Some(object) = object else {
        return Err(
            "request.object is missing: cannot judge a StorageVersion write without it".into(),
        );
    };
    object.into_storage_version("object")
}

pub mod crd;
mod message;
pub use crd::CrdGuard;
pub use message::MAX_FINDING_TEXT_BYTES;
use message::{denial_message, findings_summary, plural, warning_text};

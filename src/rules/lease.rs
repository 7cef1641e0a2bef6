//! The live-lease rule (design §3): an entry must name a running kube-apiserver, that is an
//! identity Lease `kube-system/<apiServerID>` that exists, carries
//! `apiserver.kubernetes.io/identity=kube-apiserver` and has not expired. Only evidence denies:
//! a failed lookup never does, and missing lease data skips the rule.

use super::{Code, RuleOptions};
use crate::model::{
    LeaseLookup, LeaseRecord, IDENTITY_LABEL_KEY, IDENTITY_LABEL_VALUE, IDENTITY_LEASE_NAMESPACE,
};

/// What the lease rule concludes about one apiServerID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseJudgement {
    /// A live kube-apiserver identity lease: nothing to say.
    Live,
    /// No lease data was given: the rule cannot be judged.
    Unknown,
    /// Something is wrong (or could not be checked, for [`Code::LeaseLookupFailed`]).
    Problem { code: Code, message: String },
}

/// Judges the lease facts for `id` (`None` when the caller has none for it).
pub fn judge(id: &str, lookup: Option<&LeaseLookup>, opts: &RuleOptions) -> LeaseJudgement {
    let problem = |code, message| LeaseJudgement::Problem { code, message };
    match lookup {
        None | Some(LeaseLookup::Unknown) => LeaseJudgement::Unknown,
        Some(LeaseLookup::Failed(err)) => problem(
            Code::LeaseLookupFailed,
            format!(
                "could not look up identity lease {IDENTITY_LEASE_NAMESPACE}/{id}: {err}; not denying: a lease is judged only on evidence"
            ),
        ),
        Some(LeaseLookup::NotFound) => problem(
            Code::LeaseMissing,
            format!(
                "identity lease {IDENTITY_LEASE_NAMESPACE}/{id} does not exist, so no running kube-apiserver has the ID {id:?}; an entry must be reported by a running kube-apiserver (check the apiServerID, or wait until that apiserver has created its lease)"
            ),
        ),
        Some(LeaseLookup::Found(record)) => judge_record(id, record, opts),
    }
}

fn judge_record(id: &str, record: &LeaseRecord, opts: &RuleOptions) -> LeaseJudgement {
    let problem = |code, message| LeaseJudgement::Problem { code, message };
    if record.identity_label.as_deref() != Some(IDENTITY_LABEL_VALUE) {
        let has = match &record.identity_label {
            None => format!("has no label {IDENTITY_LABEL_KEY}"),
            Some(v) => format!("has label {IDENTITY_LABEL_KEY}={v:?}"),
        };
        return problem(
            Code::LeaseNotApiserver,
            format!(
                "lease {IDENTITY_LEASE_NAMESPACE}/{id} {has}, so it is not a kube-apiserver identity lease (that needs {IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE:?}); an entry must name a running kube-apiserver's ID"
            ),
        );
    }
    let expired = |why: String| {
        problem(
            Code::LeaseExpired,
            format!(
                "identity lease {IDENTITY_LEASE_NAMESPACE}/{id} {why}, so the apiserver {id:?} is not running; an entry must name a running kube-apiserver (kube-apiserver renews its lease every 10s)"
            ),
        )
    };
    let Some(renew) = record.renew_time else {
        return expired("has no spec.renewTime and counts as expired".to_string());
    };
    let Some(duration) = record.lease_duration_seconds else {
        return expired("has no spec.leaseDurationSeconds and counts as expired".to_string());
    };
    let Some(expiry) = record.expiry() else {
        // Both fields are present, so this cannot happen; judge on evidence only.
        return LeaseJudgement::Live;
    };
    let skew = k8s_openapi::jiff::SignedDuration::try_from(opts.lease_skew_allowance)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    if expiry.checked_add(skew).map_or(true, |limit| limit > opts.now) {
        return LeaseJudgement::Live;
    }
    expired(format!(
        "expired at {expiry} (renewTime {renew} + leaseDurationSeconds {duration}; now is {}, allowing {:?} of clock skew)",
        opts.now, opts.lease_skew_allowance,
    ))
}

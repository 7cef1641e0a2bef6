//! Prometheus metrics, served as text on the admin listener's `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use std::sync::atomic::AtomicU64;

/// Every label value taken from a request comes from a fixed set, so a client cannot create
/// series (each kept until the process ends) or make `/metrics` grow: anything else is `other`.
pub const OTHER: &str = "other";

/// The operation label: `CREATE`, `UPDATE`, `DELETE`, `CONNECT` or `other`.
pub fn operation_label(operation: &str) -> &'static str {
    match operation {
        "CREATE" => "CREATE",
        "UPDATE" => "UPDATE",
        "DELETE" => "DELETE",
        "CONNECT" => "CONNECT",
        _ => OTHER,
    }
}

/// The subresource label: `""` (the main resource), `status` or `other`.
pub fn subresource_label(subresource: &str) -> &'static str {
    match subresource {
        "" => "",
        "status" => "status",
        _ => OTHER,
    }
}

/// The username kube-apiserver uses for its own writes (its loopback client).
pub const APISERVER_USERNAME: &str = "system:apiserver";

/// The requester label: `apiserver` for kube-apiserver's own writes, `other` for everyone else,
/// so that an alert can fire on any denial of the apiserver's writes.
pub fn requester_label(username: &str) -> &'static str {
    if username == APISERVER_USERNAME {
        "apiserver"
    } else {
        OTHER
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// CREATE, UPDATE, DELETE, CONNECT or other.
    pub operation: &'static str,
    /// "" for the main resource, "status" for `/status`, other for anything else.
    pub subresource: &'static str,
    /// allowed, warned, denied, ignored (not a StorageVersion), error (undecodable object).
    pub verdict: &'static str,
    /// apiserver (userInfo.username `system:apiserver`) or other.
    pub requester: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    pub operation: &'static str,
    pub subresource: &'static str,
    pub code: &'static str,
    /// deny or warn
    pub severity: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// A gauge family's label: what state the things it counts are in (each task lists its states
/// at its metric).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// Declares a struct of metrics once: each field with its type, its initial value (the type's
/// default unless `= value` is given), its name under the struct's prefix and its help text; and
/// `fn declared(registry)`, which creates every metric and registers it in `registry` under the
/// prefix, in the order written (the order of `/metrics`).
macro_rules! declare {
    (@init) => { ::std::default::Default::default() };
    (@init $init:expr) => { $init };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident in $prefix:literal {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident : $ty:ty $(= $init:expr)? => $metric:literal, $help:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$field_meta])* $field_vis $field: $ty, )*
        }

        impl $name {
            /// Creates every metric and registers it in `registry` under the prefix.
            fn declared(registry: &mut ::prometheus_client::registry::Registry) -> Self {
                let m = $name { $( $field: $crate::metrics::declare!(@init $($init)?), )* };
                let r = registry.sub_registry_with_prefix($prefix);
                $( r.register($metric, $help, m.$field.clone()); )*
                m
            }
        }
    };
}
pub(crate) use declare;

crate::metrics::declare! {
    /// Every metric the process exports. Cheap to clone (all handles are `Arc`s inside).
    #[derive(Clone)]
    pub struct Metrics in "storageversion_webhook" {
        pub reviews: Family<ReviewLabels, Counter> => "admission_reviews", "AdmissionReviews answered, by operation, subresource, verdict and requester (apiserver or other)";
        pub findings: Family<FindingLabels, Counter> => "admission_findings", "Rule violations found in reviews, by rule code and whether they denied or warned";
        pub review_duration: Histogram = Histogram::new(LATENCY_BUCKETS.iter().copied()) => "admission_review_duration_seconds", "Time to answer one AdmissionReview, from body read to response encoded";
        pub http_errors: Family<ResultLabels, Counter> => "admission_http_errors", "Requests to /validate refused before or instead of review (method_not_allowed, too_large, body_unreadable, body_timeout, large_body_budget, not_json, not_admission_review)";
        pub crd_guard_reviews: Family<ResultLabels, Counter> => "crd_guard_reviews", "CustomResourceDefinition UPDATE reviews of /validate-crd, by result (unchanged, storage_change, denied, warned_during_migration, unreadable, ignored)";
        pub lease_lookups: Family<ResultLabels, Counter> => "lease_lookups", "Identity lease lookups by result (cache_hit, negative_cache_hit, live_found, live_not_found, error, over_budget)";
        pub lease_view_leases: Gauge => "lease_view_leases", "Identity leases in the watch cache";
        pub lease_view_synced: Gauge => "lease_view_synced", "1 when the lease watch cache has completed its initial list and is watching";
        pub lease_view_staleness_seconds: Gauge<f64, AtomicU64> => "lease_view_staleness_seconds", "Seconds since the lease watch was last known healthy (0 while healthy)";
        pub cert_expiry_seconds: Gauge<f64, AtomicU64> => "serving_certificate_expiry_seconds", "Seconds until the serving certificate's notAfter (negative when expired)";
        pub cert_reloads: Family<ResultLabels, Counter> => "tls_certificate_reloads", "Serving certificate reload attempts by result (ok, error)";
    }
}

/// Latency buckets, fine below 5 ms where a healthy webhook lives.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.002, 0.003, 0.004, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 1.0,
];

impl Metrics {
    /// Creates the metrics and registers them (prefix `storageversion_webhook`) in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        Self::declared(registry)
    }
}

/// Encodes `registry` in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

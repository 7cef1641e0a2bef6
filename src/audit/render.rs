//! `audit`'s text output.

use super::report::AuditReport;
use crate::model::IDENTITY_LEASE_NAMESPACE;

/// Renders the report for people.
pub fn render_text(r: &AuditReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if r.storage_version_api {
        let _ = writeln!(
            out,
            "{} StorageVersions, {} identity leases in {IDENTITY_LEASE_NAMESPACE}, judged at {}",
            r.storage_versions, r.identity_leases, r.now
        );
    } else {
        let _ = writeln!(
            out,
            "the StorageVersion API (internal.apiserver.k8s.io/v1alpha1) is not served: built-in storage versions are not visible on this cluster; CRDs judged at {}",
            r.now
        );
    }
    if r.clean {
        let what = if r.storage_version_api {
            "every entry names a live apiserver, no rule is broken, GC would change nothing, "
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "clean: {what}every CRD's storedVersions is its storage version"
        );
        return out;
    }
    if !r.stale_entries.is_empty() {
        let _ = writeln!(out, "\nstale entries ({}):", r.stale_entries.len());
        for e in &r.stale_entries {
            let gc = if e.gc_removes {
                "GC removes it"
            } else {
                "GC keeps it (expired leases count as gone only with --gc-expired-lease-grace)"
            };
            let _ = writeln!(
                out,
                "  {} {}: {} [{}]; {gc}",
                e.storage_version, e.api_server_id, e.message, e.problem
            );
        }
    }
    if !r.violations.is_empty() {
        let _ = writeln!(out, "\nrule violations ({}):", r.violations.len());
        for v in &r.violations {
            let _ = writeln!(out, "  {}: {} [{}]", v.storage_version, v.message, v.code);
        }
    }
    if !r.gc_actions.is_empty() {
        let _ = writeln!(out, "\nGC would ({} objects):", r.gc_actions.len());
        for a in &r.gc_actions {
            let removed = crate::gc::collector::describe(&a.removed);
            match (&a.action, &a.common_encoding_version_after) {
                (&"delete", _) => {
                    let _ = writeln!(
                        out,
                        "  delete {} (no entry left after removing {removed})",
                        a.storage_version
                    );
                }
                (_, common) => {
                    let common = common
                        .as_ref()
                        .and_then(|c| c.as_deref())
                        .unwrap_or("unset");
                    let _ = writeln!(
                        out,
                        "  rewrite {}: remove {removed}; commonEncodingVersion becomes {common}",
                        a.storage_version
                    );
                }
            }
        }
    }
    out.push_str(&crate::migrate::audit::render_text(&r.stale_storage));
    out.push_str(&crate::crd::audit::render_text(&r.crds));
    let _ = writeln!(
        out,
        "\n{} stale entries, {} rule violations, {} objects GC would change, {} CRDs not done",
        r.stale_entries.len(),
        r.violations.len(),
        r.gc_actions.len(),
        r.crds.len()
    );
    out
}

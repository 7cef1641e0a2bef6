//! What `audit` says about storage migration: resources whose stored objects may still be in an
//! older encoding version (their agreed version changed and no migration has succeeded since),
//! each with the command that fixes it. Pure judgement ([`judge`]) plus the reads ([`fetch`]).

use std::collections::BTreeMap;

use anyhow::Context;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::decide::{self, Agreement};
use super::state::Memory;
use super::svm::{self, Phase, StorageVersionMigration};
use crate::model::StorageVersion;

/// Flags of `audit` about migration (flattened into `audit`).
#[derive(Clone, Debug, clap::Args)]
pub struct AuditMigrateArgs {
    /// Namespace of the migration state ConfigMap (`serve --migrate`'s leader Lease namespace).
    #[arg(long, value_name = "NAMESPACE", default_value = "default")]
    pub migrate_state_namespace: String,
    /// Name of the migration state ConfigMap.
    #[arg(long, value_name = "NAME", default_value = super::args::DEFAULT_STATE_CONFIGMAP)]
    pub migrate_state_configmap: String,
}

/// One resource whose stored objects may still be in an older version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleStorage {
    pub storage_version: String,
    /// The version every apiserver encodes now (None: they disagree).
    pub encoding_version: Option<String>,
    /// The version last agreed on, before the change.
    pub last_agreed: String,
    /// The migration to the current version, if any, and where it stands.
    pub migration: Option<String>,
    pub phase: Option<&'static str>,
    /// What is going on, for people.
    pub problem: String,
    /// A command that fixes it (or shows progress).
    pub fix: String,
}

/// Judges every StorageVersion against the remembered versions and the migrations. A resource
/// never remembered (the trigger never ran, or it has agreed on one version ever since) is not
/// listed. Pure.
pub fn judge(
    svs: &[StorageVersion],
    memory: &Memory,
    migrations: &[StorageVersionMigration],
) -> Vec<StaleStorage> {
    let by_name: BTreeMap<&str, &StorageVersionMigration> =
        migrations.iter().map(|m| (m.name(), m)).collect();
    let mut out = Vec::new();
    for sv in svs {
        let name = sv.name();
        let Some(last) = memory.get(name) else {
            continue;
        };
        let Some(gr) = svm::group_resource(name) else {
            continue;
        };
        let create = create_command(name, &gr);
        match decide::agreement(&sv.status) {
            Agreement::Agreed(v) if &v != last => out.push(StaleStorage {
                storage_version: name.to_string(),
                encoding_version: Some(v.clone()),
                last_agreed: last.clone(),
                migration: None,
                phase: None,
                problem: format!(
                    "every apiserver now encodes {v} (last agreed: {last}); objects written before may still be stored as {last}, and no migration was created yet (serve --migrate creates it after the settle time)"
                ),
                fix: create,
            }),
            Agreement::Agreed(v) => {
                let mname = svm::migration_name(name, &v);
                let Some(m) = by_name.get(mname.as_str()) else {
                    continue; // agreed on this version since it was first seen
                };
                let phase = m.phase();
                let newer_success = migrations.iter().any(|o| {
                    o.spec.resource == gr
                        && o.phase() == Phase::Succeeded
                        && o.metadata.creation_timestamp >= m.metadata.creation_timestamp
                });
                if phase == Phase::Succeeded || newer_success {
                    continue;
                }
                let (problem, fix) = if phase == Phase::Failed {
                    (
                        format!(
                            "migration {mname} to {v} failed: {}; objects may still be stored as {last}",
                            m.phase_message()
                        ),
                        format!("fix the cause, then: {create}"),
                    )
                } else {
                    (
                        format!("migration {mname} to {v} is {}", phase.as_str()),
                        format!("kubectl get storageversionmigration {mname} -o yaml  # wait for Succeeded"),
                    )
                };
                out.push(StaleStorage {
                    storage_version: name.to_string(),
                    encoding_version: Some(v.clone()),
                    last_agreed: last.clone(),
                    migration: Some(mname),
                    phase: Some(phase.as_str()),
                    problem,
                    fix,
                });
            }
            Agreement::Disagree | Agreement::NotDecodable { .. } => {}
        }
    }
    out
}

/// The kubectl command that creates a fresh migration of `gr` (a new name each time).
pub fn create_command(storageversion: &str, gr: &svm::GroupResource) -> String {
    let prefix = svm::migration_name(storageversion, "manual");
    format!(
        "kubectl create -f - <<'EOF'\napiVersion: {}\nkind: {}\nmetadata:\n  generateName: {prefix}-\nspec:\n  resource:\n    group: \"{}\"\n    resource: {}\nEOF",
        svm::API_VERSION,
        svm::KIND,
        gr.group,
        gr.resource
    )
}

/// Reads the state ConfigMap and our migrations, and judges `svs`. A cluster without the
/// storagemigration.k8s.io/v1 API or without the ConfigMap has nothing to report.
pub async fn fetch(
    client: kube::Client,
    args: &AuditMigrateArgs,
    svs: &[StorageVersion],
) -> anyhow::Result<Vec<StaleStorage>> {
    let memory = super::state::load(
        &client,
        &args.migrate_state_namespace,
        &args.migrate_state_configmap,
    )
    .await?;
    if memory.is_empty() {
        return Ok(Vec::new());
    }
    let api: Api<StorageVersionMigration> = Api::all(client);
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        svm::MANAGED_BY_LABEL,
        svm::MANAGED_BY_VALUE
    ));
    let migrations = match api.list(&lp).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => {
            return Err(e).context("cannot list storageversionmigrations.storagemigration.k8s.io")
        }
    };
    Ok(judge(svs, &memory, &migrations))
}

/// Adds the stale-storage findings to an `audit` report (one more LIST of StorageVersions, the
/// state ConfigMap and our migrations); any finding makes the report not clean.
pub async fn extend(
    client: kube::Client,
    args: &AuditMigrateArgs,
    report: &mut crate::audit::AuditReport,
) -> anyhow::Result<()> {
    let svs: Api<StorageVersion> = Api::all(client.clone());
    let svs = svs
        .list(&ListParams::default())
        .await
        .context("cannot list storageversions.internal.apiserver.k8s.io")?;
    report.stale_storage = fetch(client, args, &svs.items).await?;
    report.clean &= report.stale_storage.is_empty();
    Ok(())
}

/// The text section of `audit` (empty when there is nothing to say).
pub fn render_text(stale: &[StaleStorage]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if stale.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nstored objects that may still be in an older version ({}):",
        stale.len()
    );
    for s in stale {
        let _ = writeln!(out, "  {}: {}", s.storage_version, s.problem);
        for (i, line) in s.fix.lines().enumerate() {
            let lead = if i == 0 { "    fix: " } else { "         " };
            let _ = writeln!(out, "{lead}{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sv(name: &str, versions: &[&str]) -> StorageVersion {
        let entries: Vec<_> = versions
            .iter()
            .enumerate()
            .map(|(i, v)| {
                serde_json::json!({
                    "apiServerID": format!("a{i}"),
                    "encodingVersion": v,
                    "decodableVersions": ["g/v1beta1", "g/v1"],
                })
            })
            .collect();
        let same = versions.windows(2).all(|w| w[0] == w[1]);
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {
                "storageVersions": entries,
                "commonEncodingVersion": if same { versions.first().copied() } else { None },
            },
        }))
        .expect("storage version")
    }

    fn mig(name: &str, created: &str, cond: Option<(&str, &str)>) -> StorageVersionMigration {
        let conditions: Vec<_> = cond
            .into_iter()
            .map(|(t, msg)| {
                serde_json::json!({"type": t, "status": "True", "reason": "r", "message": msg,
                    "lastTransitionTime": created})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"resource": {"group": "g", "resource": "things"}},
            "status": {"conditions": conditions},
        }))
        .expect("migration")
    }

    #[test]
    fn lists_changed_unmigrated_and_failed_resources_only() {
        let memory: Memory = [
            ("g.things".to_string(), "g/v1beta1".to_string()),
            ("g.others".to_string(), "g/v1".to_string()),
        ]
        .into_iter()
        .collect();
        // Changed and not migrated yet.
        let r = judge(&[sv("g.things", &["g/v1", "g/v1"])], &memory, &[]);
        assert_eq!(r.len(), 1);
        assert!(r[0].fix.contains("kind: StorageVersionMigration"));
        assert!(r[0].fix.contains("resource: things"));
        // Disagreeing: not (yet) a finding.
        assert!(judge(&[sv("g.things", &["g/v1", "g/v1beta1"])], &memory, &[]).is_empty());
        // Unchanged and never migrated, or never remembered: nothing.
        assert!(judge(
            &[sv("g.others", &["g/v1"]), sv("g.new", &["g/v1"])],
            &memory,
            &[]
        )
        .is_empty());
        // Migrated: remembered == agreed, migration succeeded.
        let done: Memory = [("g.things".to_string(), "g/v1".to_string())]
            .into_iter()
            .collect();
        let ok = mig(
            "g.things-v1",
            "2026-01-01T00:00:00Z",
            Some(("Succeeded", "done")),
        );
        assert!(judge(&[sv("g.things", &["g/v1"])], &done, &[ok]).is_empty());
        // Failed: listed with the fix; a later successful manual migration clears it.
        let failed = mig(
            "g.things-v1",
            "2026-01-01T00:00:00Z",
            Some(("Failed", "denied")),
        );
        let r = judge(
            &[sv("g.things", &["g/v1"])],
            &done,
            std::slice::from_ref(&failed),
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].phase, Some("failed"));
        assert!(r[0].problem.contains("denied"), "{}", r[0].problem);
        assert!(r[0].fix.starts_with("fix the cause"));
        assert!(render_text(&r).contains("g.things"));
        let manual = mig(
            "g.things-manual-x",
            "2026-01-01T01:00:00Z",
            Some(("Succeeded", "")),
        );
        assert!(judge(
            &[sv("g.things", &["g/v1"])],
            &done,
            &[failed.clone(), manual]
        )
        .is_empty());
        // Running: listed, with the command to watch it.
        let running = mig(
            "g.things-v1",
            "2026-01-01T00:00:00Z",
            Some(("Running", "1/2")),
        );
        let r = judge(&[sv("g.things", &["g/v1"])], &done, &[running]);
        assert_eq!(r[0].phase, Some("running"));
        assert!(render_text(&[]).is_empty());
    }
}

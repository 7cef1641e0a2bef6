//! What `audit` says about storage migration: resources whose stored objects may still be in an
//! older encoding version (their agreed version changed and no migration has succeeded since),
//! each with the command that fixes it. Pure judgement ([`judge`]) plus the reads ([`fetch`]).

use std::collections::BTreeMap;

use anyhow::Context;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::decide::{self, Agreement};
use super::state::{Memory, Record};
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
    /// Name of the CRD migrator's state ConfigMap (`serve --crd-migrate-state-configmap`), in
    /// the same namespace.
    #[arg(long, value_name = "NAME", default_value = crate::crd::args::DEFAULT_STATE_CONFIGMAP)]
    pub crd_state_configmap: String,
}

/// One resource whose stored objects may still be in another version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleStorage {
    pub storage_version: String,
    /// The version every apiserver encodes now (None: they disagree).
    pub encoding_version: Option<String>,
    /// The versions objects may be stored in besides it (`unknown` for a disagreement seen only
    /// by its traces).
    pub other_versions: String,
    /// The last migration begun for it, if any, and where it stands.
    pub migration: Option<String>,
    pub phase: Option<&'static str>,
    /// What is going on, for people.
    pub problem: String,
    /// A command that fixes it (or shows progress).
    pub fix: String,
}

/// Judges every StorageVersion against what the trigger remembers and the migrations (all of
/// them: one made by hand counts too). A resource is listed until a migration that began after
/// its entries last disagreed has succeeded: while its entries disagree, when they agree but
/// something may be stored in another version and no migration has begun since, and while the
/// last migration has not succeeded (failed, running, or gone) and no later one of the same
/// resource has. A resource never remembered (the trigger never ran) is not listed. Pure; it
/// folds in what is seen now exactly as the trigger does ([`Record::observe`]). The fix it prints
/// creates a migration in `v`, the API version the cluster serves.
pub fn judge(
    svs: &[StorageVersion],
    memory: &Memory,
    migrations: &[StorageVersionMigration],
    v: svm::ApiVersion,
) -> Vec<StaleStorage> {
    let by_name: BTreeMap<&str, &StorageVersionMigration> =
        migrations.iter().map(|m| (m.name(), m)).collect();
    let mut out = Vec::new();
    for sv in svs {
        let name = sv.name();
        let Some(previous) = memory.get(name) else {
            continue;
        };
        let Some(gr) = svm::group_resource(name) else {
            continue;
        };
        let record = Record::observe(Some(previous), sv.metadata.uid.as_deref(), &sv.status);
        let create = create_command(name, &gr, v);
        let stale =
            |encoding: Option<String>, others: String, problem: String, fix: String| StaleStorage {
                storage_version: name.to_string(),
                encoding_version: encoding,
                other_versions: others,
                migration: record.migration.clone(),
                phase: None,
                problem,
                fix,
            };
        let agreed = match decide::agreement(&sv.status) {
            Agreement::Agreed(v) | Agreement::NotDecodable { version: v, .. } => v,
            Agreement::Disagree if sv.status.storage_versions.is_empty() => continue,
            Agreement::Disagree => {
                let versions: std::collections::BTreeSet<&str> = sv
                    .status
                    .storage_versions
                    .iter()
                    .map(|e| e.encoding_version.as_str())
                    .collect();
                let list = versions.into_iter().collect::<Vec<_>>().join(", ");
                out.push(stale(
                    None,
                    list.clone(),
                    format!(
                        "apiservers encode different versions ({list}): objects are being stored in more than one; serve --migrate begins a migration once they agree for the settle time"
                    ),
                    "finish (or roll back) the upgrade; then wait for the migration".to_string(),
                ));
                continue;
            }
        };
        if record.needs_migration_to(&agreed) {
            let others = record.others(&agreed);
            out.push(stale(
                Some(agreed.clone()),
                others.clone(),
                format!(
                    "every apiserver now encodes {agreed}, but objects written since the last migration began may be stored as {others}, and no migration has begun since (serve --migrate begins one after the settle time)"
                ),
                create.clone(),
            ));
            continue;
        }
        let Some(mname) = record.migration.clone() else {
            continue; // agreed on one version since it was first seen
        };
        if record.succeeded {
            continue;
        }
        let Some(m) = by_name.get(mname.as_str()) else {
            out.push(stale(
                Some(agreed.clone()),
                String::new(),
                format!("migration {mname} was begun but does not exist (never created, or deleted before it succeeded)"),
                create.clone(),
            ));
            continue;
        };
        let phase = m.phase();
        let later_success = migrations.iter().any(|o| {
            o.spec.resource == gr
                && o.phase() == Phase::Succeeded
                && o.metadata.creation_timestamp >= m.metadata.creation_timestamp
        });
        if phase == Phase::Succeeded || later_success {
            continue;
        }
        let (problem, fix) = if phase == Phase::Failed {
            (
                format!(
                    "migration {mname} to {agreed} failed: {}; objects may still be stored in other versions",
                    m.phase_message()
                ),
                format!("fix the cause, then: {create}"),
            )
        } else {
            (
                format!("migration {mname} to {agreed} is {}", phase.as_str()),
                format!(
                    "kubectl get storageversionmigration {mname} -o yaml  # wait for Succeeded"
                ),
            )
        };
        let mut s = stale(Some(agreed.clone()), String::new(), problem, fix);
        s.phase = Some(phase.as_str());
        out.push(s);
    }
    out
}

/// The kubectl command that creates a fresh migration of `gr` (a new name each time), in the API
/// version `v` the cluster serves.
pub fn create_command(storageversion: &str, gr: &svm::GroupResource, v: svm::ApiVersion) -> String {
    let prefix = svm::manual_prefix(storageversion);
    format!(
        "kubectl create -f - <<'EOF'\napiVersion: {}\nkind: {}\nmetadata:\n  generateName: {prefix}-\nspec:\n  resource:\n    group: \"{}\"\n    resource: {}\nEOF",
        v.api_version(),
        svm::KIND,
        gr.group,
        gr.resource
    )
}

/// Reads the state ConfigMap and the migrations, and judges `svs`. A cluster without the
/// ConfigMap has nothing to report; one without a StorageVersionMigration API we use
/// (storagemigration.k8s.io/v1 or v1beta1) has no migrations.
pub async fn fetch(
    client: kube::Client,
    args: &AuditMigrateArgs,
    svs: &[StorageVersion],
) -> anyhow::Result<Vec<StaleStorage>> {
    let (memory, migrations, v) = read(
        client,
        &args.migrate_state_namespace,
        &args.migrate_state_configmap,
    )
    .await?;
    Ok(judge(svs, &memory, &migrations, v))
}

/// What [`judge`] needs besides the StorageVersions: the state ConfigMap `namespace/configmap`,
/// every migration (none are listed when nothing is remembered), and the API version the
/// cluster serves them in (`v1` when it serves none: the fix printed then is for 1.37+).
pub async fn read(
    client: kube::Client,
    namespace: &str,
    configmap: &str,
) -> anyhow::Result<(Memory, Vec<StorageVersionMigration>, svm::ApiVersion)> {
    let memory = super::state::load(&client, namespace, configmap).await?;
    if memory.is_empty() {
        return Ok((memory, Vec::new(), svm::ApiVersion::default()));
    }
    // Every migration, not only ours: one made by hand with the printed command counts too.
    let served = svm::ApiVersion::discover(&client)
        .await
        .context("cannot discover the storagemigration.k8s.io API")?;
    let migrations = match served {
        None => Vec::new(),
        Some(v) => {
            let api: Api<StorageVersionMigration> = Api::all_with(client, &v);
            match api.list(&ListParams::default()).await {
                Ok(l) => l.items,
                Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
                Err(e) => {
                    return Err(e)
                        .context("cannot list storageversionmigrations.storagemigration.k8s.io")
                }
            }
        }
    };
    Ok((memory, migrations, served.unwrap_or_default()))
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

    fn remembered(agreed: &str, written: &[&str], migration: Option<&str>) -> Record {
        Record {
            agreed: Some(agreed.into()),
            written: written.iter().map(|w| w.to_string()).collect(),
            migration: migration.map(str::to_string),
            sequence: u64::from(migration.is_some()),
            created: migration.is_some(),
            ..Record::default()
        }
    }

    fn memory(records: &[(&str, Record)]) -> Memory {
        records
            .iter()
            .map(|(k, r)| (k.to_string(), r.clone()))
            .collect()
    }

    #[test]
    fn lists_mixed_unmigrated_and_failed_resources_only() {
        let m = memory(&[
            ("g.things", remembered("g/v1beta1", &["g/v1beta1"], None)),
            ("g.others", remembered("g/v1", &["g/v1"], None)),
        ]);
        // Changed and not migrated yet.
        let r = judge(
            &[sv("g.things", &["g/v1", "g/v1"])],
            &m,
            &[],
            super::svm::ApiVersion::V1,
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].other_versions, "g/v1beta1");
        assert!(r[0].fix.contains("kind: StorageVersionMigration"));
        assert!(r[0].fix.contains("resource: things"));
        assert!(r[0].fix.contains("generateName: g.things-manual-"));
        // Disagreeing: objects are being written in two versions.
        let r = judge(
            &[sv("g.things", &["g/v1", "g/v1beta1"])],
            &m,
            &[],
            super::svm::ApiVersion::V1,
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].encoding_version, None);
        // Unchanged and never migrated, or never remembered: nothing.
        assert!(judge(
            &[sv("g.others", &["g/v1"]), sv("g.new", &["g/v1"])],
            &m,
            &[],
            super::svm::ApiVersion::V1
        )
        .is_empty());
        // Migrated: begun after the last disagreement and succeeded.
        let done = memory(&[(
            "g.things",
            remembered("g/v1", &["g/v1"], Some("g.things-v1-1")),
        )]);
        let ok = mig(
            "g.things-v1-1",
            "2026-01-01T00:00:00Z",
            Some(("Succeeded", "done")),
        );
        assert!(judge(
            &[sv("g.things", &["g/v1"])],
            &done,
            std::slice::from_ref(&ok),
            super::svm::ApiVersion::V1
        )
        .is_empty());
        // Defect 3: written in v1beta1 again after that migration (a rollback): listed again,
        // although an older migration to v1 succeeded.
        let again = memory(&[(
            "g.things",
            remembered("g/v1", &["g/v1", "g/v1beta1"], Some("g.things-v1-1")),
        )]);
        let r = judge(
            &[sv("g.things", &["g/v1"])],
            &again,
            &[ok],
            super::svm::ApiVersion::V1,
        );
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].other_versions, "g/v1beta1");
        // Failed: listed with the fix; a later successful manual migration clears it.
        let failed = mig(
            "g.things-v1-1",
            "2026-01-01T00:00:00Z",
            Some(("Failed", "denied")),
        );
        let r = judge(
            &[sv("g.things", &["g/v1"])],
            &done,
            std::slice::from_ref(&failed),
            super::svm::ApiVersion::V1,
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
            &[failed.clone(), manual],
            super::svm::ApiVersion::V1
        )
        .is_empty());
        // Running: listed, with the command to watch it.
        let running = mig(
            "g.things-v1-1",
            "2026-01-01T00:00:00Z",
            Some(("Running", "1/2")),
        );
        let r = judge(
            &[sv("g.things", &["g/v1"])],
            &done,
            &[running],
            super::svm::ApiVersion::V1,
        );
        assert_eq!(r[0].phase, Some("running"));
        // Begun but gone before it succeeded: listed with the command that makes a new one.
        let r = judge(
            &[sv("g.things", &["g/v1"])],
            &done,
            &[],
            super::svm::ApiVersion::V1,
        );
        assert_eq!(r.len(), 1);
        assert!(r[0].problem.contains("does not exist"), "{}", r[0].problem);
        assert!(render_text(&[]).is_empty());
    }
}

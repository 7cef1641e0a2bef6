//! The I/O of `audit`: paginated LISTs of StorageVersions and of the Leases in `kube-system`,
//! each page trimmed to what the report needs before the next is read.

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};

use super::report::{build_report, AuditOptions, AuditReport};
use crate::model::{LeaseRecord, StorageVersion, IDENTITY_LEASE_NAMESPACE};

/// Objects per LIST page.
pub const PAGE_SIZE: u32 = 500;
/// How long one page may take.
pub const PAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Every object of `api`, page by page, each mapped by `keep` as it arrives.
pub async fn list_all<K, T>(
    api: &Api<K>,
    what: &str,
    mut keep: impl FnMut(K) -> T,
) -> anyhow::Result<Vec<T>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut lp = ListParams::default().limit(PAGE_SIZE);
    loop {
        let page = tokio::time::timeout(PAGE_TIMEOUT, api.list(&lp))
            .await
            .map_err(|_| anyhow::anyhow!("listing {what} took longer than {PAGE_TIMEOUT:?}"))?
            .with_context(|| format!("cannot list {what}"))?;
        out.extend(page.items.into_iter().map(&mut keep));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// Lists StorageVersions and the Leases in kube-system, then judges them. None when the cluster
/// does not serve the StorageVersion API (a 404 on the first page).
pub async fn audit(
    client: kube::Client,
    opts: &AuditOptions,
) -> anyhow::Result<Option<AuditReport>> {
    let svs: Api<StorageVersion> = Api::all(client.clone());
    match tokio::time::timeout(
        PAGE_TIMEOUT,
        svs.list_metadata(&ListParams::default().limit(1)),
    )
    .await
    {
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => return Ok(None),
        _ => {}
    }
    let leases: Api<Lease> = Api::namespaced(client, IDENTITY_LEASE_NAMESPACE);
    let svs = list_all(
        &svs,
        "storageversions.internal.apiserver.k8s.io (is the internal.apiserver.k8s.io/v1alpha1 API enabled, and may we list it?)",
        |mut sv: StorageVersion| {
            sv.metadata.managed_fields = None;
            sv
        },
    )
    .await?;
    let records = list_all(
        &leases,
        &format!("leases in {IDENTITY_LEASE_NAMESPACE}"),
        |l: Lease| LeaseRecord::from_lease(&l),
    )
    .await?;
    Ok(Some(build_report(&svs, &records, opts)))
}

/// The whole of `audit`: [`audit`], the migration findings of built-in resources
/// ([`crate::migrate::audit::extend`]) where the StorageVersion API is served, and the CRDs
/// ([`crate::crd::audit`]) everywhere.
pub async fn everything(
    client: kube::Client,
    opts: &AuditOptions,
    migrate: &crate::migrate::audit::AuditMigrateArgs,
) -> anyhow::Result<AuditReport> {
    let mut report = match audit(client.clone(), opts).await? {
        Some(mut report) => {
            crate::migrate::audit::extend(client.clone(), migrate, &mut report).await?;
            report
        }
        None => AuditReport {
            now: opts.now.to_string(),
            storage_version_api: false,
            clean: true,
            ..AuditReport::default()
        },
    };
    let (crds, memory) = crate::crd::audit::read(
        client,
        &migrate.migrate_state_namespace,
        &migrate.crd_state_configmap,
    )
    .await?;
    report.crds = crate::crd::audit::judge(&crds, &memory);
    report.clean &= report.crds.is_empty();
    Ok(report)
}

//! The StorageVersion garbage collector (how it works: docs/gc.md; design: docs/design.md §5):
//! upstream's `storage-version-gc` behaviour (docs/upstream.md §5) plus a deletion grace with a
//! re-check before every write, no removal on transient
//! errors, delete preconditions, sweeps, bounded concurrency, optional expired-lease grace,
//! dry-run, Events and metrics. Only the replica holding the leader Lease collects.
//!
//! - [`args`]: flags ([`GcArgs`]), flattened into `serve`.
//! - [`plan`]: pure decisions (lease judgement, what to remove, the rewritten status).
//! - [`stored`]: what the collector keeps of a StorageVersion (trimmed; unknown status fields
//!   kept for the write).
//! - [`collector`]: the work of one leadership term (stores, passes, one write per object).
//! - [`leader`]: leader election with `kube-lease-manager`, fenced and released on shutdown;
//!   the terms every leader-only task runs in ([`crate::leader_task`]).
//! - [`release_guard`]: the election's client, which never clears another replica's live claim.
//!
//! Wiring into `serve`:
//! ```text
//! let leases = leases::LeaseStore::spawn(client.clone()); // shared with admission
//! let gc = gc::spawn_sharing(client.clone(), args.gc.clone(), &mut registry, leases)?;
//! // ... serve admission until SIGTERM, drain ...
//! gc.shutdown().await; // stops collecting and releases the leader Lease
//! ```

pub mod args;
pub mod collector;
pub mod leader;
pub mod metrics;
pub mod plan;
mod release_guard;
pub mod stored;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;

pub use args::GcArgs;
pub use collector::{Collector, CollectorConfig, JournalConfig, SvView};
pub use leader::LeaderConfig;
pub use metrics::GcMetrics;

/// kube-apiserver renews (and re-creates) its identity lease every 10 s: a shorter deletion
/// grace is accepted (tests use one) but warned about.
pub const MIN_SAFE_DELETION_GRACE: Duration = Duration::from_secs(10);

/// A running (or disabled) garbage collector. Dropping it stops collection without releasing
/// the leader Lease; call [`GcHandle::shutdown`] to release it for a fast hand-over.
pub struct GcHandle {
    task: crate::task::Owned,
    leading: leader::Terms,
    identity: Option<String>,
    svs: watch::Receiver<Option<collector::SvView>>,
}

/// Starts the garbage collector in the background (if `args` enable it) and registers its
/// metrics in `registry` (also when disabled, so dashboards see `leader 0`). Must be called
/// inside a Tokio runtime. Fails only on invalid flag combinations.
/// The collector watches identity leases itself; `serve` uses [`spawn_sharing`] to share the
/// lease view's watch instead.
pub fn spawn(
    client: kube::Client,
    args: GcArgs,
    registry: &mut Registry,
) -> anyhow::Result<GcHandle> {
    let leases = args
        .enabled()
        .then(|| crate::leases::LeaseStore::spawn(client.clone()));
    spawn_inner(client, args, registry, leases)
}

/// Like [`spawn`], judging leases from `leases` (the process's one identity-lease watch).
pub fn spawn_sharing(
    client: kube::Client,
    args: GcArgs,
    registry: &mut Registry,
    leases: crate::leases::LeaseStore,
) -> anyhow::Result<GcHandle> {
    spawn_inner(client, args, registry, Some(leases))
}

fn spawn_inner(
    client: kube::Client,
    args: GcArgs,
    registry: &mut Registry,
    leases: Option<crate::leases::LeaseStore>,
) -> anyhow::Result<GcHandle> {
    let metrics = GcMetrics::register(registry);
    let Some(leases) = leases.filter(|_| args.enabled()) else {
        tracing::info!("garbage collector disabled (--no-gc)");
        return Ok(GcHandle::disabled());
    };
    args.validate().map_err(|e| anyhow::anyhow!(e))?;
    if args.gc_lease_deletion_grace < MIN_SAFE_DELETION_GRACE {
        tracing::warn!(
            deletion_grace = ?args.gc_lease_deletion_grace,
            "--gc-lease-deletion-grace is shorter than kube-apiserver's 10s lease renew interval: an apiserver that re-creates its lease (it does around every restart) may lose its entries meanwhile"
        );
    }
    let identity = args.identity();
    let leader = LeaderConfig {
        lease_name: args.gc_leader_lease_name.clone(),
        namespace: args.leader_lease_namespace(),
        identity: identity.clone(),
        duration: args.gc_leader_lease_duration,
        grace: args.gc_leader_lease_grace,
    };
    let cfg = CollectorConfig {
        deletion_grace: args.gc_lease_deletion_grace,
        resync_interval: args.gc_resync_interval,
        concurrency: usize::from(args.gc_concurrency),
        expired_grace: args.gc_expired_lease_grace,
        dry_run: args.gc_dry_run,
        journal: Some(collector::JournalConfig {
            namespace: leader.namespace.clone(),
            name: collector::journal_name(&leader.lease_name),
        }),
    };
    tracing::info!(
        identity = %identity,
        leader_lease = %format!("{}/{}", leader.namespace, leader.lease_name),
        deletion_grace = ?cfg.deletion_grace,
        resync_interval = ?cfg.resync_interval,
        concurrency = cfg.concurrency,
        expired_lease_grace = ?cfg.expired_grace,
        dry_run = cfg.dry_run,
        "garbage collector starting"
    );
    let collector = Arc::new(Collector::new(
        client.clone(),
        leases,
        cfg,
        metrics.clone(),
        &identity,
    ));
    let svs = collector.sv_view();
    let (leading_tx, leading) = watch::channel(None);
    let task = crate::task::Owned::spawn("garbage collector", move |shutdown| {
        leader::run(client, leader, metrics, shutdown, leading_tx, move |term| {
            Arc::clone(&collector).lead(term)
        })
    });
    Ok(GcHandle {
        task,
        leading,
        identity: Some(identity),
        svs,
    })
}

impl GcHandle {
    /// A handle for `--no-gc`: never leads; shutdown returns at once.
    pub fn disabled() -> GcHandle {
        let (_, leading) = watch::channel(None);
        GcHandle {
            task: crate::task::Owned::none("garbage collector"),
            leading,
            identity: None,
            svs: watch::channel(None).1,
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.task.is_running()
    }

    /// True while this replica holds the leader Lease and collects.
    pub fn is_leading(&self) -> bool {
        self.leading
            .borrow()
            .as_ref()
            .is_some_and(|t| !t.is_cancelled())
    }

    /// This replica's identity in the leader Lease (None when disabled).
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// The leader's terms, for work that must run on one replica only (the migration trigger,
    /// the report): run it as a [`crate::leader_task::LeaderTask`], fenced by the same token as
    /// the collector.
    pub fn terms(&self) -> leader::Terms {
        self.leading.clone()
    }

    /// The collector's StorageVersion store while this replica leads (`None` otherwise): for
    /// other leader-only work that judges StorageVersions (the report) without a watch of its own.
    pub fn storage_versions(&self) -> watch::Receiver<Option<collector::SvView>> {
        self.svs.clone()
    }

    /// Stops collecting at once and releases the leader Lease (bounded in time), so another
    /// replica takes over without waiting for the Lease to expire.
    pub fn shutdown(self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.task.shutdown()
    }
}

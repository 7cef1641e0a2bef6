//! The simulated world around the webhook: kube-apiservers with lifecycles, the objects they
//! store, kube-controller-manager's storage-version migrator, the webhook replicas running the
//! real product code, the chaos that disturbs them, and the invariants (see `tests/sim.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use storageversion_webhook::gc::{self, GcArgs, GcHandle};
use storageversion_webhook::migrate::{self, MigrateArgs, MigrateHandle};
use storageversion_webhook::model::{ServerStorageVersion, StorageVersion};
use storageversion_webhook::rules::common::local_update;

use super::api::{self, lock, Cluster, Shared, SimBody, CR_GROUP, IDENTITY_LEASES, SVMS, SVS};
use super::custom::{CrdAction, CrdWorld, PLURALS};
use super::rng::Rng;

/// I1: a fresh entry a replica removed (the apiserver rewrote it unchanged just before the
/// write, so the resourceVersion did not stop it) must be back this soon.
pub const I1_GIVE_BACK: Duration = Duration::from_secs(20);
/// The collector's deletion grace (the default).
pub const GRACE: Duration = Duration::from_secs(30);
/// The trigger's settle time and interval (the defaults).
pub const SETTLE: Duration = Duration::from_secs(300);
pub const INTERVAL: Duration = Duration::from_secs(10);
/// I2: an entry whose lease is gone goes within the grace plus this, counted from the later of
/// the lease's deletion and the last disturbance of the webhook replicas (leader change,
/// partition, restart, watch lag or fault burst ending).
pub const I2_BOUND: Duration = Duration::from_secs(150);
/// I4: the trigger samples every INTERVAL (plus a LIST's latency): a disagreement shorter than
/// this may go unseen, so the settle check forgives those.
pub const SAMPLE_SLACK: Duration = Duration::from_secs(14);
/// I6: non-watch API calls by all replicas in any 60 s window are at most
/// `I6_PER_REPLICA` per running replica + `I6_PER_EVENT` per world event in the window
/// + `I6_PER_REMOVAL` per entry removed in it.
pub const I6_PER_REPLICA: usize = 60;
pub const I6_PER_EVENT: usize = 12;
pub const I6_PER_REMOVAL: usize = 16;

const IDENTITY_LEASE_SECONDS: i64 = 3600;
const RENEW: Duration = Duration::from_secs(10);
const REFRESH: Duration = Duration::from_secs(600);

/// The resources: StorageVersion name, and the version 1.36 / 1.37 encode. Both minors decode
/// both versions.
pub const RESOURCES: [(&str, &str, &str); 3] = [
    (
        "admissionregistration.k8s.io.mutatingadmissionpolicies",
        "admissionregistration.k8s.io/v1beta1",
        "admissionregistration.k8s.io/v1",
    ),
    (
        "admissionregistration.k8s.io.mutatingadmissionpolicybindings",
        "admissionregistration.k8s.io/v1beta1",
        "admissionregistration.k8s.io/v1",
    ),
    ("apps.deployments", "apps/v1", "apps/v1"),
];

fn encoding(minor: u32, r: usize) -> &'static str {
    if minor >= 37 {
        RESOURCES[r].2
    } else {
        RESOURCES[r].1
    }
}

fn decodable(r: usize) -> Vec<&'static str> {
    let mut v = vec![RESOURCES[r].1, RESOURCES[r].2];
    v.dedup();
    v
}

/// What can happen, at a time on the agenda.
#[derive(Clone, Debug)]
enum Action {
    ApiStart {
        i: usize,
        minor: u32,
        lease_in: Duration,
        write_in: Duration,
    },
    ApiLeaseUp {
        i: usize,
        gen: u64,
        write_in: Duration,
    },
    ApiRenew {
        i: usize,
        gen: u64,
    },
    ApiWriteEntries {
        i: usize,
        gen: u64,
    },
    ApiWriteObject {
        i: usize,
        gen: u64,
    },
    ApiLeaseGc {
        i: usize,
        gen: u64,
    },
    ApiStop {
        i: usize,
        graceful: bool,
    },
    ReplicaStart {
        r: usize,
    },
    ReplicaStop {
        r: usize,
    },
    Partition {
        r: usize,
        on: bool,
    },
    Lag {
        r: usize,
        lag: Duration,
    },
    Faults {
        error_pct: u64,
        slow_pct: u64,
        late_pct: u64,
    },
    DropWatches,
    Compact,
    Migrator,
    Chaos,
    Quiesce,
    Check,
    Crd(CrdAction),
}

struct ApiServer {
    id: String,
    minor: u32,
    up: bool,
    gen: u64,
}

struct Replica {
    identity: String,
    gc: Option<GcHandle>,
    mig: Option<MigrateHandle>,
    crd: Option<storageversion_webhook::crd::CrdHandle>,
    partitioned: bool,
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// Chaos runs this long; then the world quiesces for `quiet`.
    pub chaos: Duration,
    pub quiet: Duration,
    /// Kinds of chaos left out (`SVW_SIM_WITHOUT=flap,boundary`, to look past a known defect).
    pub without: Vec<String>,
    /// The world has CustomResourceDefinitions and the replicas run the CRD migrator
    /// (`sim/crd.rs`); off (`SVW_SIM_CRDS=0`) it is the world of the seeds found before them.
    pub crds: bool,
}

impl Plan {
    pub fn new(seed: u64) -> Plan {
        Plan {
            seed,
            // `SVW_SIM_CHAOS_HOURS` (`scripts/sim --hours H`): a longer world.
            chaos: Duration::from_secs(
                std::env::var("SVW_SIM_CHAOS_HOURS")
                    .ok()
                    .and_then(|h| h.parse::<u64>().ok())
                    .unwrap_or(2)
                    .saturating_mul(3600),
            ),
            quiet: Duration::from_secs(25 * 60),
            without: std::env::var("SVW_SIM_WITHOUT")
                .map(|w| w.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
            crds: std::env::var("SVW_SIM_CRDS").map_or(true, |v| v != "0"),
        }
    }
}

/// The outcome of one run.
pub struct Outcome {
    pub violations: Vec<String>,
    pub trace_hash: u64,
    pub trace_len: u64,
    pub trace_tail: Vec<String>,
    pub stats: String,
}

pub struct Sim {
    plan: Plan,
    rng: Rng,
    shared: Shared,
    apiservers: Vec<ApiServer>,
    replicas: Vec<Replica>,
    agenda: BTreeMap<(Duration, u64), Action>,
    seq: u64,
    quiet: bool,
    /// (sv, apiserver) -> when the apiserver wrote its entry.
    entry_written: BTreeMap<(String, String), Vec<Duration>>,
    /// resource index -> object name -> stored version.
    stored: Vec<BTreeMap<String, String>>,
    /// Last disturbance of the replicas (I2).
    disturbed: Duration,
    /// The longest watch lag set on any replica recently (the grace check allows for it).
    max_lag: Duration,
    lag_until: Duration,
    events: Vec<Duration>,
    checked_removals: usize,
    checked_writes: usize,
    checked_created: usize,
    /// I1: fresh entries a replica removed, to be back by the deadline.
    given_back: Vec<GiveBack>,
    /// Every collector term seen: (replica, start, end), sampled at each step from the
    /// replica's `GcHandle::terms()`.
    terms: Vec<(usize, Duration, Option<Duration>)>,
    /// The custom-resource side of the world (with `Plan::crds`).
    crd: Option<CrdWorld>,
    violations: Vec<String>,
}

/// A fresh entry a replica removed (I1): it must be back [`I1_GIVE_BACK`] after the removal if
/// the remover's term lasts that long, else that long after the start of a later term (which
/// reads the journal first), while its lease lives on.
struct GiveBack {
    at: Duration,
    replica: usize,
    sv: String,
    id: String,
    created: Duration,
    what: String,
}

impl Sim {
    pub fn new(plan: Plan) -> Sim {
        let rng = Rng::new(plan.seed);
        let shared = std::sync::Arc::new(std::sync::Mutex::new(Cluster::new(plan.seed)));
        Sim {
            rng,
            shared,
            apiservers: Vec::new(),
            replicas: Vec::new(),
            agenda: BTreeMap::new(),
            seq: 0,
            quiet: false,
            entry_written: BTreeMap::new(),
            stored: vec![BTreeMap::new(); RESOURCES.len()],
            disturbed: Duration::ZERO,
            max_lag: Duration::ZERO,
            lag_until: Duration::ZERO,
            events: Vec::new(),
            checked_removals: 0,
            checked_writes: 0,
            checked_created: 0,
            given_back: Vec::new(),
            terms: Vec::new(),
            crd: plan.crds.then(|| CrdWorld::new(plan.seed)),
            violations: Vec::new(),
            plan,
        }
    }

    fn at(&self) -> Duration {
        lock(&self.shared).at()
    }

    /// Schedules `a` after `d`, 125 ms into a half second: never on a point of the API
    /// server's grids, so the world and the API server never act at the same instant.
    fn after(&mut self, d: Duration, a: Action) {
        let t = self.at() + d;
        let t = Duration::from_millis(t.as_millis() as u64 / 500 * 500 + 125);
        self.seq += 1;
        self.agenda.insert((t, self.seq), a);
    }

    fn secs(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_secs(self.rng.range(lo, hi))
    }

    fn note(&self, line: String) {
        lock(&self.shared).note(format!("W {line}"));
    }

    /// Runs the whole plan on the current (paused, current-thread) runtime.
    pub async fn run(mut self) -> Outcome {
        tokio::spawn(api::process(self.shared.clone()));
        let n_api = self.rng.range(2, 4) as usize;
        let n_rep = self.rng.range(2, 3) as usize;
        for i in 0..n_api {
            self.apiservers.push(ApiServer {
                id: format!("apiserver-{}", (b'a' + i as u8) as char),
                minor: 36,
                up: false,
                gen: 0,
            });
            let lease_in = self.secs(1, 3);
            self.after(
                Duration::ZERO,
                Action::ApiStart {
                    i,
                    minor: 36,
                    lease_in,
                    write_in: Duration::from_secs(2),
                },
            );
        }
        for r in 0..n_rep {
            let identity = format!("svw-{r}");
            lock(&self.shared).identities.insert(r, identity.clone());
            self.replicas.push(Replica {
                identity,
                gc: None,
                mig: None,
                crd: None,
                partitioned: false,
            });
            self.after(Duration::from_secs(5), Action::ReplicaStart { r });
        }
        self.after(Duration::from_secs(5), Action::Migrator);
        if self.crd.is_some() {
            for plural in PLURALS {
                let plural = plural.to_string();
                self.after(
                    Duration::from_secs(3),
                    Action::Crd(CrdAction::Create { plural }),
                );
            }
            self.after(Duration::from_secs(10), Action::Crd(CrdAction::Write));
            self.after(Duration::from_secs(240), Action::Crd(CrdAction::Change));
        }
        self.after(Duration::from_secs(240), Action::Chaos);
        self.after(Duration::from_secs(5), Action::Check);
        let chaos = self.plan.chaos;
        self.after(chaos, Action::Quiesce);
        let end = chaos + self.plan.quiet;
        let start = lock(&self.shared).start;
        while let Some(((t, _), action)) = self.agenda.pop_first() {
            if t > end {
                break;
            }
            tokio::time::sleep_until(start + t).await;
            self.apply(action);
            self.check();
            if !self.violations.is_empty() {
                break;
            }
        }
        if self.violations.is_empty() {
            self.check_quiescence();
        }
        self.finish()
    }

    fn finish(self) -> Outcome {
        let c = lock(&self.shared);
        let stats = format!(
            "apiservers {}, replicas {}, api calls {}, writes {}, entries removed {}, migrations created {}, trace lines {}{}",
            self.apiservers.len(),
            self.replicas.len(),
            c.calls.len(),
            c.writes.len(),
            c.removals.len(),
            c.created.len(),
            c.trace.count,
            self.crd
                .as_ref()
                .map(|w| format!(", {}, CRD migrations begun {}", w.describe(), w.begins.len()))
                .unwrap_or_default()
        );
        Outcome {
            violations: self.violations.clone(),
            trace_hash: c.trace.hash,
            trace_len: c.trace.count,
            trace_tail: c.trace.lines.iter().cloned().collect(),
            stats,
        }
    }

    fn apply(&mut self, action: Action) {
        if !matches!(
            action,
            Action::Check
                | Action::Migrator
                | Action::ApiRenew { .. }
                | Action::Crd(CrdAction::Write)
        ) {
            self.note(format!("{action:?}"));
            let at = self.at();
            self.events.push(at);
        }
        match action {
            Action::ApiStart {
                i,
                minor,
                lease_in,
                write_in,
            } => {
                let s = &mut self.apiservers[i];
                s.gen += 1;
                s.minor = minor;
                s.up = false;
                let gen = s.gen;
                self.after(lease_in, Action::ApiLeaseUp { i, gen, write_in });
            }
            Action::ApiLeaseUp { i, gen, write_in } => {
                if self.apiservers[i].gen != gen {
                    return;
                }
                let id = self.apiservers[i].id.clone();
                {
                    let mut c = lock(&self.shared);
                    if c.get(IDENTITY_LEASES, &id).is_some() {
                        c.commit(IDENTITY_LEASES, &id, None);
                    }
                    c.commit(IDENTITY_LEASES, &id, Some(identity_lease(&id)));
                }
                self.apiservers[i].up = true;
                self.after(write_in, Action::ApiWriteEntries { i, gen });
                self.after(RENEW, Action::ApiRenew { i, gen });
                let w = self.secs(20, 300);
                self.after(w, Action::ApiWriteObject { i, gen });
                self.after(Duration::from_secs(3600), Action::ApiLeaseGc { i, gen });
            }
            Action::ApiRenew { i, gen } => {
                if self.apiservers[i].gen != gen || !self.apiservers[i].up {
                    return;
                }
                let id = self.apiservers[i].id.clone();
                {
                    let mut c = lock(&self.shared);
                    let lease = match c.get(IDENTITY_LEASES, &id) {
                        Some(l) => {
                            let mut l = l.clone();
                            l["spec"]["renewTime"] = json!(api::micro_now());
                            l
                        }
                        // Deleted by someone else: kube-apiserver creates it again.
                        None => identity_lease(&id),
                    };
                    c.commit(IDENTITY_LEASES, &id, Some(lease));
                }
                self.after(RENEW, Action::ApiRenew { i, gen });
            }
            Action::ApiWriteEntries { i, gen } => {
                if self.apiservers[i].gen != gen || !self.apiservers[i].up {
                    return;
                }
                self.write_entries(i);
                self.after(REFRESH, Action::ApiWriteEntries { i, gen });
            }
            Action::ApiWriteObject { i, gen } => {
                if self.apiservers[i].gen != gen || !self.apiservers[i].up {
                    return;
                }
                let r = self.rng.range(0, RESOURCES.len() as u64 - 1) as usize;
                let obj = format!("obj-{}", self.rng.range(0, 7));
                let v = encoding(self.apiservers[i].minor, r).to_string();
                self.note(format!(
                    "{} stores {}/{obj} as {v}",
                    self.apiservers[i].id, RESOURCES[r].0
                ));
                self.stored[r].insert(obj, v);
                let w = self.secs(20, 400);
                self.after(w, Action::ApiWriteObject { i, gen });
            }
            Action::ApiLeaseGc { i, gen } => {
                if self.apiservers[i].gen != gen || !self.apiservers[i].up {
                    return;
                }
                let mut c = lock(&self.shared);
                let now = k8s_openapi::jiff::Timestamp::now();
                let expired: Vec<String> = c
                    .table(IDENTITY_LEASES)
                    .into_iter()
                    .flat_map(|t| t.iter())
                    .filter(|(_, l)| {
                        l["spec"]["renewTime"]
                            .as_str()
                            .and_then(|r| r.parse::<k8s_openapi::jiff::Timestamp>().ok())
                            .and_then(|r| {
                                r.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                                    IDENTITY_LEASE_SECONDS,
                                ))
                                .ok()
                            })
                            .is_some_and(|until| until < now)
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in expired {
                    c.note(format!("W lease gc deletes expired {n}"));
                    c.commit(IDENTITY_LEASES, &n, None);
                }
                drop(c);
                self.after(Duration::from_secs(3600), Action::ApiLeaseGc { i, gen });
            }
            Action::ApiStop { i, graceful } => {
                let s = &mut self.apiservers[i];
                s.gen += 1;
                let was_up = s.up;
                s.up = false;
                let id = s.id.clone();
                if graceful && was_up {
                    let mut c = lock(&self.shared);
                    if c.get(IDENTITY_LEASES, &id).is_some() {
                        c.commit(IDENTITY_LEASES, &id, None);
                    }
                }
            }
            Action::ReplicaStart { r } => self.start_replica(r),
            Action::ReplicaStop { r } => {
                self.disturb();
                let rep = &mut self.replicas[r];
                let (g, m, k) = (rep.gc.take(), rep.mig.take(), rep.crd.take());
                tokio::spawn(async move {
                    if let Some(k) = k {
                        k.shutdown().await;
                    }
                    if let Some(m) = m {
                        m.shutdown().await;
                    }
                    if let Some(g) = g {
                        g.shutdown().await;
                    }
                });
            }
            Action::Partition { r, on } => {
                self.disturb();
                self.replicas[r].partitioned = on;
                let mut c = lock(&self.shared);
                if on {
                    c.partitioned.insert(r);
                    c.drop_watches(Some(r));
                } else {
                    c.partitioned.remove(&r);
                }
            }
            Action::Lag { r, lag } => {
                self.disturb();
                let at = self.at();
                if lag > Duration::ZERO {
                    self.max_lag = self.max_lag.max(lag);
                    self.lag_until = Duration::MAX;
                } else {
                    // Watches opened with a lag keep it until they end: forget it a while later.
                    self.lag_until = at + Duration::from_secs(600);
                }
                let mut c = lock(&self.shared);
                c.lag.insert(r, lag);
            }
            Action::Faults {
                error_pct,
                slow_pct,
                late_pct,
            } => {
                self.disturb();
                lock(&self.shared).faults = api::Faults {
                    error_pct,
                    slow_pct,
                    late_pct,
                };
            }
            Action::DropWatches => lock(&self.shared).drop_watches(None),
            Action::Compact => lock(&self.shared).compact(),
            Action::Migrator => {
                self.migrator();
                self.after(Duration::from_secs(5), Action::Migrator);
            }
            Action::Chaos => {
                if !self.quiet {
                    self.chaos();
                    let next = self.secs(20, 240);
                    self.after(next, Action::Chaos);
                }
            }
            Action::Quiesce => self.quiesce(),
            Action::Check => {
                self.after(Duration::from_secs(5), Action::Check);
            }
            Action::Crd(a) => {
                let quiet = self.quiet;
                let next = match self.crd.as_mut() {
                    Some(w) => w.apply(&mut lock(&self.shared), a, quiet),
                    None => Vec::new(),
                };
                for (d, a) in next {
                    self.after(d, Action::Crd(a));
                }
            }
        }
        if self.lag_until != Duration::MAX && self.at() > self.lag_until {
            self.max_lag = Duration::ZERO;
        }
    }

    fn disturb(&mut self) {
        self.disturbed = self.at();
    }

    fn write_entries(&mut self, i: usize) {
        let (id, minor) = (self.apiservers[i].id.clone(), self.apiservers[i].minor);
        let at = self.at();
        let mut c = lock(&self.shared);
        for (r, (name, _, _)) in RESOURCES.iter().enumerate() {
            let current = c.get(SVS, name).cloned().unwrap_or_else(|| {
                json!({"apiVersion": "internal.apiserver.k8s.io/v1alpha1", "kind": "StorageVersion",
                       "metadata": {"name": name}, "spec": {}, "status": {}})
            });
            let Ok(mut sv) = serde_json::from_value::<StorageVersion>(current) else {
                c.note(format!("W cannot decode StorageVersion {name}"));
                continue;
            };
            let entry: ServerStorageVersion = match serde_json::from_value(json!({
                "apiServerID": id,
                "encodingVersion": encoding(minor, r),
                "decodableVersions": decodable(r),
                "servedVersions": decodable(r),
            })) {
                Ok(e) => e,
                Err(_) => continue,
            };
            let before = sv.clone();
            local_update(&mut sv, entry, &api::now_text());
            // kube-apiserver does not write an update that changes nothing: the object keeps
            // its resourceVersion and no watch event is sent.
            if sv != before {
                let Ok(v) = serde_json::to_value(&sv) else {
                    continue;
                };
                c.commit(SVS, name, Some(v));
            }
            self.entry_written
                .entry((name.to_string(), id.clone()))
                .or_default()
                .push(at);
        }
    }

    fn start_replica(&mut self, r: usize) {
        self.disturb();
        let identity = self.replicas[r].identity.clone();
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<SimBody>>();
        let client = kube::Client::new(service, "default");
        tokio::spawn(api::accept(self.shared.clone(), r, handle));
        let args = GcArgs {
            gc_identity: Some(identity),
            gc_leader_lease_namespace: Some(api::LEADER_NS.to_string()),
            gc_lease_deletion_grace: GRACE,
            ..GcArgs::default()
        };
        let margs = MigrateArgs {
            migrate: true,
            migrate_settle: SETTLE,
            migrate_interval: INTERVAL,
            ..MigrateArgs::default()
        };
        let mut registry = Registry::default();
        let gc = match gc::spawn(client.clone(), args.clone(), &mut registry) {
            Ok(g) => g,
            Err(e) => {
                self.violations
                    .push(format!("cannot start replica {r}: {e}"));
                return;
            }
        };
        let mig = match migrate::spawn(client.clone(), &margs, &args, &gc, &mut registry) {
            Ok(m) => m,
            Err(e) => {
                self.violations
                    .push(format!("cannot start the trigger of replica {r}: {e}"));
                return;
            }
        };
        if let Some(w) = self.crd.as_ref() {
            match storageversion_webhook::crd::spawn(client, &w.args(), &args, &gc, &mut registry) {
                Ok(k) => self.replicas[r].crd = Some(k),
                Err(e) => {
                    self.violations
                        .push(format!("cannot start the CRD migrator of replica {r}: {e}"));
                    return;
                }
            }
        }
        self.replicas[r].gc = Some(gc);
        self.replicas[r].mig = Some(mig);
    }

    /// kube-controller-manager's storage-version migrator.
    fn migrator(&mut self) {
        let live: Vec<usize> = (0..self.apiservers.len())
            .filter(|i| self.apiservers[*i].up)
            .collect();
        let pick = self.rng.next();
        let mut c = lock(&self.shared);
        let now = c.at();
        let svms: Vec<(String, Value)> = c
            .table(SVMS)
            .into_iter()
            .flat_map(|t| t.iter())
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        for (name, mut m) in svms {
            let conds = m["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let has = |t: &str| {
                conds
                    .iter()
                    .any(|c| c["type"] == t && c["status"] == "True")
            };
            if has("Succeeded") || has("Failed") {
                continue;
            }
            let age = m["metadata"]["annotations"]["sim/created-at"]
                .as_str()
                .and_then(|a| a.parse::<u64>().ok());
            let Some(created) = age.or_else(|| {
                let a = now.as_secs();
                m["metadata"]["annotations"]["sim/created-at"] = json!(a.to_string());
                None
            }) else {
                c.commit(SVMS, &name, Some(m));
                continue;
            };
            let elapsed = now.as_secs().saturating_sub(created);
            let work = 10 + super::rng::fnv(name.as_bytes()) % 50;
            let custom = m["spec"]["resource"]["group"] == CR_GROUP;
            if !has("Running") && elapsed >= 3 {
                m["status"]["conditions"] = json!([{"type": "Running", "status": "True",
                    "lastTransitionTime": api::now_text(), "reason": "Running", "message": "migrating"}]);
                m["status"]["resourceVersion"] = json!(c.rv.to_string());
                if let (true, Some(w)) = (custom, self.crd.as_mut()) {
                    w.kcm_start(&mut c, &mut m);
                }
                c.commit(SVMS, &name, Some(m));
            } else if has("Running") && elapsed >= 3 + work && custom {
                if let Some(w) = self.crd.as_mut() {
                    w.kcm_finish(&mut c, &name, &mut m, self.quiet);
                    c.commit(SVMS, &name, Some(m));
                }
            } else if has("Running") && elapsed >= 3 + work {
                let Some(&i) = live.get((pick % live.len().max(1) as u64) as usize) else {
                    continue;
                };
                let group = m["spec"]["resource"]["group"].as_str().unwrap_or("");
                let resource = m["spec"]["resource"]["resource"].as_str().unwrap_or("");
                let sv = if group.is_empty() {
                    resource.to_string()
                } else {
                    format!("{group}.{resource}")
                };
                let Some(r) = RESOURCES.iter().position(|x| x.0 == sv) else {
                    continue;
                };
                let v = encoding(self.apiservers[i].minor, r).to_string();
                for stored in self.stored[r].values_mut() {
                    *stored = v.clone();
                }
                c.note(format!(
                    "W migrator rewrote {sv} as {v} through {}",
                    self.apiservers[i].id
                ));
                m["status"]["conditions"] = json!([
                    {"type": "Running", "status": "False", "lastTransitionTime": api::now_text(), "reason": "Done", "message": "done"},
                    {"type": "Succeeded", "status": "True", "lastTransitionTime": api::now_text(), "reason": "Succeeded", "message": "migrated"}]);
                c.commit(SVMS, &name, Some(m));
            }
        }
    }

    /// One random disturbance.
    fn chaos(&mut self) {
        let n = self.apiservers.len() as u64;
        let i = self.rng.range(0, n - 1) as usize;
        let r = self.rng.range(0, self.replicas.len() as u64 - 1) as usize;
        let minor = self.apiservers[i].minor;
        let other = if minor == 36 { 37 } else { 36 };
        let mut roll = self.rng.range(0, 99);
        let left_out = |k: &str| self.plan.without.iter().any(|w| w == k);
        if (48..=55).contains(&roll) && left_out("flap")
            || (56..=65).contains(&roll) && left_out("boundary")
        {
            roll = 0;
        }
        let back = self.secs(11, 31);
        let lease_in = self.secs(1, 3);
        let write_in = self.secs(1, 4);
        match roll {
            // A graceful restart, same minor.
            0..=19 => {
                self.after(Duration::ZERO, Action::ApiStop { i, graceful: true });
                self.after(
                    back,
                    Action::ApiStart {
                        i,
                        minor,
                        lease_in,
                        write_in,
                    },
                );
            }
            // Upgrade or rollback: a graceful restart at the other minor.
            20..=39 => {
                self.after(Duration::ZERO, Action::ApiStop { i, graceful: true });
                self.after(
                    back,
                    Action::ApiStart {
                        i,
                        minor: other,
                        lease_in,
                        write_in,
                    },
                );
            }
            // A crash: the lease stays; back after a while, or much later.
            40..=47 => {
                self.after(Duration::ZERO, Action::ApiStop { i, graceful: false });
                let later = if self.rng.chance(50) {
                    self.secs(20, 120)
                } else {
                    self.secs(600, 5400)
                };
                self.after(
                    later,
                    Action::ApiStart {
                        i,
                        minor,
                        lease_in,
                        write_in,
                    },
                );
            }
            // Flap: stop, back, stop again before the first deletion's grace ran out.
            48..=55 => {
                self.after(Duration::ZERO, Action::ApiStop { i, graceful: true });
                let b = self.secs(8, 14);
                self.after(
                    b,
                    Action::ApiStart {
                        i,
                        minor,
                        lease_in: Duration::from_secs(1),
                        write_in: Duration::from_secs(1),
                    },
                );
                let again = b + self.secs(4, 12);
                self.after(again, Action::ApiStop { i, graceful: true });
                let last = again + self.secs(40, 200);
                self.after(
                    last,
                    Action::ApiStart {
                        i,
                        minor,
                        lease_in,
                        write_in,
                    },
                );
            }
            // A restart landing right at the deletion-grace boundary (lease and entries within
            // a second of it).
            56..=65 => {
                self.after(Duration::ZERO, Action::ApiStop { i, graceful: true });
                let at = GRACE + Duration::from_millis(500 * self.rng.range(0, 8))
                    - Duration::from_secs(2);
                let lease_in = Duration::from_millis(500 * self.rng.range(1, 2));
                let write_in = Duration::from_millis(500 * self.rng.range(0, 1));
                self.after(
                    at,
                    Action::ApiStart {
                        i,
                        minor,
                        lease_in,
                        write_in,
                    },
                );
            }
            66..=73 => {
                let d = self.secs(20, 90);
                self.after(Duration::ZERO, Action::Partition { r, on: true });
                self.after(d, Action::Partition { r, on: false });
            }
            74..=79 => {
                self.after(Duration::ZERO, Action::ReplicaStop { r });
                let d = self.secs(5, 40);
                self.after(d, Action::ReplicaStart { r });
            }
            80..=84 => self.after(Duration::ZERO, Action::DropWatches),
            85..=88 => self.after(Duration::ZERO, Action::Compact),
            89..=93 => {
                let lag = self.secs(1, 20);
                let d = self.secs(60, 300);
                self.after(Duration::ZERO, Action::Lag { r, lag });
                self.after(
                    d,
                    Action::Lag {
                        r,
                        lag: Duration::ZERO,
                    },
                );
            }
            _ => {
                let d = self.secs(30, 120);
                self.after(
                    Duration::ZERO,
                    Action::Faults {
                        error_pct: 5,
                        slow_pct: 3,
                        late_pct: 10,
                    },
                );
                self.after(
                    d,
                    Action::Faults {
                        error_pct: 0,
                        slow_pct: 0,
                        late_pct: 0,
                    },
                );
            }
        }
    }

    /// Ends the chaos: every replica reachable and running, no faults, every apiserver up at
    /// 1.37 (one at a time), then the world runs quietly.
    fn quiesce(&mut self) {
        self.quiet = true;
        // Drop what chaos still had planned (starts and stops of apiservers, partitions...).
        self.agenda.retain(|_, a| {
            !matches!(
                a,
                Action::ApiStart { .. }
                    | Action::ApiStop { .. }
                    | Action::Partition { .. }
                    | Action::Lag { .. }
                    | Action::Faults { .. }
                    | Action::ReplicaStart { .. }
                    | Action::ReplicaStop { .. }
                    | Action::Chaos
            )
        });
        {
            let mut c = lock(&self.shared);
            c.faults = api::Faults::default();
            c.partitioned.clear();
            c.lag.clear();
        }
        self.lag_until = self.at() + Duration::from_secs(600);
        for r in 0..self.replicas.len() {
            self.replicas[r].partitioned = false;
            if self.replicas[r].gc.is_none() {
                self.after(Duration::from_secs(1), Action::ReplicaStart { r });
            }
        }
        self.disturb();
        for i in 0..self.apiservers.len() {
            let t = Duration::from_secs(40 * i as u64 + 1);
            self.after(t, Action::ApiStop { i, graceful: true });
            self.after(
                t + Duration::from_secs(15),
                Action::ApiStart {
                    i,
                    minor: 37,
                    lease_in: Duration::from_secs(2),
                    write_in: Duration::from_secs(2),
                },
            );
        }
    }

    // ------------------------------------------------------------ checks --

    fn fail(&mut self, what: String) {
        self.note(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    /// Samples each replica's collector term (I1's deadline across terms).
    fn sample_terms(&mut self, now: Duration) {
        for (r, rep) in self.replicas.iter().enumerate() {
            let leading = rep.gc.as_ref().is_some_and(|g| {
                g.terms()
                    .borrow()
                    .as_ref()
                    .is_some_and(|t| !t.is_cancelled())
            });
            let open = self
                .terms
                .iter_mut()
                .find(|(tr, _, end)| *tr == r && end.is_none());
            match (open, leading) {
                (Some(t), false) => t.2 = Some(now),
                (None, true) => self.terms.push((r, now, None)),
                _ => {}
            }
        }
    }

    /// Whether a term had [`I1_GIVE_BACK`] to give back what `g` removed: the remover's own
    /// term from the removal on, or a later term (any replica) from its start.
    fn had_time(&self, g: &GiveBack, now: Duration) -> bool {
        self.terms.iter().any(|&(r, start, end)| {
            let from = if r == g.replica && start <= g.at {
                g.at
            } else if start > g.at {
                start
            } else {
                return false;
            };
            end.unwrap_or(now) >= from + I1_GIVE_BACK
        })
    }

    fn check(&mut self) {
        let now = self.at();
        self.sample_terms(now);
        let c = lock(&self.shared);
        let mut found = Vec::new();
        if let Some(u) = c.unknown.first() {
            found.push(format!(
                "the simulation got a request it does not model: {u}"
            ));
        }
        let life = |id: &str| c.lease_life.get(id).cloned().unwrap_or_default();
        // I1 (and the grace): removals by replicas.
        for rm in &c.removals[self.checked_removals..] {
            let lives = life(&rm.id);
            if let Some((created, _)) = lives
                .iter()
                .find(|(s, e)| *s <= rm.at && e.is_none_or(|e| e > rm.at))
            {
                let fresh = self
                    .entry_written
                    .get(&(rm.sv.clone(), rm.id.clone()))
                    .is_some_and(|w| w.iter().any(|w| w >= created && *w <= rm.at));
                if fresh {
                    self.given_back.push(GiveBack {
                        at: rm.at,
                        replica: rm.replica,
                        sv: rm.sv.clone(),
                        id: rm.id.clone(),
                        created: *created,
                        what: format!(
                            "I1: replica {} removed the entry of {} from {} at {:?}, written after its lease was created at {:?}, and it is not back {I1_GIVE_BACK:?} into a term (the remover's, or a later one that read the journal) while that lease exists",
                            rm.replica, rm.id, rm.sv, rm.at, created
                        ),
                    });
                }
            }
            // A watch lagging by L may hide a return in the last L seconds; one before that
            // the collector could see.
            let Some(confirmed) = rm.confirmed else {
                found.push(format!(
                    "I1 (grace): replica {} removed the entry of {} from {} at {:?} without ever getting NotFound for its lease",
                    rm.replica, rm.id, rm.sv, rm.at
                ));
                continue;
            };
            let from = confirmed.saturating_sub(GRACE);
            let to = confirmed.saturating_sub(self.max_lag);
            if let Some((s, e)) = lives
                .iter()
                .rev()
                .filter(|(s, e)| *e != Some(*s))
                .find(|(s, e)| *s <= to && e.is_none_or(|e| e > from))
            {
                found.push(format!(
                    "I1 (grace): replica {} removed the entry of {} from {} at {:?} on a NotFound at {:?}, but its lease existed from {:?} to {:?}, within the {:?} grace before that (a return in the last {:?} may be hidden by watch lag)",
                    rm.replica, rm.id, rm.sv, rm.at, confirmed, s, e, GRACE, self.max_lag
                ));
            }
        }
        // I1: a fresh entry removed must be back by its deadline while its lease lives on.
        let mut waiting = Vec::new();
        for g in std::mem::take(&mut self.given_back) {
            let same_lease = life(&g.id)
                .last()
                .is_some_and(|(s, e)| *s == g.created && e.is_none());
            if !same_lease {
                continue;
            }
            if !self.had_time(&g, now) {
                waiting.push(g);
                continue;
            }
            let back = c.get(SVS, &g.sv).is_some_and(|o| {
                o["status"]["storageVersions"]
                    .as_array()
                    .is_some_and(|es| es.iter().any(|e| e["apiServerID"] == g.id.as_str()))
            });
            if !back {
                found.push(g.what);
            }
        }
        self.given_back = waiting;
        // I2: entries of leases gone too long.
        if !self.quiet || now > self.disturbed + Duration::from_secs(60) {
            for (name, sv) in c.table(SVS).into_iter().flatten() {
                for e in sv["status"]["storageVersions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let Some(id) = e["apiServerID"].as_str() else {
                        continue;
                    };
                    let lives = life(id);
                    let gone_since = match lives.last() {
                        Some((_, Some(end))) => *end,
                        None => Duration::ZERO,
                        Some((_, None)) => continue,
                    };
                    let from = gone_since.max(self.disturbed);
                    let any_replica = self
                        .replicas
                        .iter()
                        .any(|r| r.gc.is_some() && !r.partitioned);
                    if any_replica && now > from + GRACE + I2_BOUND {
                        found.push(format!(
                            "I2: the entry of {id} in {name} is still there at {now:?}; its lease is gone since {gone_since:?} (last disturbance {:?}, bound grace {GRACE:?} + {I2_BOUND:?})",
                            self.disturbed
                        ));
                    }
                }
            }
        }
        // I3: writes by replicas that did not lead.
        for w in &c.writes[self.checked_writes..] {
            let me = c.identities.get(&w.replica);
            if w.leader.as_ref() != me {
                found.push(format!(
                    "I3: replica {} ({:?}) sent {} (applied at {:?}, leader then {:?}) while the leader Lease named {:?}",
                    w.replica, me, w.what, w.at, w.leader_applied, w.leader
                ));
            }
        }
        // I4: migrations created.
        for m in c.created[self.checked_created..]
            .iter()
            .filter(|m| m.crd.is_empty())
        {
            let history = c.agreement.get(&m.sv).cloned().unwrap_or_default();
            let want = Some(m.version.clone());
            let window_from = m.at.saturating_sub(SETTLE) + SAMPLE_SLACK;
            // Every stretch of the window in which the entries did not all encode (and decode)
            // the version, longer than the slack, is a violation.
            let mut bad: Option<(Duration, Duration)> = None;
            for (k, (t, a)) in history.iter().enumerate() {
                let end = history.get(k + 1).map_or(m.at, |n| n.0).min(m.at);
                let start = (*t).max(window_from.saturating_sub(SAMPLE_SLACK));
                if *a != want
                    && end > start
                    && end > window_from.saturating_sub(SAMPLE_SLACK)
                    && end - start >= SAMPLE_SLACK
                {
                    bad = Some((start, end));
                }
            }
            if let Some((s, e)) = bad {
                found.push(format!(
                    "I4: migration {} of {} to {} created at {:?}, but the entries did not all agree on (and decode) it from {:?} to {:?}, within the settle time {:?}",
                    m.name, m.sv, m.version, m.at, s, e, SETTLE
                ));
            }
            if let Some(prev) = c
                .created
                .iter()
                .rev()
                .find(|p| p.sv == m.sv && p.version == m.version && p.at < m.at)
            {
                // Another version in effect when the first was created counts too: objects
                // could be written in it after the first migration began (its rewrite had
                // already listed them, or had not started).
                let at_first = history
                    .iter()
                    .rev()
                    .find(|(t, _)| *t <= prev.at)
                    .is_some_and(|(_, a)| *a != want);
                let changed = at_first
                    || history
                        .iter()
                        .any(|(t, a)| *t > prev.at && *t <= m.at && *a != want);
                if !changed {
                    found.push(format!(
                        "I4: migration {} of {} to {} created at {:?}, the same need as {} created at {:?} (no entry encoded another version when it was created or since)",
                        m.name, m.sv, m.version, m.at, prev.name, prev.at
                    ));
                }
            }
        }
        // I6: API calls in the last minute.
        let minute = Duration::from_secs(60);
        let since = now.saturating_sub(minute);
        let calls = c
            .calls
            .iter()
            .rev()
            .take_while(|(t, _)| *t >= since)
            .count();
        let events = self
            .events
            .iter()
            .rev()
            .take_while(|t| **t >= since)
            .count();
        let removals = c
            .removals
            .iter()
            .rev()
            .take_while(|r| r.at >= since)
            .count();
        let running = self
            .replicas
            .iter()
            .filter(|r| r.gc.is_some())
            .count()
            .max(1);
        let migrations = self.crd.as_ref().map_or(0, |w| w.allowance(now));
        let bound = I6_PER_REPLICA * running
            + I6_PER_EVENT * events
            + I6_PER_REMOVAL * removals
            + migrations;
        if calls > bound {
            found.push(format!(
                "I6: {calls} API calls in the minute before {now:?}, over the bound {bound} ({running} replicas, {events} world events, {removals} removals, CRD migrations' allowance {migrations})"
            ));
        }
        if let Some(w) = self.crd.as_mut() {
            found.extend(w.check(&c));
        }
        let (nr, nw, nc) = (c.removals.len(), c.writes.len(), c.created.len());
        drop(c);
        self.checked_removals = nr;
        self.checked_writes = nw;
        self.checked_created = nc;
        for f in found {
            self.fail(f);
        }
    }

    /// I5 and a last I2, once the world has been quiet.
    fn check_quiescence(&mut self) {
        let c = lock(&self.shared);
        let mut found = Vec::new();
        // `audit`'s verdict on the same cluster (its pure judgement, on what the API holds).
        let cms = format!("/api/v1/namespaces/{}/configmaps", crate::api::LEADER_NS);
        let memory: storageversion_webhook::migrate::state::Memory = c
            .get(&cms, "storageversion-webhook-migrate")
            .and_then(|cm| cm["data"].as_object().cloned())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                let record =
                    storageversion_webhook::migrate::state::parse(v.as_str().unwrap_or(""));
                (k, record)
            })
            .collect();
        let all_svs: Vec<storageversion_webhook::model::StorageVersion> = c
            .table(SVS)
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| serde_json::from_value(v.clone()).ok())
            .collect();
        let all_svms: Vec<storageversion_webhook::migrate::svm::StorageVersionMigration> = c
            .table(SVMS)
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| serde_json::from_value(v.clone()).ok())
            .collect();
        let audit_lists: BTreeSet<String> = storageversion_webhook::migrate::audit::judge(
            &all_svs,
            &memory,
            &all_svms,
            storageversion_webhook::migrate::svm::ApiVersion::V1,
        )
        .into_iter()
        .map(|s| s.storage_version)
        .collect();
        for (r, (name, _, _)) in RESOURCES.iter().enumerate() {
            let Some(sv) = c.get(SVS, name) else {
                found.push(format!("I5: no StorageVersion {name} at quiescence"));
                continue;
            };
            let entries = sv["status"]["storageVersions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let versions: BTreeSet<&str> = entries
                .iter()
                .filter_map(|e| e["encodingVersion"].as_str())
                .collect();
            if versions.len() != 1 {
                found.push(format!(
                    "I5: the entries of {name} do not agree at quiescence: {versions:?}"
                ));
                continue;
            }
            let agreed = versions.iter().next().copied().unwrap_or_default();
            let pending = c.table(SVMS).into_iter().flatten().any(|(_, m)| {
                let sv_name = format!(
                    "{}.{}",
                    m["spec"]["resource"]["group"].as_str().unwrap_or(""),
                    m["spec"]["resource"]["resource"].as_str().unwrap_or("")
                );
                let conds = m["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let done = conds.iter().any(|c| {
                    (c["type"] == "Succeeded" || c["type"] == "Failed") && c["status"] == "True"
                });
                sv_name == *name && !done
            });
            let old: Vec<String> = self.stored[r]
                .iter()
                .filter(|(_, v)| v.as_str() != agreed)
                .map(|(o, v)| format!("{o} as {v}"))
                .collect();
            if !old.is_empty() && !pending {
                found.push(format!(
                    "I5: at quiescence every apiserver encodes {name} as {agreed}, no migration of it is pending, yet stored objects are in another version: {}",
                    old.join(", ")
                ));
            }
            // audit says the same: it lists the resource exactly when objects are in another
            // version or a migration of it is pending.
            let listed = audit_lists.contains(*name);
            if !old.is_empty() && !listed {
                found.push(format!(
                    "I5: audit calls {name} clean at quiescence, yet stored objects are in another version: {}",
                    old.join(", ")
                ));
            }
            if listed && old.is_empty() && !pending && memory.contains_key(*name) {
                found.push(format!(
                    "I5: audit lists {name} at quiescence, yet every stored object is in {agreed} and no migration of it is pending (record {:?})",
                    memory.get(*name)
                ));
            }
        }
        if let Some(w) = self.crd.as_ref() {
            found.extend(w.check_quiescence(&c, &super::custom::memory(&c)));
        }
        drop(c);
        for f in found {
            self.fail(f);
        }
    }
}

fn identity_lease(id: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": id, "namespace": "kube-system",
                     "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver"}},
        "spec": {"holderIdentity": id, "leaseDurationSeconds": IDENTITY_LEASE_SECONDS,
                 "renewTime": api::micro_now()}
    })
}

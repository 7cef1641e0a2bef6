//! The situation StorageVersion exists for: an HA control plane (three kube-apiservers sharing one
//! etcd, each with its own hostname and identity lease, behind a loopback load balancer) in the
//! middle of a rolling upgrade between two Kubernetes minors, 1.36 -> 1.37. The webhook is
//! registered fail-closed (`failurePolicy: Fail`) in `deny` mode; a recorder lists every
//! StorageVersion every 250 ms throughout and writes a timeline (JSON, and a PNG of ours next to
//! upstream's) to `target/upgrade-timeline/`.
//!
//! Run alone: `cargo test --test e2e_upgrade -- --nocapture` (one test: add its name).
//! See docs/ha-upgrade.md.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use support::ha::timeline::{Timeline, OURS_TITLE, UPSTREAM_TITLE};
use support::ha::*;
use support::*;

/// Objects drawn in the picture and whose every status change is checked.
const INTEREST: [&str; 2] = [MAP, MAPB];
/// How long after an upgrade step the cluster must accept a ConfigMap write.
const WRITE_WITHIN: Duration = Duration::from_secs(30);
/// The collector's default deletion grace (`--gc-lease-deletion-grace`), and a margin.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
const PAST_GRACE: Duration = Duration::from_secs(36);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Collector {
    /// `serve` with its collector (default flags).
    Ours,
    /// `serve --no-gc` and kube-controller-manager's storage-version-gc.
    Upstream,
    /// Two `serve` replicas; the collecting leader is killed after the first step.
    OursTwoReplicas,
}

/// What one rolling upgrade produced.
#[derive(Clone, Debug)]
struct UpgradeRun {
    timeline: Timeline,
    /// The objects once the upgrade settled, past the collector's grace.
    final_objects: BTreeMap<String, String>,
    /// MAP's commonEncodingVersion after each stage settled (all old, 1, 2, 3 upgraded).
    map_commons: Vec<Option<String>>,
    /// Time from each step's end to the first accepted ConfigMap write.
    write_after_step: Vec<Duration>,
    denied: f64,
    reviews: f64,
    denial_lines: Vec<String>,
    condition_violations: Vec<String>,
    /// Two replicas: seconds from killing the leader to the other one leading.
    takeover: Option<f64>,
}

static OURS: tokio::sync::OnceCell<UpgradeRun> = tokio::sync::OnceCell::const_new();

async fn ours() -> &'static UpgradeRun {
    OURS.get_or_init(|| run_upgrade(Collector::Ours)).await
}

/// Waits until every object's entries are exactly those of the running apiservers that serve its
/// resource (entries of a running apiserver for a resource its minor no longer serves may stay),
/// and MAP/MAPB entries are encoded as each apiserver's minor encodes them.
async fn settle(
    ha: &Ha,
    rec: &Recorder,
    served: &BTreeMap<String, BTreeSet<String>>,
    stage: &str,
) -> Snapshot {
    settle_within(ha, rec, served, stage, Duration::from_secs(90), false).await
}

/// `settle`, bounded by `within`. With `lossy` (upstream's collector, which can strip a restarted
/// apiserver's entries until that apiserver's 10-minute refresh), running out of time is what
/// upstream does, recorded in the timeline, not a failure: the latest snapshot is returned.
async fn settle_within(
    ha: &Ha,
    rec: &Recorder,
    served: &BTreeMap<String, BTreeSet<String>>,
    stage: &str,
    within: Duration,
    lossy: bool,
) -> Snapshot {
    let versions = ha.versions();
    let running: BTreeSet<usize> = (0..ha.n).filter(|i| !versions[*i].is_empty()).collect();
    let mut last_problem = String::new();
    let result = rec
        .wait_for(stage, within, |s| {
            let unknown = s.unknown_ids();
            if !unknown.is_empty() {
                last_problem = format!("entries of unknown apiservers {unknown:?}");
                return false;
            }
            for name in s.objects.keys() {
                let have = s.entries_of(name);
                if !have.is_subset(&running) {
                    last_problem = format!("{name}: entries {have:?}, running {running:?}");
                    return false;
                }
                for i in &running {
                    let serves = served
                        .get(&versions[*i])
                        .is_some_and(|set| set.contains(name));
                    if serves && !have.contains(i) {
                        last_problem =
                            format!("{name}: no entry of apiserver {i} ({})", versions[*i]);
                        return false;
                    }
                }
            }
            // The encodings of the upgrade's two minors; another minor (scripts/matrix runs
            // `leaving_and_crashing_apiservers` on each) may not serve these resources at all.
            let upgrade_pair = running
                .iter()
                .all(|i| versions[*i] == OLD || versions[*i] == NEW);
            for name in INTEREST.iter().filter(|_| upgrade_pair) {
                let Some(sv) = s.objects.get(*name) else {
                    last_problem = format!("no {name}");
                    return false;
                };
                for e in &sv.status.storage_versions {
                    let Some(i) = s.index_of.get(&e.api_server_id) else {
                        continue;
                    };
                    let want = if versions[*i] == OLD { "v1beta1" } else { "v1" };
                    if !e.encoding_version.ends_with(&format!("/{want}")) {
                        last_problem = format!(
                            "{name}: apiserver {i} ({}) encodes {}",
                            versions[*i], e.encoding_version
                        );
                        return false;
                    }
                }
            }
            true
        })
        .await;
    match result {
        Ok(s) => {
            rec.event(None, "settled", stage);
            s
        }
        Err(e) => match rec.latest() {
            Some(s) if lossy => {
                rec.event(None, "not settled (upstream)", stage);
                eprintln!("{stage}: upstream's collector left it unsettled: {last_problem}");
                s
            }
            _ => panic!("{e}: {last_problem}"),
        },
    }
}

/// Creates a ConfigMap through the load balancer, retrying until it is accepted; how long it
/// took.
async fn write_configmap(ha: &Ha, name: &str) -> Duration {
    let api: Api<ConfigMap> = Api::namespaced(ha.cp.client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"step": name}
    }))
    .expect("configmap");
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < WRITE_WITHIN {
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return start.elapsed(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("ConfigMap {name} not accepted within {WRITE_WITHIN:?}: {last}");
}

/// Holder of the collector's leader Lease (`default/storageversion-webhook-gc`).
async fn gc_leader(ha: &Ha) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(ha.cp.client.clone(), "default");
    api.get_opt("storageversion-webhook-gc")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

/// The whole rolling upgrade with `collector`, from three 1.36 apiservers to three 1.37 ones.
async fn run_upgrade(collector: Collector) -> UpgradeRun {
    let t0 = Instant::now();
    let ha = Ha::up(3, OLD).await;
    let certs = Certs::generate();
    let mut hooks = Vec::new();
    match collector {
        Collector::Ours => {
            hooks.push(Webhook::start(&ha.cp, &certs, &["--enforcement=deny"]).await);
        }
        Collector::Upstream => {
            hooks.push(Webhook::start(&ha.cp, &certs, &["--enforcement=deny", "--no-gc"]).await);
            gc::kcm_start(&ha.cp, &[&format!("--master={}", ha.lb.url())]);
        }
        Collector::OursTwoReplicas => {
            for r in 0..2 {
                let id = format!("--gc-identity=replica-{r}");
                hooks.push(Webhook::start(&ha.cp, &certs, &["--enforcement=deny", &id]).await);
            }
        }
    }
    // The webhook replicas behind their own load balancer, like a Service.
    let hook_lb = LoadBalancer::start(hooks.iter().map(|h| h.addr).collect());
    register_webhook(
        &ha.cp,
        &format!("https://{}/validate", hook_lb.addr),
        &certs.ca_pem,
        "Fail",
    )
    .await;
    let name = match collector {
        Collector::Upstream => "kube-controller-manager storage-version-gc",
        _ => "storageversion-webhook",
    };
    let rec = Recorder::start(ha.cp.client.clone(), name, ha.n, OLD, &INTEREST);
    eprintln!(
        "{collector:?}: control plane and webhook up in {:?}",
        t0.elapsed()
    );

    let lossy = collector == Collector::Upstream;
    let settle_time = if lossy {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(90)
    };
    let mut served = BTreeMap::new();
    served.insert(OLD.to_string(), ha.served_by(0).await);
    let mut map_commons = Vec::new();
    let s = settle(&ha, &rec, &served, "all at 1.36").await;
    map_commons.push(s.common(MAP));
    let mut write_after_step = Vec::new();
    let mut takeover_task = None;
    for i in 0..ha.n {
        if collector == Collector::OursTwoReplicas && i == 1 {
            // In the middle of the upgrade: kill the collecting leader.
            let leader = gc_leader(&ha).await.unwrap_or_default();
            let k = usize::from(leader.starts_with("replica-1"));
            assert!(leader.starts_with("replica-"), "leader {leader:?}");
            hooks[k].kill();
            rec.event(None, "leader killed", &leader);
            let client = ha.cp.client.clone();
            let killed_at = Instant::now();
            takeover_task = Some(tokio::spawn(async move {
                let api: Api<Lease> = Api::namespaced(client, "default");
                let other = format!("replica-{}", 1 - k);
                loop {
                    if let Ok(Some(l)) = api.get_opt("storageversion-webhook-gc").await {
                        let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                        if holder.starts_with(&other) {
                            return Some(killed_at.elapsed().as_secs_f64());
                        }
                    }
                    if killed_at.elapsed() > Duration::from_secs(90) {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }));
        }
        ha.upgrade(&rec, i, NEW).await;
        let took = write_configmap(&ha, &format!("after-step-{i}")).await;
        rec.event(None, "configmap written", &format!("{took:?}"));
        write_after_step.push(took);
        if !served.contains_key(NEW) {
            served.insert(NEW.to_string(), ha.served_by(i).await);
        }
        let s = settle_within(
            &ha,
            &rec,
            &served,
            &format!("{} of 3 at 1.37", i + 1),
            settle_time,
            lossy,
        )
        .await;
        map_commons.push(s.common(MAP));
    }
    // Past the collector's grace after the last lease deletion (the last apiserver deletes its
    // lease when it starts): nothing may go any more.
    let last_start = rec.last_event("start").expect("a start event");
    let wait = last_start + PAST_GRACE.as_secs_f64() - rec.now();
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
    let s = settle_within(&ha, &rec, &served, "past the grace", settle_time, lossy).await;
    assert!(rec.now() - last_start >= DEFAULT_GRACE.as_secs_f64());
    let final_objects = normalized(&s);
    let takeover = match takeover_task {
        Some(t) => t.await.expect("takeover task"),
        None => None,
    };

    let mut condition_violations = Vec::new();
    for name in INTEREST {
        condition_violations.extend(condition_violations_of(name, &rec.history(name)));
    }
    let timeline = rec.finish().await;
    let mut denied = 0.0;
    let mut reviews = 0.0;
    for h in &mut hooks {
        if h.child.try_wait().ok().flatten().is_some() {
            continue; // the killed replica
        }
        let m = h.metrics().await;
        let name = "storageversion_webhook_admission_reviews_total";
        denied += metric_sum(&m, name, &["verdict=\"denied\""]);
        reviews += metric_sum(&m, name, &[]);
    }
    let denial_lines = denial_lines(&ha.apiserver_logs(), WEBHOOK_NAME);
    eprintln!(
        "{collector:?}: upgrade done in {:?}; {} polls, {} errors, longest gap {:.2}s",
        t0.elapsed(),
        timeline.polls,
        timeline.poll_errors,
        timeline.max_poll_gap
    );
    UpgradeRun {
        timeline,
        final_objects,
        map_commons,
        write_after_step,
        denied,
        reviews,
        denial_lines,
        condition_violations,
        takeover,
    }
}

fn condition_violations_of(
    name: &str,
    history: &[(f64, storageversion_webhook::model::StorageVersionStatus)],
) -> Vec<String> {
    condition_violations(name, history)
}

/// Assertions shared by every run with our collector.
fn assert_ours_kept_everything(run: &UpgradeRun) {
    assert_eq!(
        run.denied, 0.0,
        "the webhook denied apiserver writes ({} reviews)",
        run.reviews
    );
    assert!(run.reviews > 0.0, "the webhook saw no reviews");
    assert!(
        run.denial_lines.is_empty(),
        "apiserver logs show failed StorageVersion writes:\n{}",
        run.denial_lines.join("\n")
    );
    let lost = losses(&run.timeline);
    assert!(
        lost.is_empty(),
        "entries went missing after they appeared: {lost:#?}"
    );
    let deleted = deletions(&run.timeline);
    assert!(deleted.is_empty(), "StorageVersions deleted: {deleted:?}");
    assert!(
        run.condition_violations.is_empty(),
        "conditions differ from upstream's computation:\n{}",
        run.condition_violations.join("\n")
    );
    assert_eq!(
        run.map_commons,
        vec![
            Some(MAP_V1BETA1.to_string()),
            None,
            None,
            Some(MAP_V1.to_string())
        ],
        "{MAP} commonEncodingVersion: v1beta1 before, absent while mixed, v1 at the end"
    );
    // Listings are started every 250 ms; one can fail when an apiserver's connection closes
    // under it (it is retried on the next tick). Bounded, not tight: the machine is shared.
    assert!(
        run.timeline.max_poll_gap < 5.0,
        "the recorder went {:.2}s without a listing",
        run.timeline.max_poll_gap
    );
}

/// Test 1: rolling upgrade 1.36 -> 1.37 of three apiservers with our collector.
#[tokio::test(flavor = "multi_thread")]
async fn rolling_upgrade_keeps_every_entry() {
    let _serial = serial().await;
    let run = ours().await;
    eprintln!(
        "ConfigMap write after each step: {:?}; MAP common per stage: {:?}",
        run.write_after_step, run.map_commons
    );
    run.timeline
        .write_json(&out_dir().join("ours.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ours_kept_everything(run);
}

/// Test 2: the same upgrade with kube-controller-manager's storage-version-gc instead of ours:
/// records what upstream loses, and asserts ours keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_gc_loses_what_ours_keeps() {
    let _serial = serial().await;
    let up = run_upgrade(Collector::Upstream).await;
    let ours = ours().await;
    let dir = out_dir();
    up.timeline
        .write_json(&dir.join("upstream.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    ours.timeline
        .write_json(&dir.join("ours.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    let up_lost = losses(&up.timeline);
    let recreated = deletions(&up.timeline);
    // What upstream did, for the record (docs/ha-upgrade.md quotes it).
    let mut per_apiserver: BTreeMap<Option<usize>, (usize, f64, usize)> = BTreeMap::new();
    for l in &up_lost {
        let e = per_apiserver.entry(l.apiserver).or_default();
        e.0 += 1;
        match l.to {
            Some(to) => e.1 = e.1.max(to - l.from),
            None => e.2 += 1,
        }
    }
    eprintln!(
        "upstream: {} entries lost after they appeared, {} objects deleted; per apiserver (lost, longest gap s, never back): {per_apiserver:?}",
        up_lost.len(),
        recreated.len()
    );
    let summary = serde_json::json!({
        "upstream_losses": up_lost,
        "upstream_deleted_objects": recreated.iter().map(|o| (&o.object, o.t)).collect::<Vec<_>>(),
        "upstream_denied": up.denied,
        "ours_losses": losses(&ours.timeline),
        "ours_write_after_step_ms": ours.write_after_step.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        "upstream_write_after_step_ms": up.write_after_step.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
    });
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary).expect("json"),
    )
    .expect("write summary.json");
    let png = dir.join("upgrade-timeline.png");
    support::ha::timeline::render_png(
        &[(OURS_TITLE, &ours.timeline), (UPSTREAM_TITLE, &up.timeline)],
        &png,
        1600,
        620,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("timeline picture: {}", png.display());

    // Our collector keeps every entry upstream loses.
    let ours_lost: BTreeSet<(String, Option<usize>)> = losses(&ours.timeline)
        .into_iter()
        .map(|l| (l.object, l.apiserver))
        .collect();
    for l in &up_lost {
        assert!(
            !ours_lost.contains(&(l.object.clone(), l.apiserver)),
            "our collector also lost {l:?}"
        );
    }
    assert!(ours_lost.is_empty(), "ours lost {ours_lost:?}");
    // The webhook denies nothing here either.
    assert_eq!(
        up.denied, 0.0,
        "the webhook denied writes beside upstream's GC"
    );
}

/// Test 3: an apiserver stopped for good loses its entries after the grace, the others keep
/// theirs; one killed with SIGKILL keeps its entries while its lease is unexpired, and with
/// `--gc-expired-lease-grace` they go once the lease has expired for that long. On a minor whose
/// graceful stop leaves the identity lease (1.34; `scripts/matrix` runs this test on each minor)
/// the stopped apiserver is a crashed one to the collector, and its lease is expired the same way.
#[tokio::test(flavor = "multi_thread")]
async fn leaving_and_crashing_apiservers() {
    let _serial = serial().await;
    let t0 = Instant::now();
    let minor = tested_minor();
    let ha = Ha::up(3, &minor).await;
    let certs = Certs::generate();
    let expired_grace = Duration::from_secs(10);
    let hook = Webhook::start(
        &ha.cp,
        &certs,
        &[
            "--enforcement=deny",
            &format!("--gc-expired-lease-grace={}s", expired_grace.as_secs()),
        ],
    )
    .await;
    register_webhook(&ha.cp, &hook.url(), &certs.ca_pem, "Fail").await;
    let rec = Recorder::start(
        ha.cp.client.clone(),
        "storageversion-webhook",
        3,
        &minor,
        &INTEREST,
    );
    let mut served = BTreeMap::new();
    served.insert(minor.clone(), ha.served_by(0).await);
    let s = settle(&ha, &rec, &served, "all three running").await;
    let killed_id = s
        .index_of
        .iter()
        .find(|(_, i)| **i == 1)
        .map(|(id, _)| id.clone())
        .expect("apiserver 1's identity");
    let with_1: BTreeSet<String> = s
        .objects
        .keys()
        .filter(|n| s.entries_of(n).contains(&1))
        .cloned()
        .collect();
    assert!(with_1.len() > 30, "apiserver 1 wrote only {}", with_1.len());

    // Apiserver 2 leaves gracefully (its lease is deleted), apiserver 1 crashes (its lease stays).
    // The grace runs from the lease deletion, which happens at or after the stop begins (a
    // graceful stop deletes the lease first, then takes a moment to exit): measure from there.
    let left_id = s
        .index_of
        .iter()
        .find(|(_, i)| **i == 2)
        .map(|(id, _)| id.clone())
        .expect("apiserver 2's identity");
    let leases: Api<Lease> = Api::namespaced(ha.cp.client.clone(), "kube-system");
    let stopped_at = rec.now();
    let (a, b) = tokio::join!(ha.stop(&rec, 2, false), ha.stop(&rec, 1, true));
    let _ = (a, b);
    // kube-apiserver deletes its identity lease on a graceful stop from 1.35 on; 1.34 leaves it,
    // so there a graceful stop is a crash to the collector (entries kept until the lease expires).
    let stop_deletes_lease = leases
        .get_opt(&left_id)
        .await
        .expect("read apiserver 2's lease")
        .is_none();
    let mut expire = vec![killed_id.clone()];
    if stop_deletes_lease {
        let gone = rec.wait_entries_gone(2).await;
        let after = gone.t - stopped_at;
        eprintln!("apiserver 2's entries gone {after:.1}s after its stop");
        assert!(
            after >= DEFAULT_GRACE.as_secs_f64() - 1.0,
            "entries went {after:.1}s after the stop, before the {DEFAULT_GRACE:?} grace"
        );
        // The killed apiserver's lease is live (renewTime recent, 3600 s duration): entries kept.
        for n in &with_1 {
            assert!(
                gone.entries_of(n).contains(&1),
                "{n} lost the killed apiserver's entry while its lease was unexpired"
            );
        }
    } else {
        assert!(
            minor.as_str() < "1.35",
            "kube-apiserver {minor} left its identity lease after a graceful stop"
        );
        eprintln!("kube-apiserver {minor} left apiserver 2's lease after its graceful stop: expired like the crashed one's");
        expire.push(left_id.clone());
    }
    // Nothing renews the dead apiservers' leases any more: move their renewTime 3600 s + the
    // grace + 5 s into the past, as if an hour had passed.
    let past = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(
            3600 + expired_grace.as_secs() as i64 + 5,
        ))
        .expect("time");
    let patch = serde_json::json!({"spec": {"renewTime": past.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}});
    for id in &expire {
        leases
            .patch(id, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("move the dead apiserver's renewTime into the past");
    }
    rec.event(
        Some(1),
        "lease expired",
        "renewTime moved 1 h into the past",
    );
    let expired_at = rec.now();
    let gone1 = rec.wait_entries_gone(1).await;
    let gone1 = if stop_deletes_lease {
        gone1
    } else {
        rec.wait_entries_gone(2).await
    };
    eprintln!(
        "apiserver 1's entries gone {:.1}s after its lease was expired",
        gone1.t - expired_at
    );
    // Apiserver 0 kept every entry throughout, and no object was deleted.
    let tl = rec.finish().await;
    let lost0: Vec<_> = losses(&tl)
        .into_iter()
        .filter(|l| l.apiserver == Some(0))
        .collect();
    assert!(
        lost0.is_empty(),
        "the running apiserver lost entries: {lost0:?}"
    );
    let deleted: Vec<_> = tl.objects.iter().filter(|o| o.what == "deleted").collect();
    assert!(deleted.is_empty(), "objects deleted: {deleted:?}");
    for (name, _) in gone1.objects.iter() {
        assert_eq!(
            gone1.entries_of(name),
            BTreeSet::from([0]),
            "{name}: only the running apiserver's entry should be left"
        );
    }
    let m = hook.metrics().await;
    assert_eq!(
        reviews_total(&m, &["verdict=\"denied\""]),
        0.0,
        "denials:\n{m}"
    );
    tl.write_json(&out_dir().join("leave-and-crash.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("leaving and crashing: {:?}", t0.elapsed());
}

/// Test 4: two webhook replicas across the upgrade; the collecting leader is killed in the
/// middle; the other takes over; the final objects are the same as in test 1.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_with_the_leader_killed_mid_upgrade() {
    let _serial = serial().await;
    let run = run_upgrade(Collector::OursTwoReplicas).await;
    let takeover = run
        .takeover
        .expect("the other replica did not take the leader Lease within 90 s");
    eprintln!("the other replica led {takeover:.1}s after the leader was killed");
    assert_ours_kept_everything(&run);
    let reference = ours().await;
    assert_eq!(
        run.final_objects, reference.final_objects,
        "final objects differ from the single-replica upgrade's"
    );
    run.timeline
        .write_json(&out_dir().join("two-replicas.json"))
        .unwrap_or_else(|e| panic!("{e}"));
}

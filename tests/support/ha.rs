//! Helpers for the HA end-to-end tests (tests/e2e_upgrade.rs): a control plane with several
//! kube-apiservers (`tests/controlplane/run up --apiservers N`) behind a loopback TCP load
//! balancer, upgrade steps, and a recorder that lists every StorageVersion every 250 ms and keeps
//! a timeline of entries, common versions, identity leases and apiserver stops and starts.

#[path = "timeline.rs"]
pub mod timeline;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use storageversion_webhook::model::{
    StorageVersion, StorageVersionStatus, IDENTITY_LABEL_KEY, IDENTITY_LABEL_VALUE,
};
use storageversion_webhook::rules::common::set_common_encoding_version;

use super::{controlplane_script, repo_root, run_script_ok, ControlPlane};
use timeline::{CommonChange, CountSample, Event, ObjectEvent, Segment, Timeline};

/// The two Kubernetes minors of the rolling upgrade.
pub const OLD: &str = "1.36";
pub const NEW: &str = "1.37";

/// The minor a test that does not upgrade runs every apiserver on: `SVW_KUBE_VERSION` (set by
/// `scripts/matrix`, which runs a subset of the tests on each supported minor), else [`NEW`].
pub fn tested_minor() -> String {
    std::env::var("SVW_KUBE_VERSION")
        .ok()
        .map(|v| {
            v.trim_start_matches('v')
                .split('.')
                .take(2)
                .collect::<Vec<_>>()
                .join(".")
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| NEW.to_string())
}
/// StorageVersions whose encoding differs between the two minors.
pub const MAP: &str = "admissionregistration.k8s.io.mutatingadmissionpolicies";
pub const MAPB: &str = "admissionregistration.k8s.io.mutatingadmissionpolicybindings";
pub const MAP_V1BETA1: &str = "admissionregistration.k8s.io/v1beta1";
pub const MAP_V1: &str = "admissionregistration.k8s.io/v1";
/// How often the recorder lists every StorageVersion.
pub const POLL_EVERY: Duration = Duration::from_millis(250);

// ------------------------------------------------------------------ load balancer --

/// A TCP load balancer on loopback in front of the apiservers (or webhook replicas), as a real HA
/// control plane has: each connection goes round-robin to the next backend that is in rotation
/// and accepts it. TLS passes through, so clients still verify the apiserver's certificate and
/// authenticate with their own. A backend is taken out of rotation before it is stopped and put
/// back once ready, as a health-checked load balancer does.
pub struct LoadBalancer {
    pub addr: SocketAddr,
    enabled: Arc<Vec<AtomicBool>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoadBalancer {
    /// Listens on 127.0.0.1 (ephemeral port) on a thread of its own, so blocking test code never
    /// stalls the proxied connections.
    pub fn start(backends: Vec<SocketAddr>) -> LoadBalancer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the load balancer");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("load balancer address");
        let enabled: Arc<Vec<AtomicBool>> =
            Arc::new(backends.iter().map(|_| AtomicBool::new(true)).collect());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let en = Arc::clone(&enabled);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("load balancer runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let backends = Arc::new(backends);
                let next = Arc::new(AtomicUsize::new(0));
                let accept = async {
                    loop {
                        match listener.accept().await {
                            Ok((inbound, _)) => {
                                tokio::spawn(proxy(
                                    inbound,
                                    Arc::clone(&backends),
                                    Arc::clone(&en),
                                    Arc::clone(&next),
                                ));
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = rx => {}
                }
            });
            // Dropping the runtime ends every proxied connection.
        });
        LoadBalancer {
            addr,
            enabled,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// Takes backend `i` out of rotation (`false`) or puts it back. Open connections stay.
    pub fn set_enabled(&self, i: usize, on: bool) {
        self.enabled[i].store(on, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn proxy(
    mut inbound: tokio::net::TcpStream,
    backends: Arc<Vec<SocketAddr>>,
    enabled: Arc<Vec<AtomicBool>>,
    next: Arc<AtomicUsize>,
) {
    let n = backends.len();
    let first = next.fetch_add(1, Ordering::Relaxed);
    for k in 0..n {
        let i = (first + k) % n;
        if !enabled[i].load(Ordering::SeqCst) {
            continue;
        }
        let connect = tokio::net::TcpStream::connect(backends[i]);
        if let Ok(Ok(mut out)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            return;
        }
    }
    // No backend took it: the client sees the connection closed and retries.
}

// -------------------------------------------------------------------- the cluster --

/// A control plane with `n` kube-apiservers sharing one etcd, each with its own hostname (so its
/// own identity lease), port, cert dir, log and pid; `cp.kubeconfig` and `cp.client` go through
/// the load balancer.
pub struct Ha {
    pub cp: ControlPlane,
    pub lb: LoadBalancer,
    pub n: usize,
    /// The minor each apiserver runs ("" while stopped).
    pub versions: Mutex<Vec<String>>,
}

impl Ha {
    /// `n` apiservers at minor `version`. With `SVW_UPGRADE_EMULATED=1`, the old minor is the
    /// current binary with `--emulated-version` (no second build needed; for a quick look).
    pub async fn up(n: usize, version: &str) -> Ha {
        let n_s = n.to_string();
        let emulated =
            version != NEW && std::env::var("SVW_UPGRADE_EMULATED").as_deref() == Ok("1");
        let flag = if emulated {
            "--emulated-version"
        } else {
            "--version"
        };
        let mut cp = ControlPlane::up_with(&["--apiservers", &n_s, flag, version]).await;
        let env = read_ports_env(cp.state_dir());
        let ports: Vec<u16> = (0..n)
            .map(|i| {
                env.get(&format!("SVW_APISERVER_PORT_{i}"))
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| panic!("no SVW_APISERVER_PORT_{i} in ports.env: {env:?}"))
            })
            .collect();
        let lb = LoadBalancer::start(
            ports
                .iter()
                .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
                .collect(),
        );
        let kubeconfig = std::fs::read_to_string(&cp.kubeconfig).expect("read kubeconfig");
        let through_lb = kubeconfig.replace(
            &format!("server: https://127.0.0.1:{}", ports[0]),
            &format!("server: {}", lb.url()),
        );
        assert_ne!(kubeconfig, through_lb, "kubeconfig names apiserver 0");
        let path = cp.state_dir().join("kubeconfig-lb");
        std::fs::write(&path, through_lb).expect("write kubeconfig-lb");
        cp.client = storageversion_webhook::kubeclient::client(Some(&path))
            .await
            .expect("client through the load balancer");
        cp.kubeconfig = path;
        Ha {
            cp,
            lb,
            n,
            versions: Mutex::new(vec![version.to_string(); n]),
        }
    }

    /// The admin kubeconfig of apiserver `i` alone.
    pub fn kubeconfig_of(&self, i: usize) -> PathBuf {
        self.cp.state_dir().join(format!("kubeconfig-{i}"))
    }

    pub fn versions(&self) -> Vec<String> {
        self.versions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_version(&self, i: usize, v: &str) {
        self.versions.lock().unwrap_or_else(|e| e.into_inner())[i] = v.to_string();
    }

    /// `tests/controlplane/run <args>` on a blocking thread (the recorder keeps polling).
    pub async fn run(&self, args: &[&str]) {
        let dir = self.cp.state_dir().to_path_buf();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || run_script(&dir, &args))
            .await
            .expect("run script thread");
    }

    /// One rolling-upgrade step: out of rotation, graceful stop, start on `version` (same
    /// hostname), wait for /readyz, back in rotation. Events go to `rec`.
    pub async fn upgrade(&self, rec: &Recorder, i: usize, version: &str) {
        let idx = i.to_string();
        self.lb.set_enabled(i, false);
        rec.event(Some(i), "stop", "");
        self.run(&["stop-apiserver", &idx]).await;
        self.set_version(i, "");
        rec.event(Some(i), "stopped", "");
        rec.event(Some(i), "start", version);
        self.run(&["start-apiserver", &idx, "--version", version])
            .await;
        self.set_version(i, version);
        rec.event(Some(i), "ready", version);
        self.lb.set_enabled(i, true);
    }

    /// Stops apiserver `i` for good (graceful, or SIGKILL when `kill`).
    pub async fn stop(&self, rec: &Recorder, i: usize, kill: bool) {
        let idx = i.to_string();
        self.lb.set_enabled(i, false);
        rec.event(Some(i), if kill { "kill" } else { "stop" }, "");
        self.run(&[
            if kill {
                "kill-apiserver"
            } else {
                "stop-apiserver"
            },
            &idx,
        ])
        .await;
        self.set_version(i, "");
        rec.event(Some(i), "stopped", "");
    }

    /// The names of the StorageVersions a kube-apiserver of each running minor writes, from the
    /// discovery of apiserver `i` (`<group>.<resource>`, `core` for the core group).
    pub async fn served_by(&self, i: usize) -> BTreeSet<String> {
        let kubectl = super::bin_dir().join("kubectl");
        let kc = self.kubeconfig_of(i);
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(kubectl)
                .args(["api-resources", "-o", "name"])
                .env("KUBECONFIG", kc)
                .output()
        })
        .await
        .expect("thread")
        .expect("run kubectl api-resources");
        assert!(
            out.status.success(),
            "kubectl api-resources on apiserver {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| match l.split_once('.') {
                Some((resource, group)) => format!("{group}.{resource}"),
                None => format!("core.{l}"),
            })
            .collect()
    }

    /// Every `kube-apiserver*.log` of the control plane, concatenated.
    pub fn apiserver_logs(&self) -> String {
        (0..self.n)
            .map(|i| {
                let c = if i == 0 {
                    "kube-apiserver".to_string()
                } else {
                    format!("kube-apiserver-{i}")
                };
                self.cp.log(&c)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Lines of the apiserver logs where an admission webhook denied or failed a StorageVersion
/// write.
pub fn denial_lines(logs: &str, webhook: &str) -> Vec<String> {
    logs.lines()
        .filter(|l| l.contains(webhook) || l.contains("storageversion"))
        .filter(|l| {
            l.contains("denied the request")
                || l.contains("failed calling webhook")
                || l.contains("failed to update storage version")
                || l.contains("failed to update storageversion")
        })
        .map(|l| l.chars().take(600).collect())
        .collect()
}

pub fn read_ports_env(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("ports.env"))
        .expect("read ports.env")
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The keys of `map` that are not in `present`.
fn keys_not_in<K: Ord + Clone, V>(map: &BTreeMap<K, V>, present: &BTreeSet<K>) -> Vec<K> {
    map.keys()
        .filter(|k| !present.contains(*k))
        .cloned()
        .collect()
}

fn run_script(dir: &Path, args: &[String]) {
    run_script_ok(&mut controlplane_script(dir, args), args);
}

// ----------------------------------------------------------------------- recorder --

/// The latest successful listing: every StorageVersion by name, and apiserver index by ID.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub t: f64,
    pub objects: BTreeMap<String, StorageVersion>,
    pub index_of: BTreeMap<String, usize>,
}

impl Snapshot {
    /// The apiserver indexes with an entry in `name`.
    pub fn entries_of(&self, name: &str) -> BTreeSet<usize> {
        self.objects
            .get(name)
            .map(|sv| {
                sv.status
                    .storage_versions
                    .iter()
                    .filter_map(|e| self.index_of.get(&e.api_server_id).copied())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Entries whose apiserver the recorder cannot name (no identity lease seen for it).
    pub fn unknown_ids(&self) -> Vec<String> {
        self.objects
            .values()
            .flat_map(|sv| sv.status.storage_versions.iter())
            .filter(|e| !self.index_of.contains_key(&e.api_server_id))
            .map(|e| e.api_server_id.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    pub fn common(&self, name: &str) -> Option<String> {
        self.objects
            .get(name)
            .and_then(|sv| sv.status.common_encoding_version.clone())
    }
}

struct RecState {
    t0: Instant,
    tl: Timeline,
    open: BTreeMap<(String, String), (String, f64)>,
    lease_open: BTreeMap<String, f64>,
    last_common: BTreeMap<String, Option<String>>,
    interest: BTreeSet<String>,
    history: BTreeMap<String, Vec<(f64, StorageVersionStatus)>>,
    latest: Option<Snapshot>,
    last_ok: Option<f64>,
}

/// Lists every StorageVersion (and the identity leases) every [`POLL_EVERY`] in a background
/// task and keeps the changes as a [`Timeline`]; the test records stops and starts with
/// [`Recorder::event`].
pub struct Recorder {
    state: Arc<Mutex<RecState>>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    /// `interest`: objects whose every status change is kept (for the condition checks and
    /// the picture).
    pub fn start(
        client: kube::Client,
        collector: &str,
        n: usize,
        initial_version: &str,
        interest: &[&str],
    ) -> Recorder {
        let state = Arc::new(Mutex::new(RecState {
            t0: Instant::now(),
            tl: Timeline {
                collector: collector.to_string(),
                apiservers: n,
                initial_version: initial_version.to_string(),
                interest: interest.iter().map(|s| s.to_string()).collect(),
                ..Timeline::default()
            },
            open: BTreeMap::new(),
            lease_open: BTreeMap::new(),
            last_common: BTreeMap::new(),
            interest: interest.iter().map(|s| s.to_string()).collect(),
            history: BTreeMap::new(),
            latest: None,
            last_ok: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let state = Arc::clone(&state);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let svs: Api<StorageVersion> = Api::all(client.clone());
                let leases: Api<Lease> = Api::namespaced(client, "kube-system");
                let lp = ListParams::default()
                    .labels(&format!("{IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE}"));
                let mut tick = tokio::time::interval(POLL_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let limit = Duration::from_secs(2);
                    let listed = tokio::time::timeout(limit, async {
                        let l = leases.list(&lp).await?;
                        let s = svs.list(&ListParams::default()).await?;
                        Ok::<_, kube::Error>((s.items, l.items))
                    })
                    .await;
                    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                    let t = st.t0.elapsed().as_secs_f64();
                    st.tl.polls += 1;
                    match listed {
                        Ok(Ok((objects, leases))) => observe(&mut st, t, objects, leases),
                        _ => st.tl.poll_errors += 1,
                    }
                }
            })
        };
        Recorder {
            state,
            stop,
            task: Some(task),
        }
    }

    pub fn now(&self) -> f64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .t0
            .elapsed()
            .as_secs_f64()
    }

    /// Records a stop/start/ready/kill/... of apiserver `apiserver` (None: not an apiserver).
    pub fn event(&self, apiserver: Option<usize>, what: &str, detail: &str) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let t = st.t0.elapsed().as_secs_f64();
        eprintln!(
            "[{t:7.2}s] {}{what} {detail}",
            apiserver
                .map(|i| format!("apiserver {i}: "))
                .unwrap_or_default()
        );
        st.tl.events.push(Event {
            t,
            apiserver,
            what: what.to_string(),
            detail: detail.to_string(),
        });
    }

    /// When the last event `what` was recorded (seconds since the start).
    pub fn last_event(&self, what: &str) -> Option<f64> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.tl
            .events
            .iter()
            .rev()
            .find(|e| e.what == what)
            .map(|e| e.t)
    }

    pub fn latest(&self) -> Option<Snapshot> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .latest
            .clone()
    }

    /// Waits (polling the recorder's own listings) until `cond` holds for a snapshot taken
    /// after this call; returns it, or the last one seen with the error.
    /// Waits up to 90 s until no object has an entry of apiserver `index`; returns that
    /// snapshot.
    pub async fn wait_entries_gone(&self, index: usize) -> Snapshot {
        self.wait_for(
            &format!("apiserver {index}'s entries to go"),
            Duration::from_secs(90),
            |s| s.objects.keys().all(|n| !s.entries_of(n).contains(&index)),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn wait_for<F>(
        &self,
        what: &str,
        deadline: Duration,
        mut cond: F,
    ) -> Result<Snapshot, String>
    where
        F: FnMut(&Snapshot) -> bool,
    {
        let after = self.now();
        let end = Instant::now() + deadline;
        loop {
            if let Some(s) = self.latest() {
                if s.t >= after && cond(&s) {
                    return Ok(s);
                }
            }
            if Instant::now() > end {
                return Err(format!(
                    "timed out after {deadline:?} waiting for {what}; last snapshot at {:?}s",
                    self.latest().map(|s| s.t)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every kept status of an object of interest, with the time it was first seen.
    pub fn history(&self, name: &str) -> Vec<(f64, StorageVersionStatus)> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .history
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// Stops polling and returns the timeline (open segments stay open: `to` = None).
    pub async fn finish(mut self) -> Timeline {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let t = st.t0.elapsed().as_secs_f64();
        st.tl.duration = t;
        let mut tl = st.tl.clone();
        for ((object, apiserver), (encoding, from)) in &st.open {
            tl.segments.push(Segment {
                object: object.clone(),
                apiserver: apiserver.clone(),
                index: st
                    .latest
                    .as_ref()
                    .and_then(|s| s.index_of.get(apiserver).copied()),
                encoding: encoding.clone(),
                from: *from,
                to: None,
            });
        }
        for (id, from) in &st.lease_open {
            tl.leases.push(Segment {
                object: "lease".into(),
                apiserver: id.clone(),
                index: st.latest.as_ref().and_then(|s| s.index_of.get(id).copied()),
                encoding: String::new(),
                from: *from,
                to: None,
            });
        }
        let index_of = st.latest.clone().unwrap_or_default().index_of;
        tl.ids = index_of.iter().map(|(k, v)| (*v, k.clone())).collect();
        for s in tl.segments.iter_mut().chain(tl.leases.iter_mut()) {
            s.index = index_of.get(&s.apiserver).copied();
        }
        tl.segments.sort_by(|a, b| {
            (&a.object, &a.apiserver, a.from)
                .partial_cmp(&(&b.object, &b.apiserver, b.from))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        tl
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn observe(st: &mut RecState, t: f64, objects: Vec<StorageVersion>, leases: Vec<Lease>) {
    if let Some(last) = st.last_ok {
        st.tl.max_poll_gap = st.tl.max_poll_gap.max(t - last);
    }
    let first = st.last_ok.is_none();
    st.last_ok = Some(t);

    // Apiserver index from the identity lease's hostname label (apiserver-<i>); kept once seen.
    let mut index_of = st
        .latest
        .as_ref()
        .map(|s| s.index_of.clone())
        .unwrap_or_default();
    let mut lease_ids = BTreeSet::new();
    for l in &leases {
        let Some(name) = l.metadata.name.clone() else {
            continue;
        };
        let host = l
            .metadata
            .labels
            .as_ref()
            .and_then(|m| m.get("kubernetes.io/hostname"))
            .cloned()
            .unwrap_or_default();
        if let Some(i) = host
            .strip_prefix("apiserver-")
            .and_then(|i| i.parse::<usize>().ok())
        {
            index_of.insert(name.clone(), i);
        }
        lease_ids.insert(name);
    }
    for id in &lease_ids {
        st.lease_open.entry(id.clone()).or_insert(t);
    }
    let gone = keys_not_in(&st.lease_open, &lease_ids);
    for id in gone {
        if let Some(from) = st.lease_open.remove(&id) {
            st.tl.leases.push(Segment {
                object: "lease".into(),
                apiserver: id,
                index: None,
                encoding: String::new(),
                from,
                to: Some(t),
            });
        }
    }

    let by_name: BTreeMap<String, StorageVersion> = objects
        .into_iter()
        .filter_map(|sv| Some((sv.metadata.name.clone()?, sv)))
        .collect();
    if !first {
        let before: BTreeSet<String> = st
            .latest
            .as_ref()
            .map(|s| s.objects.keys().cloned().collect())
            .unwrap_or_default();
        for name in by_name.keys().filter(|n| !before.contains(*n)) {
            st.tl.objects.push(ObjectEvent {
                object: name.clone(),
                t,
                what: "created".into(),
            });
        }
        for name in before.iter().filter(|n| !by_name.contains_key(*n)) {
            st.tl.objects.push(ObjectEvent {
                object: name.clone(),
                t,
                what: "deleted".into(),
            });
        }
    }

    let mut present = BTreeSet::new();
    for (name, sv) in &by_name {
        for e in &sv.status.storage_versions {
            let key = (name.clone(), e.api_server_id.clone());
            present.insert(key.clone());
            match st.open.get(&key) {
                Some((enc, _)) if *enc == e.encoding_version => {}
                Some((enc, from)) => {
                    let (enc, from) = (enc.clone(), *from);
                    st.tl.segments.push(Segment {
                        object: key.0.clone(),
                        apiserver: key.1.clone(),
                        index: None,
                        encoding: enc,
                        from,
                        to: Some(t),
                    });
                    st.open.insert(key, (e.encoding_version.clone(), t));
                }
                None => {
                    st.open.insert(key, (e.encoding_version.clone(), t));
                }
            }
        }
        let common = sv.status.common_encoding_version.clone();
        if st.last_common.get(name) != Some(&common) {
            st.tl.common.push(CommonChange {
                object: name.clone(),
                t,
                value: common.clone(),
            });
            st.last_common.insert(name.clone(), common);
        }
        if st.interest.contains(name) {
            let h = st.history.entry(name.clone()).or_default();
            if h.last().map(|(_, s)| s) != Some(&sv.status) {
                h.push((t, sv.status.clone()));
            }
        }
    }
    for name in st.last_common.keys().cloned().collect::<Vec<_>>() {
        if !by_name.contains_key(&name) && st.last_common.get(&name) != Some(&None) {
            st.tl.common.push(CommonChange {
                object: name.clone(),
                t,
                value: None,
            });
            st.last_common.insert(name, None);
        }
    }
    let closed = keys_not_in(&st.open, &present);
    for key in closed {
        if let Some((enc, from)) = st.open.remove(&key) {
            st.tl.segments.push(Segment {
                object: key.0,
                apiserver: key.1,
                index: None,
                encoding: enc,
                from,
                to: Some(t),
            });
        }
    }

    let mut with_entry = vec![0usize; st.tl.apiservers];
    for sv in by_name.values() {
        for e in &sv.status.storage_versions {
            if let Some(i) = index_of.get(&e.api_server_id) {
                if let Some(c) = with_entry.get_mut(*i) {
                    *c += 1;
                }
            }
        }
    }
    st.tl.counts.push(CountSample {
        t,
        objects: by_name.len(),
        with_entry,
    });
    st.latest = Some(Snapshot {
        t,
        objects: by_name,
        index_of,
    });
}

// ------------------------------------------------------------------------- checks --

/// An entry that disappeared from an object after it had appeared there: `to` = when it came
/// back (None: never, until the end of the run).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Loss {
    pub object: String,
    pub apiserver: Option<usize>,
    pub from: f64,
    pub to: Option<f64>,
}

/// Every gap in an (object, apiserver) entry after its first appearance.
/// The StorageVersion deletions in `tl`.
pub fn deletions(tl: &Timeline) -> Vec<&ObjectEvent> {
    tl.objects.iter().filter(|o| o.what == "deleted").collect()
}

pub fn losses(tl: &Timeline) -> Vec<Loss> {
    let mut by_key: BTreeMap<(&str, &str), Vec<&Segment>> = BTreeMap::new();
    for s in &tl.segments {
        by_key
            .entry((s.object.as_str(), s.apiserver.as_str()))
            .or_default()
            .push(s);
    }
    let mut out = Vec::new();
    for segs in by_key.values_mut() {
        segs.sort_by(|a, b| {
            a.from
                .partial_cmp(&b.from)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        for w in segs.windows(2) {
            if let Some(end) = w[0].to {
                if w[1].from > end {
                    out.push(Loss {
                        object: w[0].object.clone(),
                        apiserver: w[0].index,
                        from: end,
                        to: Some(w[1].from),
                    });
                }
            }
        }
        if let Some(last) = segs.last() {
            if let Some(end) = last.to {
                out.push(Loss {
                    object: last.object.clone(),
                    apiserver: last.index,
                    from: end,
                    to: None,
                });
            }
        }
    }
    out.sort_by(|a, b| {
        a.from
            .partial_cmp(&b.from)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    out
}

/// Checks every kept status of an object against upstream's `SetCommonEncodingVersion`
/// applied to the one before it: `commonEncodingVersion`, and the `AllEncodingVersionsEqual`
/// condition's status, reason, message, and `lastTransitionTime` (new exactly when upstream
/// would set it). Returns the violations.
pub fn condition_violations(name: &str, history: &[(f64, StorageVersionStatus)]) -> Vec<String> {
    const NOW: &str = "<now>";
    let mut out = Vec::new();
    for w in history.windows(2) {
        let (prev, (t, cur)) = (&w[0].1, &w[1]);
        let mut expect = StorageVersion {
            status: prev.clone(),
            ..StorageVersion::default()
        };
        expect.status.storage_versions = cur.storage_versions.clone();
        set_common_encoding_version(&mut expect, NOW);
        let want = &expect.status;
        if want.common_encoding_version != cur.common_encoding_version {
            out.push(format!(
                "{name} at {t:.2}s: commonEncodingVersion {:?}, upstream computes {:?}",
                cur.common_encoding_version, want.common_encoding_version
            ));
        }
        let find = |s: &StorageVersionStatus| s.encoding_conditions().cloned().collect::<Vec<_>>();
        let (w_c, c_c, p_c) = (find(want), find(cur), find(prev));
        if c_c.len() != 1 || w_c.len() != 1 {
            out.push(format!(
                "{name} at {t:.2}s: {} AllEncodingVersionsEqual conditions",
                c_c.len()
            ));
            continue;
        }
        let (wc, cc) = (&w_c[0], &c_c[0]);
        if (&wc.status, &wc.reason, &wc.message) != (&cc.status, &cc.reason, &cc.message) {
            out.push(format!(
                "{name} at {t:.2}s: condition ({}, {}, {}), upstream computes ({}, {}, {})",
                cc.status, cc.reason, cc.message, wc.status, wc.reason, wc.message
            ));
        }
        let prev_ltt = p_c.first().and_then(|c| c.last_transition_time.clone());
        let moved = cc.last_transition_time != prev_ltt;
        let should_move = wc.last_transition_time.as_deref() == Some(NOW);
        if moved != should_move {
            out.push(format!(
                "{name} at {t:.2}s: lastTransitionTime {:?} -> {:?}, upstream {} it",
                prev_ltt,
                cc.last_transition_time,
                if should_move { "changes" } else { "keeps" }
            ));
        }
    }
    out
}

/// A comparable form of the final objects: per object, its entries (apiserver index, encoding,
/// decodable), the common version and the condition's status/reason/message.
pub fn normalized(s: &Snapshot) -> BTreeMap<String, String> {
    s.objects
        .iter()
        .map(|(name, sv)| {
            let mut entries: Vec<String> = sv
                .status
                .storage_versions
                .iter()
                .map(|e| {
                    format!(
                        "{}={} {:?}",
                        s.index_of
                            .get(&e.api_server_id)
                            .map(|i| format!("apiserver-{i}"))
                            .unwrap_or_else(|| e.api_server_id.clone()),
                        e.encoding_version,
                        e.decodable_versions
                    )
                })
                .collect();
            entries.sort();
            let cond = sv
                .status
                .conditions
                .iter()
                .map(|c| format!("{}:{}:{}:{}", c.type_, c.status, c.reason, c.message))
                .collect::<Vec<_>>()
                .join(",");
            (
                name.clone(),
                format!(
                    "{} | common={:?} | {cond}",
                    entries.join("; "),
                    sv.status.common_encoding_version
                ),
            )
        })
        .collect()
}

/// Where the tests write their timelines (JSON) and pictures.
pub fn out_dir() -> PathBuf {
    let d = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("upgrade-timeline");
    std::fs::create_dir_all(&d).expect("create target/upgrade-timeline");
    d
}

//! The simulated Kubernetes API server: one shared, stateful store behind one `tower-test` mock
//! per webhook replica (each replica's `kube::Client` talks to its own mock, every mock to the same
//! store), so the fake server knows which replica sent each request.
//!
//! Determinism: requests are not answered as they arrive. Each is queued for the next point of a
//! 250 ms grid (plus seeded extra delay) and, at that point, all requests due are processed in the
//! order of a key made of their content (replica, method, URI, body hash), never of their arrival.
//! Product-side `HashMap` iteration order therefore cannot change what the server does or
//! answers. (Requests about the leader Lease use a coarser grid: see [`LEADER_GRID`].) Every write bumps one global resourceVersion;
//! a stale resourceVersion or a failed delete precondition is a 409; watches are long-lived
//! responses streaming JSON lines through a channel-backed body, and can lag, be dropped, or be
//! told their resourceVersion is too old (410, as an ERROR event, which makes kube's watcher list
//! again). Requests the model does not know get a loud 501 and fail the run.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use http::{Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::rng::{fnv, mix};

pub type SimBody = UnsyncBoxBody<Bytes, std::io::Error>;
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<SimBody>>;
type Responder = tower_test::mock::SendResponse<Response<SimBody>>;

/// Requests are answered on this grid (see the module doc)...
pub const GRID: Duration = Duration::from_millis(250);
/// ... and those about the leader Lease on this coarser one: kube-lease-manager sleeps a random
/// 0-1000 ms (its own thread RNG, not seedable) before it takes over an expired Lease, always
/// right after an answer about the Lease; the next grid point after that sleep is then the same
/// whatever the sleep. Shorter than the product's shortest call deadline (2 s).
pub const LEADER_GRID: Duration = Duration::from_millis(1500);

pub const SVS: &str = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions";
pub const SVMS: &str = "/apis/storagemigration.k8s.io/v1/storageversionmigrations";
/// Discovery of the migration API's group (the trigger asks it every pass).
pub const SVM_GROUP: &str = "/apis/storagemigration.k8s.io";
pub const IDENTITY_LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
pub const LEADER_NS: &str = "svw";
/// CustomResourceDefinitions, and the group of the custom resources the world defines (their
/// objects live in one table per plural, whatever version a request names: [`cr_table`]).
pub const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
pub const CR_GROUP: &str = "example.com";
const CR_PREFIX: &str = "/apis/example.com/";
/// The CRD migrator's state ConfigMap (in [`LEADER_NS`]).
pub const CRD_STATE: &str = "storageversion-webhook-crd";

/// The table of the custom resource `plural`.
pub fn cr_table(plural: &str) -> String {
    format!("{CR_PREFIX}{plural}")
}

/// The CRD of the custom resource `plural`.
pub fn crd_name(plural: &str) -> String {
    format!("{plural}.{CR_GROUP}")
}

/// The version a CRD object stores in (`storage: true`).
pub fn storage_of(crd: &Value) -> Option<String> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"] == true)?["name"]
        .as_str()
        .map(str::to_string)
}

pub fn stored_versions_of(crd: &Value) -> Vec<String> {
    crd["status"]["storedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}
pub const LEADER_LEASE: &str = "storageversion-webhook-gc";

pub fn leader_leases() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{LEADER_NS}/leases")
}

/// Failure injection, set by the world from the seed (changed during a run).
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Percent of requests answered 500 or 429 without being applied.
    pub error_pct: u64,
    /// Percent of requests whose answer comes 11-15 s late (applied on time: a timeout).
    pub slow_pct: u64,
    /// Percent of requests held for one or two more grid points.
    pub late_pct: u64,
}

/// One watch stream.
struct Watcher {
    replica: usize,
    collection: String,
    labels: Option<(String, String)>,
    name: Option<String>,
    lag: Duration,
    tx: mpsc::UnboundedSender<(Instant, Bytes)>,
}

/// A request waiting for its grid point.
struct Pending {
    replica: usize,
    /// The leader Lease's unexpired holder when the request arrived (was sent).
    leader_at_send: Option<String>,
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
    respond: Responder,
}

/// The last lines of the trace, and a hash of all of it.
#[derive(Default)]
pub struct Trace {
    pub lines: VecDeque<String>,
    pub hash: u64,
    pub count: u64,
}

const TRACE_KEEP: usize = 120;

impl Trace {
    pub fn push(&mut self, at: Duration, line: String) {
        let line = format!("{:>9.3}s {line}", at.as_secs_f64());
        if std::env::var_os("SVW_SIM_TRACE").is_some() {
            eprintln!("{line}");
        }
        self.hash = mix(self.hash ^ fnv(line.as_bytes()));
        self.count += 1;
        if self.lines.len() == TRACE_KEEP {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// A write some replica completed, as the server applied it.
#[derive(Clone, Debug)]
pub struct Write {
    pub at: Duration,
    pub replica: usize,
    pub what: String,
    /// The leader Lease's holder (if unexpired) when the request was sent.
    pub leader: Option<String>,
    /// ... and when it was applied (shown in the trace: a write sent while leading may land
    /// after the Lease ran out, when the API server is slow).
    pub leader_applied: Option<String>,
}

/// A removal of an entry by a replica (a status PUT without it, or a DELETE).
#[derive(Clone, Debug)]
pub struct Removal {
    pub at: Duration,
    /// When this replica's last live GET of that lease answered NotFound (None: never).
    pub confirmed: Option<Duration>,
    pub replica: usize,
    pub sv: String,
    pub id: String,
}

/// A migration a replica created.
#[derive(Clone, Debug)]
pub struct Created {
    pub at: Duration,
    pub name: String,
    pub sv: String,
    pub version: String,
    /// The CRD it migrates (the CRD migrator's; empty for the trigger's).
    pub crd: String,
    /// Our CRD migrator's StorageVersionMigrations of the same CRD object not yet ended when
    /// this one was created (I8).
    pub unfinished: Vec<String>,
}

pub struct Cluster {
    pub start: Instant,
    pub seed: u64,
    pub rv: u64,
    uid: u64,
    /// collection path -> name -> object.
    pub tables: BTreeMap<String, BTreeMap<String, Value>>,
    /// collection path -> (resourceVersion, type, object), for watches resuming.
    logs: BTreeMap<String, Vec<(u64, &'static str, Value)>>,
    /// Watches asking for a resourceVersion below this get 410.
    pub compacted: u64,
    watchers: Vec<Watcher>,
    pending: BTreeMap<(Instant, String, u64), Pending>,
    seq: u64,
    occurrences: BTreeMap<u64, u64>,
    pub faults: Faults,
    pub partitioned: BTreeSet<usize>,
    /// Watch lag per replica (applies to watches it opens from now on).
    pub lag: BTreeMap<usize, Duration>,
    pub identities: BTreeMap<usize, String>,
    pub trace: Trace,
    /// Non-watch requests per replica, with when (I6).
    pub calls: Vec<(Duration, usize)>,
    pub writes: Vec<Write>,
    pub removals: Vec<Removal>,
    pub created: Vec<Created>,
    pub unknown: Vec<String>,
    /// (replica, identity lease) -> when a GET of it last answered NotFound.
    pub confirms: BTreeMap<(usize, String), Duration>,
    /// Identity lease name -> (created, deleted) intervals.
    pub lease_life: BTreeMap<String, Vec<(Duration, Option<Duration>)>>,
    /// StorageVersion name -> changes of the version all entries encode and decode (None:
    /// they do not all agree, or there is no entry or no object).
    pub agreement: BTreeMap<String, Vec<(Duration, Option<String>)>>,
    /// Custom resource plural -> object name -> the version it is stored in (what etcd holds).
    pub cr_stored: BTreeMap<String, BTreeMap<String, String>>,
    /// I7, checked at every commit of a CRD or a custom object: an object stored in a version
    /// its CRD's storedVersions does not list.
    pub i7: Vec<String>,
    /// Every write of the CRD migrator's state ConfigMap: when, and its data (I8).
    pub crd_state_log: Vec<(Duration, Value)>,
    notify: Arc<Notify>,
}

pub type Shared = Arc<Mutex<Cluster>>;

pub fn lock(s: &Shared) -> MutexGuard<'_, Cluster> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn now_text() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn micro_now() -> String {
    Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "reason": reason, "code": code, "message": message})
}

/// What a request gets.
enum Reply {
    Json(u16, Value),
    Watch(mpsc::UnboundedReceiver<(Instant, Bytes)>),
}

fn kind_of(resource: &str) -> (&'static str, &'static str) {
    match resource {
        "storageversions" => ("internal.apiserver.k8s.io/v1alpha1", "StorageVersion"),
        "storageversionmigrations" => ("storagemigration.k8s.io/v1", "StorageVersionMigration"),
        "leases" => ("coordination.k8s.io/v1", "Lease"),
        "configmaps" => ("v1", "ConfigMap"),
        "events" => ("events.k8s.io/v1", "Event"),
        "customresourcedefinitions" => ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
        _ => ("", ""),
    }
}

/// `/apis/g/v/[namespaces/ns/]resource[/name[/sub]]` -> (collection, resource, name, sub).
fn parse_path(path: &str) -> Option<(String, String, Option<String>, Option<String>)> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let base = match *segs.first()? {
        "api" => 2,
        "apis" => 3,
        _ => return None,
    };
    let mut i = base;
    if segs.get(i) == Some(&"namespaces") && segs.len() > i + 2 {
        i += 2;
    }
    let resource = segs.get(i)?.to_string();
    if kind_of(&resource).1.is_empty() {
        return None;
    }
    let collection = format!("/{}", segs[..=i].join("/"));
    let name = segs.get(i + 1).map(|s| s.to_string());
    let sub = segs.get(i + 2).map(|s| s.to_string());
    if segs.len() > i + 3 {
        return None;
    }
    Some((collection, resource, name, sub))
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn selector(s: Option<&String>) -> Option<(String, String)> {
    s.and_then(|s| s.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
}

fn matches(obj: &Value, labels: &Option<(String, String)>, name: &Option<String>) -> bool {
    if let Some((k, v)) = labels {
        if obj["metadata"]["labels"][k].as_str() != Some(v) {
            return false;
        }
    }
    if let Some(n) = name {
        if obj["metadata"]["name"].as_str() != Some(n) {
            return false;
        }
    }
    true
}

/// JSON merge patch (RFC 7386); strategic merge patches of the fields used here are the same.
fn merge(target: &mut Value, patch: &Value) {
    if let Value::Object(p) = patch {
        if !target.is_object() {
            *target = json!({});
        }
        if let Value::Object(t) = target {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
    } else {
        *target = patch.clone();
    }
}

impl Cluster {
    pub fn new(seed: u64) -> Cluster {
        Cluster {
            start: Instant::now(),
            seed,
            rv: 1000,
            uid: 0,
            tables: BTreeMap::new(),
            logs: BTreeMap::new(),
            compacted: 0,
            watchers: Vec::new(),
            pending: BTreeMap::new(),
            seq: 0,
            occurrences: BTreeMap::new(),
            faults: Faults::default(),
            partitioned: BTreeSet::new(),
            lag: BTreeMap::new(),
            identities: BTreeMap::new(),
            trace: Trace::default(),
            calls: Vec::new(),
            writes: Vec::new(),
            removals: Vec::new(),
            created: Vec::new(),
            unknown: Vec::new(),
            confirms: BTreeMap::new(),
            lease_life: BTreeMap::new(),
            agreement: BTreeMap::new(),
            cr_stored: BTreeMap::new(),
            i7: Vec::new(),
            crd_state_log: Vec::new(),
            notify: Arc::new(Notify::new()),
        }
    }

    pub fn at(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }

    pub fn note(&mut self, line: String) {
        let at = self.at();
        self.trace.push(at, line);
    }

    pub fn table(&self, collection: &str) -> Option<&BTreeMap<String, Value>> {
        self.tables.get(collection)
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<&Value> {
        self.tables.get(collection)?.get(name)
    }

    /// Stores `obj` (or deletes `name` when `None`) with a new resourceVersion, and tells the
    /// watches. Returns the stored object.
    pub fn commit(&mut self, collection: &str, name: &str, obj: Option<Value>) -> Option<Value> {
        self.rv += 1;
        let rv = self.rv;
        let table = self.tables.entry(collection.to_string()).or_default();
        let (kind, object) = match obj {
            Some(mut o) => {
                let existed = table.contains_key(name);
                if !existed {
                    self.uid += 1;
                    o["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
                    o["metadata"]["creationTimestamp"] = json!(now_text());
                }
                o["metadata"]["resourceVersion"] = json!(rv.to_string());
                table.insert(name.to_string(), o.clone());
                (if existed { "MODIFIED" } else { "ADDED" }, o)
            }
            None => {
                let mut o = table.remove(name)?;
                o["metadata"]["resourceVersion"] = json!(rv.to_string());
                ("DELETED", o)
            }
        };
        let at = self.at();
        if collection == IDENTITY_LEASES {
            let life = self.lease_life.entry(name.to_string()).or_default();
            match kind {
                "ADDED" => life.push((at, None)),
                "DELETED" => {
                    if let Some(last) = life.last_mut() {
                        last.1 = Some(at);
                    }
                }
                _ => {}
            }
        }
        if collection == SVS {
            let a = if kind == "DELETED" {
                None
            } else {
                agreement_of(&object)
            };
            let h = self.agreement.entry(name.to_string()).or_default();
            if h.last().map(|x| &x.1) != Some(&a) {
                h.push((at, a));
            }
        }
        if collection == format!("/api/v1/namespaces/{LEADER_NS}/configmaps") && name == CRD_STATE {
            let data = object["data"].clone();
            self.crd_state_log.push((at, data));
        }
        if collection == CRDS {
            if let Some(plural) = name.strip_suffix(&format!(".{CR_GROUP}")) {
                self.check_i7(plural, &format!("{kind} of CRD {name}"));
            }
        } else if let Some(plural) = collection.strip_prefix(CR_PREFIX) {
            let plural = plural.to_string();
            self.check_i7(&plural, &format!("{kind} of {plural}/{name}"));
        }
        self.logs
            .entry(collection.to_string())
            .or_default()
            .push((rv, kind, object.clone()));
        let line = serde_json::to_vec(&json!({"type": kind, "object": object}))
            .map(|mut v| {
                v.push(b'\n');
                Bytes::from(v)
            })
            .unwrap_or_default();
        let now = Instant::now();
        self.watchers.retain(|w| {
            if w.collection != collection || !matches(&object, &w.labels, &w.name) {
                return !w.tx.is_closed();
            }
            w.tx.send((now + w.lag, line.clone())).is_ok()
        });
        (kind != "DELETED").then_some(object)
    }

    /// Ends every watch of `replica` (or every watch when `None`): kube's watcher resumes.
    pub fn drop_watches(&mut self, replica: Option<usize>) {
        self.watchers
            .retain(|w| replica.is_some_and(|r| r != w.replica));
    }

    /// Forgets watch history: resuming from before now means 410 and a fresh list.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        for log in self.logs.values_mut() {
            log.clear();
        }
    }

    /// The holder of the leader Lease if its claim has not run out (by the simulated clock).
    pub fn leader(&self) -> Option<String> {
        let lease = self.get(&leader_leases(), LEADER_LEASE)?;
        let holder = lease["spec"]["holderIdentity"].as_str()?.to_string();
        let renew: Timestamp = lease["spec"]["renewTime"].as_str()?.parse().ok()?;
        let secs = lease["spec"]["leaseDurationSeconds"].as_i64()?;
        let until = renew
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
            .ok()?;
        (until > Timestamp::now()).then_some(holder)
    }

    fn per_request(&mut self, key: &str) -> u64 {
        let h = fnv(key.as_bytes());
        let n = self.occurrences.entry(h).or_default();
        *n += 1;
        mix(self.seed ^ h ^ n.wrapping_mul(0x9E37))
    }

    fn process(&mut self, p: &Pending, key: &str) -> Option<Reply> {
        let q = query_map(&p.query);
        let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
        let what = format!(
            "r{} {} {}{}",
            p.replica,
            p.method,
            p.path,
            if watch { " (watch)" } else { "" }
        );
        if self.partitioned.contains(&p.replica) {
            self.note(format!("{what} -> partitioned"));
            return None;
        }
        if !watch {
            let at = self.at();
            self.calls.push((at, p.replica));
        }
        let dice = self.per_request(key);
        let leader_lease = p.path.starts_with(&leader_leases());
        if !watch && dice % 100 < self.faults.error_pct {
            // Never a 409 on the leader Lease: kube-lease-manager backs off randomly on those.
            let (code, reason) = if dice.is_multiple_of(2) {
                (500, "InternalError")
            } else {
                (429, "TooManyRequests")
            };
            self.note(format!("{what} -> injected {code}"));
            return Some(Reply::Json(
                code,
                status(code, reason, "injected by the simulation"),
            ));
        }
        if p.method == "GET" && p.path == SVM_GROUP {
            // Discovery of the migration API group: v1, as kube-apiserver 1.37 serves it.
            self.note(format!("{what} -> 200 (discovery)"));
            return Some(Reply::Json(
                200,
                json!({
                    "kind": "APIGroup", "apiVersion": "v1", "name": "storagemigration.k8s.io",
                    "versions": [{"groupVersion": "storagemigration.k8s.io/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": "storagemigration.k8s.io/v1", "version": "v1"},
                }),
            ));
        }
        if let Some(rest) = p.path.strip_prefix(CR_PREFIX) {
            let reply = self.custom(p, rest, watch, &what);
            return Some(self.answered(p, &what, leader_lease, reply));
        }
        let Some((collection, resource, name, sub)) = parse_path(&p.path) else {
            return Some(self.unknown(&what));
        };
        let (api_version, kind) = kind_of(&resource);
        let reply = match (p.method.as_str(), name, sub.as_deref()) {
            ("GET", None, None) if watch => self.watch(p, &collection, &q),
            ("GET", None, None) => {
                let labels = selector(q.get("labelSelector"));
                let fname = q
                    .get("fieldSelector")
                    .and_then(|f| f.strip_prefix("metadata.name="))
                    .map(str::to_string);
                let items: Vec<Value> = self
                    .table(&collection)
                    .map(|t| {
                        t.values()
                            .filter(|o| matches(o, &labels, &fname))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                Reply::Json(
                    200,
                    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                    "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            ("GET", Some(n), None) => match self.get(&collection, &n) {
                Some(o) => Reply::Json(200, o.clone()),
                None if collection == IDENTITY_LEASES => {
                    let at = self.at();
                    self.confirms.insert((p.replica, n.clone()), at);
                    Reply::Json(
                        404,
                        status(404, "NotFound", &format!("{resource} \"{n}\" not found")),
                    )
                }
                None => Reply::Json(
                    404,
                    status(404, "NotFound", &format!("{resource} \"{n}\" not found")),
                ),
            },
            ("POST", None, None) => self.create(p, &collection, &resource, api_version, kind),
            ("PUT", Some(n), sub @ (None | Some("status"))) => {
                self.replace(p, &collection, &n, sub.is_some())
            }
            ("PATCH", Some(n), sub @ (None | Some("status"))) => {
                self.patch(p, &collection, &n, api_version, kind, sub.is_some())
            }
            ("DELETE", Some(n), None) => self.delete(p, &collection, &n),
            _ => self.unknown(&what),
        };
        Some(self.answered(p, &what, leader_lease, reply))
    }

    /// Notes the answer in the trace, and a write applied for a replica (I3).
    fn answered(&mut self, p: &Pending, what: &str, leader_lease: bool, reply: Reply) -> Reply {
        let what = what.to_string();
        if let Reply::Json(code, body) = &reply {
            self.note(format!("{what} -> {code}"));
            if !leader_lease
                && p.method != "GET"
                && *code < 300
                && p.leader_at_send != self.leader()
            {
                let applied = self.leader();
                self.note(format!(
                    "  (leader when sent {:?}, when applied {applied:?})",
                    p.leader_at_send
                ));
            }
            if leader_lease && std::env::var_os("SVW_SIM_TRACE").is_some() {
                eprintln!("      body {} -> {}", p.body, body["spec"]);
            }
            if !leader_lease && p.method != "GET" && *code < 300 {
                let at = self.at();
                let leader_applied = self.leader();
                self.writes.push(Write {
                    at,
                    replica: p.replica,
                    what: what.clone(),
                    leader: p.leader_at_send.clone(),
                    leader_applied,
                });
            }
        }
        reply
    }

    /// I7 on the custom resource `plural` after `what` was committed.
    fn check_i7(&mut self, plural: &str, what: &str) {
        let Some(crd) = self.get(CRDS, &crd_name(plural)) else {
            return;
        };
        let listed = stored_versions_of(crd);
        let bad: Vec<String> = self
            .cr_stored
            .get(plural)
            .into_iter()
            .flatten()
            .filter(|(_, v)| !listed.contains(v))
            .map(|(o, v)| format!("{o} in {v}"))
            .collect();
        if !bad.is_empty() {
            let at = self.at();
            self.i7.push(format!(
                "I7: after the {what} at {at:?}, objects of {plural} are stored in versions storedVersions {listed:?} does not list: {}",
                bad.join(", ")
            ));
        }
    }

    /// A request for a custom resource (`rest`: `version/plural[/name]`), as kube-apiserver
    /// serves a CRD: 404 unless the CRD exists, is Established and serves that version; every
    /// write is stored in the CRD's storage version, and an update that changes neither the
    /// object nor its stored version writes nothing (the same bytes).
    fn custom(&mut self, p: &Pending, rest: &str, watch: bool, what: &str) -> Reply {
        let segs: Vec<&str> = rest.split('/').collect();
        let (version, plural, name) = match segs.as_slice() {
            [v, pl] => (*v, *pl, None),
            [v, pl, n] => (*v, *pl, Some(n.to_string())),
            _ => return self.unknown(what),
        };
        let not_found =
            |what: &str| Reply::Json(404, status(404, "NotFound", &format!("{what} not found")));
        let Some(crd) = self.get(CRDS, &crd_name(plural)).cloned() else {
            return not_found("the server could not find the requested resource");
        };
        let served = crd["spec"]["versions"].as_array().is_some_and(|vs| {
            vs.iter()
                .any(|v| v["name"] == version && v["served"] == true)
        });
        let established = crd["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        if !served || !established {
            return not_found("the server could not find the requested resource");
        }
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let api_version = format!("{CR_GROUP}/{version}");
        let table = cr_table(plural);
        let as_served = |o: &Value| {
            let mut o = o.clone();
            o["apiVersion"] = json!(api_version);
            o["kind"] = json!(kind);
            o
        };
        match (p.method.as_str(), name) {
            ("GET", None) if !watch => {
                let items: Vec<Value> = self
                    .table(&table)
                    .into_iter()
                    .flat_map(|t| t.values())
                    .map(as_served)
                    .collect();
                Reply::Json(
                    200,
                    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                           "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            ("GET", Some(n)) => match self.get(&table, &n) {
                Some(o) => Reply::Json(200, as_served(o)),
                None => not_found(&format!("{plural} \"{n}\"")),
            },
            ("PUT", Some(n)) => {
                let Some(current) = self.get(&table, &n).cloned() else {
                    return not_found(&format!("{plural} \"{n}\""));
                };
                if let Some(r) = self.precondition(
                    &current,
                    p.body["metadata"]["resourceVersion"].as_str(),
                    None,
                ) {
                    return r;
                }
                let storage = storage_of(&crd).unwrap_or_default();
                let stored = self.cr_stored.get(plural).and_then(|m| m.get(&n)).cloned();
                if p.body["spec"] == current["spec"] && stored.as_deref() == Some(storage.as_str())
                {
                    self.note(format!(
                        "  {plural}/{n} unchanged in {storage}: nothing written"
                    ));
                    return Reply::Json(200, as_served(&current));
                }
                let mut next = current.clone();
                next["spec"] = p.body["spec"].clone();
                next["apiVersion"] = json!(format!("{CR_GROUP}/{storage}"));
                self.cr_stored
                    .entry(plural.to_string())
                    .or_default()
                    .insert(n.clone(), storage);
                match self.commit(&table, &n, Some(next)) {
                    Some(o) => Reply::Json(200, as_served(&o)),
                    None => Reply::Json(500, status(500, "InternalError", "lost")),
                }
            }
            _ => self.unknown(what),
        }
    }

    /// A status write of a CRD, as kube-apiserver validates it: storedVersions lists the
    /// storage version, and only versions of `spec.versions`.
    fn crd_status_invalid(next: &Value) -> Option<Reply> {
        let stored = stored_versions_of(next);
        let versions: Vec<&str> = next["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        let storage = storage_of(next)?;
        let ok = stored.contains(&storage) && stored.iter().all(|v| versions.contains(&v.as_str()));
        (!ok).then(|| {
            Reply::Json(
                422,
                status(
                    422,
                    "Invalid",
                    &format!("status.storedVersions: Invalid value: {stored:?}: must have the storage version {storage} and only versions of spec.versions"),
                ),
            )
        })
    }

    fn unknown(&mut self, what: &str) -> Reply {
        self.note(format!("{what} -> 501 UNKNOWN"));
        self.unknown.push(what.to_string());
        Reply::Json(
            501,
            status(
                501,
                "NotImplemented",
                "the simulation does not model this request",
            ),
        )
    }

    fn watch(&mut self, p: &Pending, collection: &str, q: &BTreeMap<String, String>) -> Reply {
        let (tx, rx) = mpsc::unbounded_channel();
        let lag = self.lag.get(&p.replica).copied().unwrap_or_default();
        let labels = selector(q.get("labelSelector"));
        let name = q
            .get("fieldSelector")
            .and_then(|f| f.strip_prefix("metadata.name="))
            .map(str::to_string);
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let now = Instant::now();
        if from < self.compacted {
            let gone = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
            let mut v = serde_json::to_vec(&gone).unwrap_or_default();
            v.push(b'\n');
            let _ = tx.send((now + lag, Bytes::from(v)));
            return Reply::Watch(rx);
        }
        for (rv, kind, obj) in self.logs.get(collection).into_iter().flatten() {
            if *rv > from && matches(obj, &labels, &name) {
                let mut v =
                    serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
                v.push(b'\n');
                let _ = tx.send((now + lag, Bytes::from(v)));
            }
        }
        self.watchers.push(Watcher {
            replica: p.replica,
            collection: collection.to_string(),
            labels,
            name,
            lag,
            tx,
        });
        Reply::Watch(rx)
    }

    fn create(
        &mut self,
        p: &Pending,
        collection: &str,
        resource: &str,
        api_version: &str,
        kind: &str,
    ) -> Reply {
        let mut obj = p.body.clone();
        if resource == "events" {
            return Reply::Json(201, obj);
        }
        let name = match obj["metadata"]["name"].as_str() {
            Some(n) => n.to_string(),
            None => {
                self.uid += 1;
                format!(
                    "{}{}",
                    obj["metadata"]["generateName"].as_str().unwrap_or("x-"),
                    self.uid
                )
            }
        };
        if self.get(collection, &name).is_some() {
            return Reply::Json(
                409,
                status(
                    409,
                    "AlreadyExists",
                    &format!("{resource} \"{name}\" already exists"),
                ),
            );
        }
        obj["apiVersion"] = json!(api_version);
        obj["kind"] = json!(kind);
        obj["metadata"]["name"] = json!(name);
        if let Some(ns) = collection
            .split("/namespaces/")
            .nth(1)
            .and_then(|s| s.split('/').next())
        {
            obj["metadata"]["namespace"] = json!(ns);
        }
        if resource == "storageversionmigrations" {
            let at = self.at();
            let annotation = |o: &Value, k: &str| {
                o["metadata"]["annotations"][k]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            };
            let crd = annotation(&obj, "storageversion-webhook.io/crd");
            let uid = annotation(&obj, "storageversion-webhook.io/crd-uid");
            let unfinished: Vec<String> = if crd.is_empty() {
                Vec::new()
            } else {
                self.table(collection)
                    .into_iter()
                    .flatten()
                    .filter(|(_, o)| {
                        annotation(o, "storageversion-webhook.io/crd-uid") == uid
                            && o["metadata"]["labels"]["app.kubernetes.io/managed-by"]
                                == "storageversion-webhook-crd"
                            && !o["status"]["conditions"].as_array().is_some_and(|cs| {
                                cs.iter().any(|c| {
                                    (c["type"] == "Succeeded" || c["type"] == "Failed")
                                        && c["status"] == "True"
                                })
                            })
                    })
                    .map(|(n, _)| n.clone())
                    .collect()
            };
            self.created.push(Created {
                crd,
                unfinished,
                at,
                name: name.clone(),
                sv: obj["metadata"]["annotations"]["storageversion-webhook.io/storageversion"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                version: obj["metadata"]["annotations"]
                    ["storageversion-webhook.io/encoding-version"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            });
        }
        match self.commit(collection, &name, Some(obj)) {
            Some(o) => Reply::Json(201, o),
            None => Reply::Json(500, status(500, "InternalError", "lost")),
        }
    }

    fn precondition(&self, current: &Value, rv: Option<&str>, uid: Option<&str>) -> Option<Reply> {
        let cur_rv = current["metadata"]["resourceVersion"].as_str();
        let cur_uid = current["metadata"]["uid"].as_str();
        if rv.is_some_and(|rv| Some(rv) != cur_rv) || uid.is_some_and(|u| Some(u) != cur_uid) {
            return Some(Reply::Json(409, status(409, "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again")));
        }
        None
    }

    fn replace(&mut self, p: &Pending, collection: &str, name: &str, status_only: bool) -> Reply {
        let Some(current) = self.get(collection, name).cloned() else {
            return Reply::Json(
                404,
                status(404, "NotFound", &format!("\"{name}\" not found")),
            );
        };
        if let Some(r) = self.precondition(
            &current,
            p.body["metadata"]["resourceVersion"].as_str(),
            None,
        ) {
            return r;
        }
        let mut next = if status_only {
            current.clone()
        } else {
            p.body.clone()
        };
        if status_only {
            next["status"] = p.body["status"].clone();
        }
        next["metadata"]["uid"] = current["metadata"]["uid"].clone();
        next["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"].clone();
        self.removed_entries(p.replica, name, collection, &current, Some(&next));
        match self.commit(collection, name, Some(next)) {
            Some(o) => Reply::Json(200, o),
            None => Reply::Json(500, status(500, "InternalError", "lost")),
        }
    }

    fn patch(
        &mut self,
        p: &Pending,
        collection: &str,
        name: &str,
        api_version: &str,
        kind: &str,
        status_only: bool,
    ) -> Reply {
        let apply = p.content_type.contains("apply-patch");
        let current = self.get(collection, name).cloned();
        let mut next = match (current, apply) {
            (Some(c), _) => c,
            (None, true) => {
                json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}})
            }
            (None, false) => {
                return Reply::Json(
                    404,
                    status(404, "NotFound", &format!("\"{name}\" not found")),
                )
            }
        };
        if let Some(r) =
            self.precondition(&next, p.body["metadata"]["resourceVersion"].as_str(), None)
        {
            return r;
        }
        let mut body = p.body.clone();
        if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        if apply && body.get("data").is_some() {
            // Server-side apply by the only manager of `data`: what it no longer sends goes.
            next["data"] = json!({});
        }
        if status_only {
            // The status subresource: only the status changes.
            body = json!({"status": body["status"].clone()});
        }
        merge(&mut next, &body);
        if collection == CRDS && status_only {
            if let Some(r) = Self::crd_status_invalid(&next) {
                return r;
            }
        }
        if let Some(ns) = collection
            .split("/namespaces/")
            .nth(1)
            .and_then(|s| s.split('/').next())
        {
            next["metadata"]["namespace"] = json!(ns);
        }
        match self.commit(collection, name, Some(next)) {
            Some(o) => Reply::Json(200, o),
            None => Reply::Json(500, status(500, "InternalError", "lost")),
        }
    }

    fn delete(&mut self, p: &Pending, collection: &str, name: &str) -> Reply {
        let Some(current) = self.get(collection, name).cloned() else {
            return Reply::Json(
                404,
                status(404, "NotFound", &format!("\"{name}\" not found")),
            );
        };
        let pre = &p.body["preconditions"];
        if let Some(r) = self.precondition(
            &current,
            pre["resourceVersion"].as_str(),
            pre["uid"].as_str(),
        ) {
            return r;
        }
        self.removed_entries(p.replica, name, collection, &current, None);
        self.commit(collection, name, None);
        Reply::Json(200, current)
    }

    /// Records every entry a replica's write removes from a StorageVersion.
    fn removed_entries(
        &mut self,
        replica: usize,
        name: &str,
        collection: &str,
        before: &Value,
        after: Option<&Value>,
    ) {
        if collection != SVS {
            return;
        }
        let ids = |v: Option<&Value>| -> BTreeSet<String> {
            v.and_then(|v| v["status"]["storageVersions"].as_array())
                .into_iter()
                .flatten()
                .filter_map(|e| e["apiServerID"].as_str().map(str::to_string))
                .collect()
        };
        let kept = ids(after);
        let at = self.at();
        for id in ids(Some(before)).difference(&kept) {
            let confirmed = self.confirms.get(&(replica, id.clone())).copied();
            self.removals.push(Removal {
                confirmed,
                at,
                replica,
                sv: name.to_string(),
                id: id.clone(),
            });
        }
    }
}

/// The version every entry of a StorageVersion encodes and decodes, if there is one.
pub fn agreement_of(sv: &Value) -> Option<String> {
    let entries = sv["status"]["storageVersions"].as_array()?;
    let first = entries.first()?["encodingVersion"].as_str()?;
    entries
        .iter()
        .all(|e| {
            e["encodingVersion"].as_str() == Some(first)
                && e["decodableVersions"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|v| v.as_str() == Some(first)))
        })
        .then(|| first.to_string())
}

fn full(code: u16, v: &Value) -> Response<SimBody> {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(
        Full::new(Bytes::from(bytes))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn streaming(rx: mpsc::UnboundedReceiver<(Instant, Bytes)>) -> Response<SimBody> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let (at, bytes) = rx.recv().await?;
        tokio::time::sleep_until(at).await;
        Some((Ok::<_, std::io::Error>(Frame::data(bytes)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream.boxed()).boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Takes `replica`'s requests off its mock and queues them for their grid point.
pub async fn accept(shared: Shared, replica: usize, mut handle: Handle) {
    while let Some((req, respond)) = handle.next_request().await {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let mut c = lock(&shared);
        let method = parts.method.to_string();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or("").to_string();
        let content_type = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let key = format!("{replica} {method} {path}?{query} {:016x}", fnv(&bytes));
        if std::env::var_os("SVW_SIM_TRACE").is_some() {
            eprintln!("  arrive {:?} {key}", c.at());
        }
        let dice = c.per_request(&format!("late {key}"));
        let elapsed = Instant::now().saturating_duration_since(c.start);
        let grid = if path.starts_with(&leader_leases()) {
            LEADER_GRID
        } else {
            GRID
        };
        let slots = elapsed.as_nanos() / grid.as_nanos() + 1;
        // Latency: up to two more grid points for any request but those about the leader
        // Lease (their deadlines are 2 s), one to three seconds more when faults say so.
        let extra = if dice % 100 < c.faults.late_pct {
            4 + (dice >> 8) % 8
        } else if grid == GRID {
            (dice >> 16) % 3
        } else {
            0
        };
        let due = c.start + grid * (slots as u32 + extra as u32);
        c.seq += 1;
        let seq = c.seq;
        let leader_at_send = c.leader();
        c.pending.insert(
            (due, key, seq),
            Pending {
                leader_at_send,
                replica,
                method,
                path,
                query,
                content_type,
                body,
                respond,
            },
        );
        c.notify.notify_one();
    }
}

/// Answers queued requests at their grid points, in key order.
pub async fn process(shared: Shared) {
    let notify = Arc::clone(&lock(&shared).notify);
    loop {
        let next = lock(&shared).pending.keys().next().map(|k| k.0);
        match next {
            None => notify.notified().await,
            Some(at) if at > Instant::now() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = notify.notified() => {}
                }
            }
            Some(_) => {}
        }
        loop {
            let mut c = lock(&shared);
            let Some(entry) = c.pending.first_entry() else {
                break;
            };
            if entry.key().0 > Instant::now() {
                break;
            }
            let ((_, key, _), p) = entry.remove_entry();
            let reply = c.process(&p, &key);
            let dice = c.per_request(&format!("slow {key}"));
            let slow = dice % 100 < c.faults.slow_pct;
            drop(c);
            match reply {
                None => {
                    // Partitioned: the connection fails after a while.
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        p.respond.send_error("simulated network partition");
                    });
                }
                Some(Reply::Watch(rx)) => p.respond.send_response(streaming(rx)),
                Some(Reply::Json(code, v)) if slow => {
                    let delay = Duration::from_secs(11 + (dice >> 8) % 5);
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        p.respond.send_response(full(code, &v));
                    });
                }
                Some(Reply::Json(code, v)) => p.respond.send_response(full(code, &v)),
            }
        }
    }
}

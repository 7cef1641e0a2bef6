//! The collector's fast tier: the real collector against a mock API client (`tower-test`) with
//! paused tokio time, so the deletion grace, the re-check before writing, conflicts, lookup
//! errors and the end of a term are tested in milliseconds. What the collector sends is logged
//! and counted here, at the (mock) API server. The real-control-plane tests are in `e2e_gc.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use kube::client::Body;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use storageversion_webhook::gc::{Collector, CollectorConfig, GcMetrics, JournalConfig};
use storageversion_webhook::leases::LeaseStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const GRACE: Duration = Duration::from_secs(30);
const LIVE: &str = "apiserver-live";
const GONE: &str = "apiserver-gone";
const SVS: &str = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
/// The collector's journal (`CollectorConfig::journal`), kept by the mock.
const JOURNAL: &str = "/api/v1/namespaces/svw/configmaps/svw-gc-journal";

/// One request as the mock API server saw it.
#[derive(Clone, Debug)]
struct Call {
    at: Duration,
    method: String,
    path: String,
    query: String,
    body: Value,
}

impl Call {
    fn is(&self, method: &str, path: &str) -> bool {
        self.method == method && self.path == path
    }
}

/// How the mock answers.
#[derive(Clone)]
enum Reply {
    Json(u16, Value),
    /// Never answer (a watch that stays open).
    Hold,
    /// First deliver this watch event on the open StorageVersion watch (an apiserver wrote the
    /// object meanwhile), then answer, a (paused-time) while later.
    Meanwhile {
        event: Value,
        after: Duration,
        reply: Box<Reply>,
    },
}

/// Which requests a rule of a [`Script`] answers.
#[derive(Clone)]
struct Req(Arc<dyn Fn(&Call) -> bool + Send + Sync>);

impl Req {
    fn new(matches: impl Fn(&Call) -> bool + Send + Sync + 'static) -> Req {
        Req(Arc::new(matches))
    }

    fn matches(&self, call: &Call) -> bool {
        (self.0)(call)
    }

    /// Only those whose body names resourceVersion `rv` (a write of that copy).
    fn at_rv(self, rv: &'static str) -> Req {
        Req::new(move |c| self.matches(c) && c.body["metadata"]["resourceVersion"] == rv)
    }
}

fn method(m: &'static str) -> Req {
    Req::new(move |c| c.method == m)
}

fn put() -> Req {
    method("PUT")
}

/// A write of an object's status.
fn put_status() -> Req {
    Req::new(|c| c.method == "PUT" && c.path.ends_with("/status"))
}

fn post() -> Req {
    method("POST")
}

fn delete() -> Req {
    method("DELETE")
}

/// The GET of the StorageVersion `name` (a read of one object).
fn get(name: &'static str) -> Req {
    Req::new(move |c| c.method == "GET" && c.path.ends_with(name))
}

/// The GET of the lease `id`.
fn get_lease(id: &'static str) -> Req {
    Req::new(move |c| c.method == "GET" && lease_get(&c.path) == Some(id))
}

/// What a rule of a [`Script`] answers: a reply, or one made from the request when it comes.
enum Answer {
    Fixed(Reply),
    From(Box<dyn FnMut(&Call) -> Reply + Send>),
}

impl Answer {
    fn with(make: impl FnMut(&Call) -> Reply + Send + 'static) -> Answer {
        Answer::From(Box::new(make))
    }

    fn reply(&mut self, call: &Call) -> Reply {
        match self {
            Answer::Fixed(reply) => reply.clone(),
            Answer::From(make) => make(call),
        }
    }
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Answer {
        Answer::Fixed(reply)
    }
}

struct Rule {
    req: Req,
    /// The rule is over once a request like this has come.
    until: Option<Req>,
    answer: Answer,
}

/// The mock's answers to what [`serve`] leaves to the test: rules tried in order, the first
/// that matches answers, and a request no rule matches gets a 500 "unexpected".
#[derive(Default)]
struct Script {
    rules: Vec<Rule>,
}

impl Script {
    fn new() -> Script {
        Script::default()
    }

    /// Answers every request `req` matches.
    fn on(self, req: Req, answer: impl Into<Answer>) -> Script {
        self.rule(req, None, answer.into())
    }

    /// Answers the first request `req` matches (none like it came before).
    fn first(self, req: Req, answer: impl Into<Answer>) -> Script {
        self.rule(req.clone(), Some(req), answer.into())
    }

    /// Answers the requests `req` matches until one that `seen` matches has come.
    fn until(self, req: Req, seen: Req, answer: impl Into<Answer>) -> Script {
        self.rule(req, Some(seen), answer.into())
    }

    fn rule(mut self, req: Req, until: Option<Req>, answer: Answer) -> Script {
        self.rules.push(Rule { req, until, answer });
        self
    }

    fn live(rule: &Rule, call: &Call, earlier: &[Call]) -> bool {
        rule.req.matches(call)
            && rule
                .until
                .as_ref()
                .is_none_or(|seen| !earlier.iter().any(|c| seen.matches(c)))
    }

    /// Whether a rule answers `call` (the mock answers the journal itself otherwise).
    fn answers(&self, call: &Call, earlier: &[Call]) -> bool {
        self.rules.iter().any(|r| Script::live(r, call, earlier))
    }

    fn reply(&mut self, call: &Call, earlier: &[Call]) -> Reply {
        let rule = self
            .rules
            .iter_mut()
            .find(|r| Script::live(r, call, earlier));
        match rule {
            Some(rule) => rule.answer.reply(call),
            None => status(500, "unexpected"),
        }
    }
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: u16, v: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(v).unwrap()))
            .unwrap(),
    )
}

type Log = Arc<Mutex<Vec<Call>>>;
/// The journal ConfigMap's `removals` as the mock holds it (`None`: no ConfigMap).
type Journal = Arc<Mutex<Option<String>>>;

fn entry(id: &str) -> Value {
    json!({"apiServerID": id, "encodingVersion": "v1", "decodableVersions": ["v1"]})
}

fn sv(name: &str, rv: &str, ids: &[&str]) -> Value {
    json!({
        "apiVersion": "internal.apiserver.k8s.io/v1alpha1", "kind": "StorageVersion",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv,
                     "managedFields": [{"manager": "kube-apiserver", "operation": "Update"}]},
        "spec": {},
        "status": {"storageVersions": ids.iter().map(|i| entry(i)).collect::<Vec<_>>(),
                   "commonEncodingVersion": "v1",
                   "futureField": {"kept": true}}
    })
}

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-system",
                     "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver"}},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 3600,
                 "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
    }))
    .expect("lease")
}

fn not_found() -> Reply {
    Reply::Json(
        404,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

fn status(code: u16, reason: &str) -> Reply {
    Reply::Json(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason}),
    )
}

/// The lease `id`, found (made when the GET comes).
fn found(id: &'static str) -> Answer {
    Answer::with(move |_| Reply::Json(200, serde_json::to_value(lease(id)).unwrap()))
}

/// The written object as it was sent.
fn echo() -> Answer {
    Answer::with(|call| Reply::Json(200, call.body.clone()))
}

/// The written object, stored at resourceVersion `rv`.
fn stored(code: u16, rv: &'static str) -> Answer {
    Answer::with(move |call| {
        let mut body = call.body.clone();
        body["metadata"]["resourceVersion"] = json!(rv);
        Reply::Json(code, body)
    })
}

/// Answers the collector's requests: the StorageVersion list from `objects`, watches held open,
/// Events accepted, and everything else by `script`.
async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    log: Log,
    journal: Journal,
    objects: Vec<Value>,
    mut script: Script,
) {
    let start = Instant::now();
    let mut held = Vec::new();
    let mut sv_watches = Vec::new();
    while let Some((req, send)) = handle.next_request().await {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let call = Call {
            at: start.elapsed(),
            method,
            path,
            query,
            body,
        };
        let earlier = log.lock().unwrap().clone();
        log.lock().unwrap().push(call.clone());
        let sv_watch = call.query.contains("watch=true") && call.path == SVS;
        let reply = if call.query.contains("watch=true") {
            Reply::Hold
        } else if call.is("GET", SVS) {
            Reply::Json(
                200,
                json!({"apiVersion": "internal.apiserver.k8s.io/v1alpha1", "kind": "StorageVersionList",
                       "metadata": {"resourceVersion": "100"}, "items": objects}),
            )
        } else if call.method == "POST" && call.path.contains("/events") {
            Reply::Json(201, call.body.clone())
        } else if call.path == JOURNAL && !script.answers(&call, &earlier) {
            let mut held = journal.lock().unwrap();
            if call.method == "PATCH" {
                *held = call.body["data"]["removals"].as_str().map(str::to_string);
            }
            match held.as_ref() {
                Some(text) => Reply::Json(
                    200,
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "svw-gc-journal", "namespace": "svw"},
                           "data": {"removals": text}}),
                ),
                None => not_found(),
            }
        } else {
            script.reply(&call, &earlier)
        };
        match reply {
            Reply::Hold if sv_watch => sv_watches.push(send),
            Reply::Hold => held.push(send),
            Reply::Json(code, v) => respond(send, code, &v),
            Reply::Meanwhile {
                event,
                after,
                reply,
            } => {
                // The watch's answer is this one event; the watcher then watches again.
                if let Some(w) = sv_watches.pop() {
                    respond(w, 200, &event);
                }
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if let Reply::Json(code, v) = *reply {
                        respond(send, code, &v);
                    }
                });
            }
        }
    }
}

/// The collector on a mock client, its leases in a store fed by hand (only `LIVE` exists).
struct Rig {
    collector: Arc<Collector>,
    leases: LeaseStore,
    registry: Registry,
    log: Log,
    journal: Journal,
}

fn rig(objects: Vec<Value>, script: Script) -> Rig {
    rig_with_journal(objects, script, None)
}

/// A rig whose journal ConfigMap already holds `journal` (an earlier term's record).
fn rig_with_journal(objects: Vec<Value>, script: Script, journal: Option<Value>) -> Rig {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let log: Log = Arc::default();
    let journal: Journal = Arc::new(Mutex::new(journal.map(|j| j.to_string())));
    tokio::spawn(serve(
        handle,
        Arc::clone(&log),
        Arc::clone(&journal),
        objects,
        script,
    ));
    let leases = LeaseStore::detached(client.clone());
    leases.apply(watcher::Event::Init);
    leases.apply(watcher::Event::InitApply(lease(LIVE)));
    leases.apply(watcher::Event::InitDone);
    let mut registry = Registry::default();
    let metrics = GcMetrics::register(&mut registry);
    let cfg = CollectorConfig {
        deletion_grace: GRACE,
        resync_interval: Duration::from_secs(3600),
        concurrency: 4,
        expired_grace: None,
        dry_run: false,
        journal: Some(JournalConfig {
            namespace: "svw".to_string(),
            name: "svw-gc-journal".to_string(),
        }),
    };
    let collector = Arc::new(Collector::new(client, leases.clone(), cfg, metrics, "test"));
    Rig {
        collector,
        leases,
        registry,
        log,
        journal,
    }
}

/// A term of the collector's on the rig, started by [`Rig::start`].
struct Term {
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Term {
    /// Ends the term and waits for the collector to return.
    async fn stop(self) {
        self.token.cancel();
        self.task.await.expect("the collector's task");
    }
}

impl Rig {
    fn start(&self) -> Term {
        let token = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&self.collector).lead(token.clone()));
        Term { token, task }
    }

    /// Starts a term and lets (paused) time run until `done` holds, at most `limit` of it.
    async fn start_until(&self, limit: Duration, done: impl FnMut(&Rig) -> bool) -> Term {
        let term = self.start();
        self.run_until(limit, done).await;
        term
    }

    fn calls(&self, method: &str, path_has: &str) -> Vec<Call> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|c| {
                c.method == method && c.path.contains(path_has) && !c.query.contains("watch=true")
            })
            .cloned()
            .collect()
    }

    /// The status writes (PUT of `/status`) the mock saw.
    fn puts(&self) -> Vec<Call> {
        self.calls("PUT", "/status")
    }

    /// Starts the term and runs it until its second `/status` write, which must carry
    /// resourceVersion 11 and the entries `want`. Returns the term and the writes.
    async fn until_the_second_write_at_11(&self, want: Value, why: &str) -> (Term, Vec<Call>) {
        let term = self
            .start_until(Duration::from_secs(120), |r| r.puts().len() == 2)
            .await;
        let puts = self.puts();
        assert_eq!(puts[1].body["metadata"]["resourceVersion"], "11");
        assert_eq!(puts[1].body["status"]["storageVersions"], want, "{why}");
        (term, puts)
    }

    fn metric(&self, name: &str) -> String {
        let text = storageversion_webhook::metrics::encode(&self.registry);
        text.lines()
            .filter(|l| l.starts_with(&format!("storageversion_webhook_gc_{name}")))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Lets (paused) time run until `done` holds, at most `limit` of it.
    async fn run_until(&self, limit: Duration, mut done: impl FnMut(&Rig) -> bool) {
        let end = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < end,
                "not done after {limit:?}: {:#?}",
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn lease_get(path: &str) -> Option<&str> {
    path.strip_prefix(LEASES)?.strip_prefix('/')
}

/// One StorageVersion, with only the entry of the gone apiserver.
fn gone_only() -> Vec<Value> {
    vec![sv("a.example.com.widgets", "10", &[GONE])]
}

/// The lease `id` is not found at the first GET and found at every GET after (its apiserver
/// came back).
fn gone_then_back(id: &'static str) -> Script {
    Script::new()
        .first(get_lease(id), not_found())
        .on(get_lease(id), found(id))
}

/// The gone apiserver's lease is not found, and a DELETE goes through.
fn gone_and_deleted() -> Script {
    let deleted = json!({"kind": "Status", "apiVersion": "v1", "status": "Success"});
    Script::new()
        .on(get_lease(GONE), not_found())
        .on(delete(), Reply::Json(200, deleted))
}

/// The grace, then one GET per gone lease, one write per object, and one more GET per lease
/// after the batch: the cost the design promises. The written status keeps a field this program does not know, and the stored copy's
/// resourceVersion.
#[tokio::test(start_paused = true)]
async fn one_get_per_lease_then_one_write_per_object_after_the_grace() {
    // More objects than the rig's concurrency (4), so that a collector recording each Event right
    // after its write would send one before the last writes.
    const N: usize = 6;
    let objects: Vec<Value> = (0..N)
        .map(|i| {
            sv(
                &format!("o{i}.example.com.widgets"),
                &format!("{}", 10 + i),
                &[GONE, LIVE],
            )
        })
        .collect();
    let script = Script::new()
        .on(get_lease(GONE), not_found())
        .on(put_status(), stored(200, "99"));
    let rig = rig(objects, script);
    let term = rig.start();

    tokio::time::sleep(GRACE / 3).await;
    assert!(
        rig.calls("GET", LEASES).is_empty(),
        "looked up before the grace"
    );
    assert!(
        rig.metric("stale_entries").ends_with(&format!(" {N}")),
        "{}",
        rig.metric("stale_entries")
    );

    rig.run_until(Duration::from_secs(120), |r| r.puts().len() == N)
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let gets = rig.calls("GET", LEASES);
    assert_eq!(
        gets.len(),
        2,
        "for the one gone lease, one GET before the batch and one after: {gets:#?}"
    );
    assert!(
        gets[0].at >= GRACE,
        "GET at {:?}, before the grace",
        gets[0].at
    );
    let puts = rig.puts();
    assert_eq!(puts.len(), N, "one write per object");
    assert!(
        puts.iter().all(|p| p.at <= gets[1].at),
        "the GET after the batch came before a write: {gets:#?}"
    );
    assert!(
        rig.calls("GET", SVS).len() == 1,
        "only the initial list read objects"
    );
    for put in &puts {
        let name = put.body["metadata"]["name"].as_str().unwrap();
        let i: u32 = name[1..2].parse().unwrap();
        assert_eq!(
            put.body["metadata"]["resourceVersion"],
            json!(format!("{}", 10 + i))
        );
        assert_eq!(put.body["status"]["storageVersions"], json!([entry(LIVE)]));
        assert_eq!(put.body["status"]["futureField"], json!({"kept": true}));
        assert!(put.body["metadata"].get("managedFields").is_none());
    }
    // One Event per changed object, recorded after the batch's writes (not between them).
    let log = rig.log.lock().unwrap().clone();
    let last_put = log
        .iter()
        .rposition(|c| c.method == "PUT" && c.path.ends_with("/status"));
    let events: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].method == "POST" && log[i].path.contains("/events"))
        .collect();
    assert_eq!(events.len(), N, "one Event per changed object: {log:#?}");
    assert!(
        events.iter().all(|&i| Some(i) > last_put),
        "an Event between the writes: {log:#?}"
    );
    term.stop().await;
    assert!(rig.metric("stale_entries").ends_with(" 0"));
}

/// The lease is back at the GET right before the write: nothing is written.
#[tokio::test(start_paused = true)]
async fn a_lease_back_at_the_recheck_keeps_every_entry() {
    let script = Script::new().on(get_lease(GONE), found(GONE));
    let rig = rig(
        vec![sv("a.example.com.widgets", "10", &[GONE, LIVE])],
        script,
    );
    let term = rig
        .start_until(Duration::from_secs(60), |r| {
            !r.calls("GET", LEASES).is_empty()
        })
        .await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert!(rig.calls("PUT", SVS).is_empty() && rig.calls("DELETE", SVS).is_empty());
    assert!(rig.metric("lease_checks").contains("result=\"present\""));
    term.stop().await;
}

/// A conflict from another writer: the object is read again, the lease it still names is
/// confirmed again after that read, and what is left of the fresh copy is written.
#[tokio::test(start_paused = true)]
async fn a_conflict_reads_again_confirms_again_and_writes_the_fresh_copy() {
    let name = "a.example.com.widgets";
    let script = Script::new()
        .on(get_lease(GONE), not_found())
        .first(put(), status(409, "Conflict"))
        // Another apiserver added itself meanwhile.
        .on(
            get(name),
            Reply::Json(200, sv(name, "11", &[GONE, LIVE, "apiserver-new"])),
        )
        .on(put(), echo());
    let rig = rig(vec![sv(name, "10", &[GONE, LIVE])], script);
    let want = json!([entry(LIVE), entry("apiserver-new")]);
    let (term, _) = rig
        .until_the_second_write_at_11(want, "what is left of the fresh copy")
        .await;
    // Confirmed twice, before the batch and again after the re-read; then once after the batch.
    let log = rig.log.lock().unwrap().clone();
    let reread = log
        .iter()
        .position(|c| c.method == "GET" && c.path.ends_with(name))
        .expect("the re-read");
    let lease_gets: Vec<usize> = (0..log.len())
        .filter(|&i| get_lease(GONE).matches(&log[i]))
        .collect();
    assert_eq!(lease_gets.len(), 3, "{log:#?}");
    assert!(
        lease_gets[1] > reread,
        "confirmed before the re-read: {log:#?}"
    );
    term.stop().await;
}

/// Defect 1 of the interleavings issue, through a conflict: the apiserver came back (re-created
/// its lease and wrote its entry again) after the confirming GET. The write of the old copy is
/// refused by its resourceVersion; the fresh copy's entry was written after that confirmation,
/// so it must not be judged by it: the lease is looked up again, found, and nothing is removed.
/// (The collector used to plan the fresh copy against the old confirmation and remove the
/// entry the apiserver had just written.)
#[tokio::test(start_paused = true)]
async fn a_returning_apiserver_keeps_the_entry_it_wrote_after_the_confirmation() {
    let name = "a.example.com.widgets";
    let script = gone_then_back(GONE)
        .on(put().at_rv("10"), status(409, "Conflict"))
        .on(get(name), Reply::Json(200, sv(name, "11", &[GONE, LIVE])));
    let rig = rig(vec![sv(name, "10", &[GONE, LIVE])], script);
    let term = rig
        .start_until(Duration::from_secs(120), |r| {
            r.calls("GET", LEASES).len() == 2
        })
        .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let puts = rig.puts();
    assert_eq!(
        puts.len(),
        1,
        "wrote the returned apiserver's entry away: {puts:#?}"
    );
    assert!(rig.calls("DELETE", SVS).is_empty());
    term.stop().await;
}

/// Defect 1 without a conflict: the watch delivers the object the returning apiserver wrote
/// while the confirming GET is under way, so the store holds the fresh copy (resourceVersion
/// 11) by the time the batch picks its targets. The batch must act on the copies it saw before
/// the GET: it writes resourceVersion 10, is refused, reads again, confirms again, and keeps
/// the entry. (The collector used to take the fresh copy from the store and remove the entry
/// with a valid resourceVersion.)
#[tokio::test(start_paused = true)]
async fn a_fresh_copy_in_the_store_is_not_judged_by_an_older_confirmation() {
    let name = "a.example.com.widgets";
    // The lease is gone now; the apiserver comes back before the answer arrives.
    let fresh = sv(name, "11", &[LIVE, GONE]);
    let back_meanwhile = Reply::Meanwhile {
        event: json!({"type": "MODIFIED", "object": fresh}),
        after: Duration::from_secs(1),
        reply: Box::new(not_found()),
    };
    let script = Script::new()
        .first(get_lease(GONE), back_meanwhile)
        .on(get_lease(GONE), found(GONE))
        .on(put().at_rv("10"), status(409, "Conflict"))
        // Only a write of the fresh copy gets here: it would succeed.
        .on(put(), echo())
        .on(get(name), Reply::Json(200, sv(name, "11", &[LIVE, GONE])));
    let rig = rig(vec![sv(name, "10", &[GONE, LIVE])], script);
    let term = rig
        .start_until(Duration::from_secs(120), |r| !r.puts().is_empty())
        .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let puts = rig.puts();
    assert!(
        puts.iter()
            .all(|p| p.body["metadata"]["resourceVersion"] == "10"),
        "wrote the fresh copy without its entry: {puts:#?}"
    );
    assert_eq!(puts.len(), 1, "{puts:#?}");
    term.stop().await;
}

/// The returning apiserver's write changed nothing: it came back after the confirming GET and
/// wrote its entry, unchanged, before the collector's write reached the object. kube-apiserver
/// short-circuits such a write (the resourceVersion stays), so the removal goes through. The
/// GET after the batch finds the lease back, and the entry is given back (read fresh, appended,
/// written with the fresh resourceVersion).
#[tokio::test(start_paused = true)]
async fn an_unchanged_entry_rewritten_by_a_returning_apiserver_is_given_back() {
    let name = "a.example.com.widgets";
    let script = gone_then_back(GONE)
        .on(put().at_rv("10"), stored(200, "11"))
        .on(get(name), Reply::Json(200, sv(name, "11", &[LIVE])))
        .on(put(), echo());
    let rig = rig(vec![sv(name, "10", &[LIVE, GONE])], script);
    let want = json!([entry(LIVE), entry(GONE)]);
    let (term, puts) = rig
        .until_the_second_write_at_11(want, "the entry was not given back")
        .await;
    assert_eq!(
        puts[0].body["status"]["storageVersions"],
        json!([entry(LIVE)])
    );
    assert_eq!(puts[1].body["status"]["futureField"], json!({"kept": true}));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(rig.puts().len(), 2);
    term.stop().await;
}

/// Issue 30 (simulation seed 1623): the same returning apiserver, but the write that removed
/// its entry got no answer within the call's deadline, though the apiserver applied it. A write
/// without a good answer may have gone through, so its removals are checked like those of a
/// write that did: the lease is back, and the entry is given back. It used to be left out of the
/// give-back, and the entry stayed gone until the apiserver's next refresh.
#[tokio::test(start_paused = true)]
async fn an_entry_removed_by_a_write_that_got_no_answer_is_given_back() {
    let name = "a.example.com.widgets";
    let script = gone_then_back(GONE)
        .first(put().at_rv("10"), Reply::Hold)
        .on(get(name), Reply::Json(200, sv(name, "11", &[LIVE])))
        .on(put(), echo());
    let rig = rig(vec![sv(name, "10", &[LIVE, GONE])], script);
    let want = json!([entry(LIVE), entry(GONE)]);
    let (term, _) = rig
        .until_the_second_write_at_11(want, "the entry was not given back")
        .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(rig.puts().len(), 2);
    term.stop().await;
}

/// Issue 30 (simulation seeds 80 and 133): the object's last entry is the returning apiserver's.
/// Its unchanged rewrite kept the resourceVersion, so the preconditioned DELETE went through; the
/// give-back finds the lease back and the object gone, creates it again, and writes the entry.
#[tokio::test(start_paused = true)]
async fn a_deleted_object_is_created_again_for_a_returning_apiserver() {
    let name = "a.example.com.widgets";
    let script = gone_then_back(GONE)
        .on(
            delete(),
            Reply::Json(200, json!({"kind": "Status", "status": "Success"})),
        )
        // Gone until something was POSTed (an Event counts too).
        .until(get(name), post(), not_found())
        .on(post(), stored(201, "12"))
        .on(get(name), Reply::Json(200, sv(name, "12", &[])))
        .on(put(), echo());
    let rig = rig(vec![sv(name, "10", &[GONE])], script);
    let term = rig
        .start_until(Duration::from_secs(120), |r| r.puts().len() == 1)
        .await;
    assert_eq!(rig.calls("DELETE", SVS).len(), 1);
    let posts = rig.calls("POST", SVS);
    assert_eq!(posts.len(), 1, "the object was not created again");
    assert_eq!(posts[0].body["metadata"]["name"], name);
    let puts = rig.puts();
    assert_eq!(puts[0].body["metadata"]["resourceVersion"], "12");
    assert_eq!(
        puts[0].body["status"]["storageVersions"],
        json!([entry(GONE)]),
        "the entry was not given back"
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(rig.calls("POST", SVS).len(), 1);
    term.stop().await;
}

/// Issue 30, seed 347: after creating the object again, the give-back's GET of it fails once
/// (a 500). The give-back tries again and the entry is back; it used to give up there.
#[tokio::test(start_paused = true)]
async fn a_give_back_whose_read_fails_once_tries_again() {
    let name = "a.example.com.widgets";
    let mut reads_after_create = 0;
    let script = gone_then_back(GONE)
        .on(
            delete(),
            Reply::Json(200, json!({"kind": "Status", "status": "Success"})),
        )
        .until(get(name), post(), not_found())
        .on(post(), stored(201, "12"))
        .on(
            get(name),
            Answer::with(move |_| {
                reads_after_create += 1;
                if reads_after_create == 1 {
                    status(500, "injected")
                } else {
                    Reply::Json(200, sv(name, "12", &[]))
                }
            }),
        )
        .on(put(), echo());
    let rig = rig(vec![sv(name, "10", &[GONE])], script);
    let term = rig
        .start_until(Duration::from_secs(120), |r| r.puts().len() == 1)
        .await;
    assert_eq!(
        rig.calls("GET", name).len(),
        3,
        "404, the 500, then the read it wrote on"
    );
    assert_eq!(
        rig.puts()[0].body["status"]["storageVersions"],
        json!([entry(GONE)]),
        "the entry was not given back"
    );
    term.stop().await;
}

/// The answer to the GETs of lease `id`: 404, and right after the first one the lease is back
/// in the watch. The slot takes the rig's lease store once the rig exists.
fn back_after_the_first_get(id: &'static str) -> (Answer, Arc<Mutex<Option<LeaseStore>>>) {
    let store: Arc<Mutex<Option<LeaseStore>>> = Arc::default();
    let handle = Arc::clone(&store);
    let mut looked = 0;
    let answer = Answer::with(move |_| {
        looked += 1;
        if looked == 1 {
            if let Some(s) = handle.lock().unwrap().as_ref() {
                s.apply(watcher::Event::Apply(lease(id)));
            }
        }
        not_found()
    });
    (answer, store)
}

/// Issue 30, seed 309: a write that found the lease back in the watch planned nothing for the
/// object; when the lease goes again the object, at the same resourceVersion (an apiserver's
/// unchanged rewrites never move it), is still collected.
#[tokio::test(start_paused = true)]
async fn an_object_spared_for_a_returning_lease_is_collected_when_it_goes_again() {
    let name = "a.example.com.widgets";
    let (back_after_the_first_get, store) = back_after_the_first_get(GONE);
    let script = Script::new()
        .on(get_lease(GONE), back_after_the_first_get)
        .on(put(), echo());
    let rig = rig(vec![sv(name, "10", &[LIVE, GONE])], script);
    *store.lock().unwrap() = Some(rig.leases.clone());
    let term = rig
        .start_until(Duration::from_secs(120), |r| {
            !r.calls("GET", LEASES).is_empty()
        })
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(rig.puts().is_empty(), "spared while the lease looked back");
    // The lease goes again; the object has not changed.
    rig.leases.apply(watcher::Event::Delete(lease(GONE)));
    rig.run_until(Duration::from_secs(120), |r| r.puts().len() == 1)
        .await;
    assert_eq!(
        rig.puts()[0].body["status"]["storageVersions"],
        json!([entry(LIVE)]),
        "the entry of the lease gone again was not removed"
    );
    term.stop().await;
}

/// The watch delivers the lease back before the write: the write is not sent at all.
#[tokio::test(start_paused = true)]
async fn a_lease_the_watch_shows_back_before_the_write_stops_it() {
    let name = "a.example.com.widgets";
    // The lease is created right after this GET looked; the watch brings it.
    let (created_after_the_get, store) = back_after_the_first_get(GONE);
    let script = Script::new().on(get_lease(GONE), created_after_the_get);
    let rig = rig(vec![sv(name, "10", &[LIVE, GONE])], script);
    *store.lock().unwrap() = Some(rig.leases.clone());
    let term = rig
        .start_until(Duration::from_secs(120), |r| {
            !r.calls("GET", LEASES).is_empty()
        })
        .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(rig.calls("PUT", SVS).is_empty() && rig.calls("DELETE", SVS).is_empty());
    term.stop().await;
}

/// Defect 2 of the interleavings issue: the deletion grace restarts when the lease comes back.
/// Deleted at t0, back at t0+5 s, deleted again at t0+28 s: nothing may be looked up or removed
/// before t0+28 s + the grace. (The collector used to keep the first absence's clock and remove
/// the entries at t0+30 s, after 2 s of absence.)
#[tokio::test(start_paused = true)]
async fn the_grace_restarts_when_a_lease_comes_back() {
    let rig = rig(gone_only(), gone_and_deleted());
    let store = rig.leases.clone();
    store.apply(watcher::Event::Apply(lease(GONE)));
    let t0 = Instant::now();
    let term = rig.start();
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.apply(watcher::Event::Delete(lease(GONE)));
    tokio::time::sleep(Duration::from_secs(4)).await;
    store.apply(watcher::Event::Apply(lease(GONE)));
    tokio::time::sleep(Duration::from_secs(23)).await;
    store.apply(watcher::Event::Delete(lease(GONE)));
    let second = Instant::now();
    rig.run_until(Duration::from_secs(120), |r| {
        r.calls("DELETE", SVS).len() == 1
    })
    .await;
    let gets = rig.calls("GET", LEASES);
    let first_get = t0 + gets[0].at;
    assert!(
        first_get >= second + GRACE,
        "looked up {:?} after the second deletion, before the grace ({GRACE:?})",
        first_get - second
    );
    term.stop().await;
}

/// A lookup that fails removes nothing, and is retried with backoff.
#[tokio::test(start_paused = true)]
async fn lookup_errors_remove_nothing() {
    let script = Script::new().on(get_lease(GONE), status(500, "InternalError"));
    let rig = rig(gone_only(), script);
    let term = rig
        .start_until(Duration::from_secs(120), |r| {
            r.calls("GET", LEASES).len() >= 4
        })
        .await;
    assert!(rig.calls("DELETE", SVS).is_empty() && rig.calls("PUT", SVS).is_empty());
    let gets = rig.calls("GET", LEASES);
    assert!(
        gets[1].at > gets[0].at && gets[3].at - gets[2].at >= gets[1].at - gets[0].at,
        "backoff: {gets:#?}"
    );
    term.stop().await;
}

/// Hand-over: a term that ends stops at once (nothing looked up or written after), and the next
/// term counts its grace from its own start.
#[tokio::test(start_paused = true)]
async fn a_new_term_counts_the_grace_from_its_start() {
    let rig = rig(gone_only(), gone_and_deleted());
    let term = rig.start();
    tokio::time::sleep(GRACE - Duration::from_secs(5)).await;
    term.stop().await;
    tokio::time::sleep(GRACE).await;
    assert!(
        rig.calls("GET", LEASES).is_empty(),
        "looked up after the term ended"
    );

    let second = Instant::now();
    let term = rig
        .start_until(Duration::from_secs(120), |r| {
            r.calls("DELETE", SVS).len() == 1
        })
        .await;
    assert!(
        second.elapsed() >= GRACE,
        "the new term did not wait its own grace"
    );
    let delete = &rig.calls("DELETE", SVS)[0];
    assert_eq!(delete.body["preconditions"]["resourceVersion"], "10");
    assert_eq!(
        delete.body["preconditions"]["uid"],
        "uid-a.example.com.widgets"
    );
    term.stop().await;
}

/// The journal (I1 across terms): a batch's removals are written down before its first write,
/// and cleared once its give-back check is done.
#[tokio::test(start_paused = true)]
async fn a_batch_writes_its_removals_down_before_its_first_write_and_clears_them_after() {
    let names = ["a.example.com.widgets", "b.example.com.widgets"];
    let objects = names.iter().map(|n| sv(n, "10", &[GONE, LIVE])).collect();
    let script = Script::new()
        .on(get_lease(GONE), not_found())
        .on(put_status(), stored(200, "99"));
    let rig = rig(objects, script);
    let term = rig
        .start_until(Duration::from_secs(120), |r| {
            r.puts().len() == 2 && r.calls("PATCH", JOURNAL).len() == 2
        })
        .await;
    let patches = rig.calls("PATCH", JOURNAL);
    let puts = rig.puts();
    assert!(
        puts.iter().all(|p| patches[0].at <= p.at) && puts.iter().all(|p| p.at <= patches[1].at),
        "the record must come before every write and the clear after: {patches:#?} {puts:#?}"
    );
    let record: Value = serde_json::from_str(
        patches[0].body["data"]["removals"]
            .as_str()
            .expect("a record"),
    )
    .expect("JSON");
    let mut recorded: Vec<&str> = record
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            assert_eq!(r["entries"], json!([entry(GONE)]), "{record}");
            r["storageVersion"].as_str().expect("a name")
        })
        .collect();
    recorded.sort();
    assert_eq!(recorded, names);
    assert_eq!(patches[1].body["data"]["removals"], "[]");
    assert_eq!(rig.journal.lock().unwrap().as_deref(), Some("[]"));
    term.stop().await;
}

/// A term that ended between its writes and its give-back left its record; the next term reads
/// it before its first pass and gives back the entry of the apiserver found back, then clears it.
#[tokio::test(start_paused = true)]
async fn a_new_term_gives_back_what_the_journal_of_an_earlier_term_names() {
    let name = "a.example.com.widgets";
    let record = json!([{"storageVersion": name, "entries": [entry(GONE)]}]);
    let script = Script::new()
        .on(get_lease(GONE), found(GONE))
        .on(get(name), Reply::Json(200, sv(name, "11", &[LIVE])))
        .on(put_status(), echo());
    let rig = rig_with_journal(vec![sv(name, "11", &[LIVE])], script, Some(record));
    let term = rig
        .start_until(Duration::from_secs(60), |r| {
            r.calls("PATCH", JOURNAL).len() == 1
        })
        .await;
    let puts = rig.puts();
    assert_eq!(puts.len(), 1, "the entry was not given back: {puts:#?}");
    assert_eq!(
        puts[0].body["status"]["storageVersions"],
        json!([entry(LIVE), entry(GONE)])
    );
    assert_eq!(puts[0].body["metadata"]["resourceVersion"], "11");
    assert!(rig.calls("PATCH", JOURNAL)[0].at >= puts[0].at);
    assert_eq!(rig.journal.lock().unwrap().as_deref(), Some("[]"));
    term.stop().await;
}

/// The record names an apiserver whose lease is still gone: nothing is written but the clear.
#[tokio::test(start_paused = true)]
async fn a_record_of_an_apiserver_still_gone_gives_nothing_back() {
    let name = "a.example.com.widgets";
    let record = json!([{"storageVersion": name, "entries": [entry(GONE)]}]);
    let script = Script::new().on(get_lease(GONE), not_found());
    let rig = rig_with_journal(vec![sv(name, "11", &[LIVE])], script, Some(record));
    let term = rig
        .start_until(Duration::from_secs(60), |r| {
            r.calls("PATCH", JOURNAL).len() == 1
        })
        .await;
    assert!(rig.puts().is_empty() && rig.calls("GET", &format!("{SVS}/")).is_empty());
    assert_eq!(rig.journal.lock().unwrap().as_deref(), Some("[]"));
    term.stop().await;
}

/// The journal cannot be read: nothing is collected (a pass would overwrite the record) until
/// it can.
#[tokio::test(start_paused = true)]
async fn no_pass_runs_before_the_journal_is_read() {
    let journal_get = Req::new(|c| c.method == "GET" && c.path == JOURNAL);
    let script = Script::new()
        .until(
            journal_get,
            Req::new(|c| c.at >= Duration::from_secs(60)),
            status(500, "InternalError"),
        )
        .on(get_lease(GONE), not_found())
        .on(
            delete(),
            Reply::Json(200, json!({"kind": "Status", "status": "Success"})),
        );
    let rig = rig(gone_only(), script);
    let term = rig
        .start_until(Duration::from_secs(180), |r| {
            !r.calls("DELETE", SVS).is_empty()
        })
        .await;
    let first_lease_get = rig.calls("GET", LEASES)[0].at;
    assert!(
        first_lease_get >= Duration::from_secs(60),
        "a pass ran before the journal was read, at {first_lease_get:?}"
    );
    assert!(rig.calls("GET", JOURNAL).len() >= 2);
    assert!(
        rig.metric("errors_total").contains("journal"),
        "{}",
        rig.metric("errors")
    );
    term.stop().await;
}

//! After a batch: the entries given back to an apiserver found back
//! ([`Term::give_back_if_returned`]).
//!
//! Invariant I1 (docs/gc.md), its one gap: an apiserver that comes back and rewrites its entry
//! unchanged before the batch's write reaches the object. kube-apiserver keeps a write that
//! changes nothing out of etcd, so the resourceVersion stays and the removal goes through. So,
//! one more live GET per lease whose entries the batch removed, or may have removed (a write
//! that got no good answer may still have been applied): a lease found back was created
//! before that GET, so any such rewrite came before it too. Its removed entries are given back
//! where its apiserver has none now (read fresh, written with the fresh resourceVersion; the
//! apiserver's own newer entry wins). An object the batch deleted is created again first.
//!
//! Invariant I6 (API calls per event): one more GET per lease whose entries were removed; only
//! for a lease found back, per object one GET and one write (more only on conflicts, at most
//! `MAX_CONFLICT_RETRIES`).

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use super::{backoff, is_status, Term, MAX_CONFLICT_RETRIES};
use crate::gc::plan::{self, LeaseState};
use crate::model::{ServerStorageVersion, StorageVersion};

impl Term {
    /// After a batch: one more live GET per lease whose entries it removed. A lease that is
    /// back was created before this GET, perhaps before some of the batch's writes, and its
    /// apiserver may have written its unchanged entry in between: kube-apiserver short-circuits
    /// a write that changes nothing, so the resourceVersion did not move and the precondition
    /// let the removal through. Its removed entries are given back where it has none now (its
    /// own newer entry always wins). `None` if the term ended.
    pub(super) async fn give_back_if_returned(
        &self,
        removed: &[(&str, &[ServerStorageVersion])],
    ) -> Option<()> {
        let ids: BTreeSet<&str> = removed
            .iter()
            .flat_map(|(_, entries)| entries.iter().map(|e| e.api_server_id.as_str()))
            .collect();
        let mut back = BTreeSet::new();
        for id in ids {
            // A lookup that fails is asked again (with backoff, for as long as the term lasts):
            // the journal stays until this check is done, and an unknown answer decides nothing.
            let mut attempt = 0;
            let state = loop {
                let lookup = self.lookup(id).await?;
                let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
                if !matches!(state, LeaseState::Unknown(_)) {
                    break state;
                }
                attempt += 1;
                self.cancellable(tokio::time::sleep(backoff(attempt)))
                    .await?;
            };
            if !state.is_gone() {
                back.insert(id);
            }
        }
        if back.is_empty() {
            return Some(());
        }
        tracing::info!(apiservers = ?back, "identity lease back during the batch; giving its removed entries back");
        let now = plan::format_time(Timestamp::now());
        for (name, entries) in removed {
            let returned: Vec<ServerStorageVersion> = entries
                .iter()
                .filter(|e| back.contains(e.api_server_id.as_str()))
                .cloned()
                .collect();
            if !returned.is_empty() {
                self.give_back(name, &returned, &now).await?;
            }
        }
        Some(())
    }

    /// Appends `entries` to object `name` where their apiserver has none now (read fresh, written
    /// with its resourceVersion; a conflict reads again). An object the batch deleted is created
    /// again first: an apiserver that came back and rewrote its unchanged entry before the
    /// DELETE (which the precondition could not stop) gets its entry back now, not at its next
    /// 10-minute refresh.
    async fn give_back(
        &self,
        name: &str,
        entries: &[ServerStorageVersion],
        now: &str,
    ) -> Option<()> {
        // Conflicts are bounded (each one is a write of the apiserver itself, which carries its
        // own entry); a failure that may pass (5xx, 429, no answer) is retried with backoff for
        // as long as the term lasts, since nothing else would give these entries back before
        // the apiserver's next refresh (seed 347: an injected 500 on the GET after the
        // re-creation lost them). A refusal that will not pass (another 4xx) is given up.
        let (mut conflicts, mut failures) = (0, 0);
        loop {
            let got = self
                .call("GET storageversion", self.c.svs.get_opt(name))
                .await?;
            let fresh = match got {
                Ok(Some(fresh)) => fresh.trim(),
                Ok(None) => {
                    // The batch deleted it (these were its last entries): create it again, and
                    // its status at the next attempt (kube-apiserver drops status on create).
                    // An apiserver that created it meanwhile wins: AlreadyExists reads it again.
                    if let Err(e) = self.recreate(name).await? {
                        if !self.wait_if_it_may_pass(&e, &mut failures).await? {
                            return Some(());
                        }
                    }
                    continue;
                }
                Err(e) => {
                    self.c.metrics.error("get_storage_version");
                    tracing::warn!(storageversion = name, error = %e, "cannot read StorageVersion to give entries back");
                    if !self.wait_if_it_may_pass(&e, &mut failures).await? {
                        return Some(());
                    }
                    continue;
                }
            };
            let Some(restored) = plan::restore(&fresh.to_model(), entries, now) else {
                return Some(());
            };
            let body = fresh.with_status(restored.status);
            let pp = PostParams::default();
            let put = self.c.svs.replace_status(name, &pp, &body);
            match self.call("PUT storageversion status", put).await? {
                Ok(_) => {
                    self.c.metrics.write("give_back", "ok");
                    self.c.metrics.check("given_back");
                    tracing::info!(
                        storageversion = name,
                        "gave back the entries of an apiserver that came back"
                    );
                    return Some(());
                }
                Err(e) if is_status(&e, 409) => {
                    self.c.metrics.write("give_back", "conflict");
                    conflicts += 1;
                    if conflicts > MAX_CONFLICT_RETRIES {
                        return Some(());
                    }
                    self.cancellable(tokio::time::sleep(backoff(conflicts)))
                        .await?;
                }
                Err(e) if is_status(&e, 404) => {}
                Err(e) => {
                    self.c.metrics.write("give_back", "error");
                    self.c.metrics.error("give_back");
                    tracing::warn!(storageversion = name, error = %e, "cannot give entries back");
                    if !self.wait_if_it_may_pass(&e, &mut failures).await? {
                        return Some(());
                    }
                }
            }
        }
    }

    /// After a failed call of the give-back: `Some(true)` once the backoff for one more failure
    /// has passed if the call may succeed when sent again, `Some(false)` (give up) if it will
    /// not, `None` if the term ended while waiting.
    async fn wait_if_it_may_pass(&self, e: &kube::Error, failures: &mut u32) -> Option<bool> {
        if !may_pass(e) {
            return Some(false);
        }
        *failures += 1;
        self.cancellable(tokio::time::sleep(backoff(*failures)))
            .await?;
        Some(true)
    }

    /// Creates the StorageVersion `name` again, empty (its entries are written by the caller's
    /// next attempt through `/status`). `Ok` when it exists now (created, or someone else did);
    /// `None` if the term ended.
    async fn recreate(&self, name: &str) -> Option<Result<(), kube::Error>> {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some(name.to_string());
        let api: Api<StorageVersion> = Api::all(self.c.svs.clone().into_client());
        let pp = PostParams::default();
        let create = api.create(&pp, &sv);
        Some(match self.call("POST storageversion", create).await? {
            Ok(_) => {
                self.c.metrics.write("recreate", "ok");
                tracing::info!(
                    storageversion = name,
                    "created again to give back the entries of an apiserver that came back"
                );
                Ok(())
            }
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => {
                self.c.metrics.write("recreate", "error");
                self.c.metrics.error("recreate");
                tracing::warn!(storageversion = name, error = %e, "cannot create StorageVersion again to give entries back");
                Err(e)
            }
        })
    }
}

/// Whether a failed call may succeed if sent again: a server error, 429, or no answer at all.
fn may_pass(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        _ => true,
    }
}

//! The record of a batch: one Normal Event per changed (or deleted) object, published once all
//! the batch's writes are done ([`Term::publish`]), best effort (a failure is counted and logged,
//! and never makes a write retry); and how removals are described ([`describe`]).
//!
//! Invariant I6 (API calls per event): one Event per changed object.

use kube::runtime::events::{Event, EventType};

use super::{Term, CALL_TIMEOUT};
use crate::gc::plan::Removal;
use crate::model::ServerStorageVersion;

/// Longest an Event note may be (the API allows 1 kB).
const MAX_NOTE: usize = 1000;

/// A Normal Event to record on a changed (or deleted) StorageVersion.
pub(super) struct EventNote {
    pub(super) name: String,
    pub(super) reference: k8s_openapi::api::core::v1::ObjectReference,
    pub(super) reason: &'static str,
    pub(super) note: String,
    /// The entries the write removed, as they were: given back if their apiserver turns out to
    /// have come back during the batch ([`Term::give_back`]).
    pub(super) removed: Vec<ServerStorageVersion>,
}

impl Term {
    /// Records a Normal Event (best effort: a failure is counted and logged).
    pub(super) async fn publish(&self, note: EventNote) {
        let EventNote {
            name,
            reference,
            reason,
            note,
            ..
        } = note;
        let event = Event {
            type_: EventType::Normal,
            reason: reason.to_string(),
            note: Some(truncate(note, MAX_NOTE)),
            action: "GarbageCollect".to_string(),
            secondary: None,
        };
        let published = self
            .cancellable(tokio::time::timeout(
                CALL_TIMEOUT,
                self.c.recorder.publish(&event, &reference),
            ))
            .await;
        match published {
            Some(Ok(Ok(()))) | None => {}
            Some(Ok(Err(e))) => {
                self.c.metrics.error("event");
                tracing::warn!(storageversion = name, error = %e, "cannot record Event");
            }
            Some(Err(_)) => {
                self.c.metrics.error("event");
                tracing::warn!(storageversion = name, "recording an Event timed out");
            }
        }
    }
}

/// `apiserver-a (its identity lease does not exist), apiserver-b (...)`.
pub fn describe(removed: &[Removal]) -> String {
    removed
        .iter()
        .map(|r| format!("{} ({})", r.id, r.reason))
        .collect::<Vec<_>>()
        .join(", ")
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_bounded() {
        let s = truncate("é".repeat(600), 1000);
        assert!(s.len() <= 1000 && s.ends_with("..."));
        assert_eq!(truncate("short".into(), 1000), "short");
    }
}

//! The CRD migrator's decision, case by case (invariants I7, I8 in docs/crd.md).

use super::*;

const SETTLE: Duration = Duration::from_secs(60);
const RETRY: Duration = Duration::from_secs(600);
const TIMING: Timing = Timing {
    settle: SETTLE,
    retry: RETRY,
};

fn crd(storage: &str, stored: &[&str], generation: i64) -> Snapshot {
    Snapshot {
        name: "widgets.example.com".into(),
        uid: "u1".into(),
        generation,
        resource_version: "10".into(),
        established: true,
        terminating: false,
        storage: Some(storage.into()),
        served: vec!["v1beta1".into(), "v1".into()],
        stored: stored.iter().map(|s| s.to_string()).collect(),
    }
}

/// Folds `crd` into `seen` and decides.
fn step(
    c: &Snapshot,
    r: Option<&Record>,
    seen: &mut Option<Seen>,
    now: Instant,
    method: Option<Method>,
) -> Decision {
    let s = Seen::observe(seen.as_ref(), c, now);
    let d = decide(c, r, &s, now, TIMING, method, 0);
    *seen = Some(s.after(&d, now));
    d
}

fn finish(r: &mut Record, phase: Phase) {
    if let Some(m) = r.migration.as_mut() {
        m.phase = phase;
    }
}

#[test]
fn nothing_to_do_for_up_to_date_unready_or_storage_less_crds() {
    let t0 = Instant::now();
    let mut seen = None;
    let c = crd("v1", &["v1"], 1);
    assert_eq!(
        step(&c, None, &mut seen, t0, Some(Method::Rewrite)),
        Decision::UpToDate
    );
    let mut c2 = crd("v1", &["v1beta1", "v1"], 2);
    c2.established = false;
    assert_eq!(
        step(&c2, None, &mut seen, t0, Some(Method::Rewrite)),
        Decision::NotReady
    );
    c2.established = true;
    c2.terminating = true;
    assert_eq!(
        step(&c2, None, &mut seen, t0, Some(Method::Rewrite)),
        Decision::NotReady
    );
    c2.terminating = false;
    c2.storage = None;
    assert_eq!(
        step(&c2, None, &mut seen, t0, Some(Method::Rewrite)),
        Decision::NotReady
    );
}

#[test]
fn a_migration_begins_only_after_the_crd_held_still_for_the_settle_time() {
    let t0 = Instant::now();
    let mut seen = None;
    let c = crd("v1", &["v1beta1", "v1"], 2);
    assert_eq!(
        step(&c, None, &mut seen, t0, Some(Method::Rewrite)),
        Decision::Settle { remaining: SETTLE }
    );
    let t1 = t0 + Duration::from_secs(59);
    assert_eq!(
        step(&c, None, &mut seen, t1, Some(Method::Rewrite)),
        Decision::Settle {
            remaining: Duration::from_secs(1)
        }
    );
    // A change restarts the clock.
    let c3 = crd("v1", &["v1beta1", "v1"], 3);
    assert_eq!(
        step(&c3, None, &mut seen, t1, Some(Method::Rewrite)),
        Decision::Settle { remaining: SETTLE }
    );
    assert!(matches!(
        step(
            &c3,
            None,
            &mut seen,
            t1 + SETTLE - Duration::from_millis(1),
            Some(Method::Rewrite)
        ),
        Decision::Settle { .. }
    ));
    assert_eq!(
        step(&c3, None, &mut seen, t1 + SETTLE, Some(Method::Rewrite)),
        Decision::Start {
            sequence: 1,
            method: Method::Rewrite
        }
    );
    assert_eq!(
        step(&c3, None, &mut seen, t1 + SETTLE, Some(Method::Svm)),
        Decision::Start {
            sequence: 1,
            method: Method::Svm
        }
    );
    assert_eq!(
        step(&c3, None, &mut seen, t1 + SETTLE, None),
        Decision::NoMethod
    );
}

#[test]
fn a_rewrite_that_succeeded_and_still_covers_the_crd_prunes_to_the_storage_version() {
    let t0 = Instant::now();
    let c = crd("v1", &["v1beta1", "v1"], 2);
    let mut r = Record::begin(&c, "m-1", 1, Method::Rewrite).expect("storage");
    let mut seen = None;
    assert_eq!(
        step(&c, Some(&r), &mut seen, t0, Some(Method::Rewrite)),
        Decision::Run
    );
    assert_eq!(pruned(&c, Some(&r)), None, "not before it succeeded");
    finish(&mut r, Phase::Succeeded);
    assert_eq!(
        step(&c, Some(&r), &mut seen, t0, Some(Method::Rewrite)),
        Decision::Prune {
            storage: "v1".into()
        }
    );
    assert_eq!(pruned(&c, Some(&r)), Some(vec!["v1".to_string()]));
    // After the prune: up to date, nothing more.
    let done = crd("v1", &["v1"], 2);
    assert_eq!(
        step(&done, Some(&r), &mut seen, t0, Some(Method::Rewrite)),
        Decision::UpToDate
    );
    assert_eq!(pruned(&done, Some(&r)), None);
}

/// I7: a storage flip, a generation change, or a version joining storedVersions during the
/// migration: its success prunes nothing, and a new migration follows after the settle time.
#[test]
fn a_crd_changed_during_the_migration_is_never_pruned_on_it() {
    let t0 = Instant::now();
    let began = crd("v1", &["v1beta1", "v1"], 2);
    let changes = [
        ("storage flipped", crd("v2", &["v1beta1", "v1", "v2"], 3)),
        (
            "storage flipped back",
            crd("v1beta1", &["v1beta1", "v1"], 3),
        ),
        ("generation", crd("v1", &["v1beta1", "v1"], 3)),
        (
            "version joined",
            crd("v1", &["v1alpha1", "v1beta1", "v1"], 2),
        ),
    ];
    for (what, now) in changes {
        for method in [Method::Rewrite, Method::Svm] {
            let mut r = Record::begin(&began, "m-1", 1, method).expect("storage");
            let mut seen = None;
            let d = step(&now, Some(&r), &mut seen, t0, Some(method));
            match method {
                Method::Rewrite => {
                    assert!(matches!(d, Decision::Abandon { .. }), "{what}: {d:?}")
                }
                Method::Svm => assert_eq!(d, Decision::Run, "{what}: waits for the SVM's end"),
            }
            // Whatever the migration's outcome, no prune on it.
            for phase in [Phase::Succeeded, Phase::Failed, Phase::Abandoned] {
                finish(&mut r, phase);
                assert_eq!(pruned(&now, Some(&r)), None, "{what} {phase:?}");
                let d = step(&now, Some(&r), &mut seen, t0, Some(method));
                assert!(
                    !matches!(
                        d,
                        Decision::Prune { .. } | Decision::AwaitPrune | Decision::Failed { .. }
                    ),
                    "{what} {phase:?}: {d:?}"
                );
                if now.up_to_date() {
                    continue;
                }
                assert!(matches!(d, Decision::Settle { .. }), "{what}: {d:?}");
                assert_eq!(
                    step(&now, Some(&r), &mut seen, t0 + SETTLE, Some(method)),
                    Decision::Start {
                        sequence: 2,
                        method
                    },
                    "{what}: the next migration has the next number"
                );
            }
        }
    }
}

/// I8: one migration at a time: while ours runs, however long, nothing else begins, also
/// after the CRD changed (the running one is stopped or waited for first).
#[test]
fn nothing_begins_while_one_of_ours_runs() {
    let t0 = Instant::now();
    let began = crd("v1", &["v1beta1", "v1"], 2);
    for method in [Method::Rewrite, Method::Svm] {
        let r = Record::begin(&began, "m-1", 1, method).expect("storage");
        let mut seen = None;
        for (i, c) in [began.clone(), crd("v2", &["v1beta1", "v1", "v2"], 3)]
            .iter()
            .enumerate()
        {
            for k in 0..5u64 {
                let now = t0 + SETTLE * (k as u32 + 1) * 10;
                let d = step(c, Some(&r), &mut seen, now, Some(method));
                assert!(
                    !matches!(d, Decision::Start { .. }),
                    "{method:?} change {i} after {k}: {d:?}"
                );
            }
        }
    }
}

#[test]
fn kube_controller_manager_pruning_first_leaves_us_nothing_to_do() {
    let t0 = Instant::now();
    let began = crd("v1", &["v1beta1", "v1"], 2);
    for method in [Method::Rewrite, Method::Svm] {
        let mut r = Record::begin(&began, "m-1", 1, method).expect("storage");
        // Pruned (status only: the generation stays) while ours still runs, or after.
        let pruned_by_kcm = crd("v1", &["v1"], 2);
        let mut seen = None;
        assert_eq!(
            step(&pruned_by_kcm, Some(&r), &mut seen, t0, Some(method)),
            Decision::Run
        );
        finish(&mut r, Phase::Succeeded);
        assert_eq!(
            step(&pruned_by_kcm, Some(&r), &mut seen, t0, Some(method)),
            Decision::UpToDate
        );
        assert_eq!(pruned(&pruned_by_kcm, Some(&r)), None);
    }
    // Ours was a StorageVersionMigration: we leave the prune to kube-controller-manager for
    // KCM_PRUNE_GRACE (from the first time we see it pending), and prune ourselves after that
    // (1.35's migrator never prunes); a change of the CRD in between starts the wait again.
    let mut r = Record::begin(&began, "m-1", 1, Method::Svm).expect("storage");
    finish(&mut r, Phase::Succeeded);
    let mut seen = None;
    let t1 = t0 + SETTLE * 10;
    for at in [
        t1,
        t1 + KCM_PRUNE_GRACE / 2,
        t1 + KCM_PRUNE_GRACE - Duration::from_millis(1),
    ] {
        assert_eq!(
            step(&began, Some(&r), &mut seen, at, Some(Method::Svm)),
            Decision::AwaitPrune
        );
    }
    assert_eq!(
        step(
            &began,
            Some(&r),
            &mut seen,
            t1 + KCM_PRUNE_GRACE,
            Some(Method::Svm)
        ),
        Decision::Prune {
            storage: "v1".into()
        }
    );
    assert_eq!(pruned(&began, Some(&r)), Some(vec!["v1".to_string()]));
    // A version joined storedVersions: the migration no longer covers, nothing is pruned.
    let joined = crd("v1", &["v1alpha1", "v1beta1", "v1"], 2);
    assert_eq!(pruned(&joined, Some(&r)), None);
    // A new term (no memory of the wait) waits again.
    let mut fresh = None;
    assert_eq!(
        step(
            &began,
            Some(&r),
            &mut fresh,
            t1 + KCM_PRUNE_GRACE * 3,
            Some(Method::Svm)
        ),
        Decision::AwaitPrune
    );
}

#[test]
fn a_deleted_or_recreated_crd_stops_the_rewrite_and_starts_afresh() {
    let t0 = Instant::now();
    let began = crd("v1", &["v1beta1", "v1"], 2);
    let r = Record::begin(&began, "m-1", 1, Method::Rewrite).expect("storage");
    let mut deleting = began.clone();
    deleting.terminating = true;
    let mut seen = None;
    assert!(matches!(
        step(&deleting, Some(&r), &mut seen, t0, Some(Method::Rewrite)),
        Decision::Abandon { .. }
    ));
    // Created again under the same name: a new object, the old record does not apply.
    let mut again = crd("v1", &["v1beta1", "v1"], 1);
    again.uid = "u2".into();
    let mut seen = None;
    assert_eq!(
        step(&again, Some(&r), &mut seen, t0, Some(Method::Rewrite)),
        Decision::Settle { remaining: SETTLE }
    );
    assert_eq!(pruned(&again, Some(&r)), None);
    let s = Seen::observe(seen.as_ref(), &again, t0 + SETTLE);
    assert_eq!(
        decide(
            &again,
            Some(&r),
            &s,
            t0 + SETTLE,
            TIMING,
            Some(Method::Rewrite),
            0
        ),
        Decision::Start {
            sequence: 1,
            method: Method::Rewrite
        }
    );
}

#[test]
fn a_failed_migration_is_tried_again_after_a_doubling_wait_and_numbers_only_grow() {
    let t0 = Instant::now();
    let c = crd("v1", &["v1beta1", "v1"], 2);
    let mut r = Record::begin(&c, "m-3", 3, Method::Rewrite).expect("storage");
    finish(&mut r, Phase::Failed);
    r.failures = 1;
    let mut seen = None;
    // Seen failed at t0: waits RETRY, then the same need again as migration number 4.
    for (at, want) in [
        (t0, Decision::Failed { retry_in: RETRY }),
        (
            t0 + Duration::from_secs(599),
            Decision::Failed {
                retry_in: Duration::from_secs(1),
            },
        ),
        (
            t0 + RETRY,
            Decision::Start {
                sequence: 4,
                method: Method::Rewrite,
            },
        ),
    ] {
        assert_eq!(
            step(&c, Some(&r), &mut seen, at, Some(Method::Rewrite)),
            want
        );
    }
    // I8: never two at once: while the retry runs, nothing else begins.
    let mut retry = Record::begin(&c, "m-4", 4, Method::Rewrite).expect("storage");
    retry.failures = 1;
    assert_eq!(
        step(
            &c,
            Some(&retry),
            &mut seen,
            t0 + RETRY,
            Some(Method::Rewrite)
        ),
        Decision::Run
    );
    // Its failure (the second in a row) doubles the wait; a new leader (nothing seen) waits
    // from when it first sees the failure.
    finish(&mut retry, Phase::Failed);
    retry.failures = 2;
    let t1 = t0 + RETRY * 3;
    let mut fresh = None;
    assert_eq!(
        step(&c, Some(&retry), &mut fresh, t1, Some(Method::Rewrite)),
        Decision::Failed {
            retry_in: RETRY * 2
        }
    );
    assert_eq!(
        step(
            &c,
            Some(&retry),
            &mut fresh,
            t1 + RETRY * 2,
            Some(Method::Rewrite)
        ),
        Decision::Start {
            sequence: 5,
            method: Method::Rewrite
        }
    );
    assert_eq!(retry_wait(RETRY, 0), RETRY);
    assert_eq!(retry_wait(RETRY, 3), RETRY * 4);
    assert_eq!(retry_wait(RETRY, 40), RETRY_CAP);
    assert_eq!(retry_wait(Duration::MAX, 2), RETRY_CAP);
    // A new need (the generation moved): the next number, above ours and above any
    // StorageVersionMigration of ours found for it.
    let c2 = crd("v1", &["v1beta1", "v1"], 3);
    let s = Seen {
        fingerprint: c2.fingerprint(),
        since: t0,
        awaiting_prune: None,
        failed_since: None,
    };
    assert_eq!(
        decide(
            &c2,
            Some(&r),
            &s,
            t0 + SETTLE,
            TIMING,
            Some(Method::Rewrite),
            0
        ),
        Decision::Start {
            sequence: 4,
            method: Method::Rewrite
        }
    );
    assert_eq!(
        decide(&c2, Some(&r), &s, t0 + SETTLE, TIMING, Some(Method::Svm), 7),
        Decision::Start {
            sequence: 8,
            method: Method::Svm
        }
    );
}

/// I7 over random interleavings: whatever happens to the CRD between a migration's start and
/// its success, a prune is allowed only if the CRD is still what the migration began on.
#[test]
fn prune_only_on_a_crd_unchanged_since_the_migration_began() {
    let versions = ["v1alpha1", "v1beta1", "v1", "v2"];
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for _ in 0..2000 {
        let pick = |next: &mut dyn FnMut(usize) -> usize| -> Snapshot {
            let storage = versions[next(versions.len())];
            let mut stored: Vec<&str> = versions.iter().copied().filter(|_| next(2) == 0).collect();
            if !stored.contains(&storage) {
                stored.push(storage);
            }
            crd(storage, &stored, 1 + next(3) as i64)
        };
        let began = pick(&mut next);
        let now = pick(&mut next);
        let mut r = Record::begin(&began, "m", 1, Method::Rewrite).expect("storage");
        finish(&mut r, Phase::Succeeded);
        let allowed = pruned(&now, Some(&r)).is_some();
        let unchanged = now.generation == began.generation
            && now.storage == began.storage
            && now.stored.iter().all(|v| began.stored.contains(v));
        assert_eq!(
            allowed,
            unchanged && !now.up_to_date(),
            "{began:?} -> {now:?}"
        );
    }
}

#[test]
fn records_round_trip_as_json() {
    let c = crd("v1", &["v1beta1", "v1"], 2);
    let r = Record::begin(&c, "m-1", 1, Method::Svm).expect("storage");
    let text = serde_json::to_string(&r).expect("json");
    assert!(
        text.contains("\"method\":\"svm\"") && text.contains("\"phase\":\"running\""),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<Record>(&text).expect("parse"), r);
}

//! What the Helm chart's hooks run, with the chart's own image: `selftest` (the `helm test` pod:
//! the webhook answers a review it is sent, over TLS verified with the CA kube-apiserver is given,
//! and `audit`) and `cleanup` (the `post-delete` Job: removes the objects the running pods made,
//! which Helm does not know about).
//!
//! Each is split like `audit`: the pure judgements (which endpoints, what an answer means, what
//! a TLS error says) with unit tests, and a thin `run` that does the calls.

pub mod cleanup;
pub mod selftest;

use std::process::ExitCode;

/// Runs `fut` on a current-thread runtime; 2 when the runtime cannot start.
fn block_on<F: std::future::Future<Output = ExitCode>>(fut: F) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::from(2)
        }
    }
}

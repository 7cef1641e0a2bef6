//! The wall clock of a simulation thread.
//!
//! Product code and kube-lease-manager read the wall clock (`SystemTime::now()`, jiff's
//! `Timestamp::now()`): lease expiry, leader takeover, condition times. Under Tokio's paused clock
//! the wall clock would barely move while simulated hours pass, so an expired lease would never
//! look expired. This test binary therefore defines `clock_gettime` itself (the executable's
//! definition wins over glibc's for every call made from Rust's std): on a thread that runs a
//! simulation, `CLOCK_REALTIME` reads `EPOCH + (tokio's paused now - the simulation's start)`, so
//! wall time and Tokio time move together and every timestamp is a function of the seed. Every
//! other clock, and every other thread, gets the kernel's answer.

use std::cell::Cell;

/// 2026-01-01T00:00:00Z: the simulated wall clock at the start of every run.
pub const EPOCH_SECS: i64 = 1_767_225_600;

thread_local! {
    /// The Tokio instant the simulation on this thread started at.
    static START: Cell<Option<tokio::time::Instant>> = const { Cell::new(None) };
    /// The last time read, in nanoseconds since the epoch.
    static LAST: Cell<i128> = const { Cell::new(0) };
}

/// Makes this thread's wall clock follow Tokio's (paused) clock from now on.
pub fn install() {
    START.with(|s| s.set(Some(tokio::time::Instant::now())));
    LAST.with(|l| l.set(0));
}

/// Gives this thread the kernel's wall clock back.
pub fn uninstall() {
    START.with(|s| s.set(None));
}

#[repr(C)]
pub struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn syscall(number: i64, ...) -> i64;
}

const SYS_CLOCK_GETTIME: i64 = 228;
const CLOCK_REALTIME: i32 = 0;

/// # Safety
/// Called by libc users with a valid `tp`, exactly like glibc's `clock_gettime`.
#[no_mangle]
pub unsafe extern "C" fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32 {
    if clock == CLOCK_REALTIME && !tp.is_null() {
        let start = START.try_with(|s| s.get()).ok().flatten();
        if let Some(start) = start {
            // tokio's Instant::now reads CLOCK_MONOTONIC (answered below) or the paused clock.
            // Each read is a nanosecond later than the one before: a paused clock that never
            // moved would make code that waits "until the wall clock passes t" spin at t.
            let d = tokio::time::Instant::now().saturating_duration_since(start);
            // The first read at an instant is already 1 ns past it (code runs after a timer
            // fires, never at its very instant): a check right after waking up at a deadline
            // sees the deadline passed, as it would on a real clock.
            let ns = (i128::from(EPOCH_SECS) * 1_000_000_000 + d.as_nanos() as i128 + 1)
                .max(LAST.try_with(|l| l.get()).unwrap_or(0) + 1);
            let _ = LAST.try_with(|l| l.set(ns));
            (*tp).sec = (ns / 1_000_000_000) as i64;
            (*tp).nsec = (ns % 1_000_000_000) as i64;
            return 0;
        }
    }
    syscall(SYS_CLOCK_GETTIME, i64::from(clock), tp) as i32
}

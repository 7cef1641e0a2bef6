//! How the program uses glibc's allocator: few arenas, and freed memory handed back after a re-list.
//!
//! glibc gives every thread that allocates its own arena (up to 8 per core). The identity-lease
//! and StorageVersion lists are decoded page by page on whichever Tokio worker polls the watch,
//! and the pages' freed memory then stays with that worker's arena, fragmented between the
//! objects the stores keep. With 10,000 leases and 2,000 StorageVersions that was 8 MiB of
//! resident memory more than with one arena (BENCHMARKS.md, part 5). So the program limits glibc to
//! [`ARENAS`] arenas, unless `MALLOC_ARENA_MAX` is set in the environment (glibc reads it itself:
//! an operator's setting wins), and returns free pages to the kernel ([`release_free`]) after
//! each complete list of a store. Elsewhere (musl, other systems) both are no-ops.

/// Arenas the program asks glibc for: one is enough for two Tokio workers, since small allocations
/// go through each thread's cache first.
pub const ARENAS: i32 = 1;

/// Limits glibc's arenas to [`ARENAS`] unless `MALLOC_ARENA_MAX` is set. Call before threads start.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}

/// Hands the allocator's free pages back to the kernel (after a store's list is folded in).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe and only releases memory that is free.
    unsafe {
        libc::malloc_trim(0);
    }
}

//! The process's resource limits a mount raises before it opens anything: the soft limit on open
//! descriptors, up to what the daemon's descriptor budget needs (never past the hard limit), and
//! back to what it was for the processes the daemon starts.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::engine::tuning::{MAX_LANES, OPEN_SOURCES};

/// Descriptors a daemon may hold at once, with room to spare: [`OPEN_SOURCES`] sources each read
/// through a stream and every prefetch lane (plus spares), a `/dev/fuse` clone per FUSE thread (at
/// most 256), and the rest (disk cache files, sockets, logs) in the remaining headroom. Far below a
/// container's hard limit (which can be about 10^9): a soft limit that high makes every `close_range`
/// and `poll` loop of a child that walks its descriptors slow, and is not what the daemon needs.
pub const DESCRIPTORS_NEEDED: u64 = 4096;

/// The sources' and FUSE threads' share leaves at least half of [`DESCRIPTORS_NEEDED`] as headroom.
const _: () = assert!((OPEN_SOURCES * (MAX_LANES + 4) + 256) as u64 <= DESCRIPTORS_NEEDED / 2);

/// The soft limit before [`raise_open_files_limit`] raised it; [`NOT_RAISED`] until it has.
static ORIGINAL_SOFT: AtomicU64 = AtomicU64::new(NOT_RAISED);

/// [`ORIGINAL_SOFT`] while the limit is as the process found it.
const NOT_RAISED: u64 = u64::MAX;

/// The soft limit to raise `soft` to under the hard limit `hard` so that [`DESCRIPTORS_NEEDED`]
/// fit, or `None` to leave it: never lowered, never past `hard`.
pub fn raised_soft_limit(soft: u64, hard: u64) -> Option<u64> {
    let infinite = libc::RLIM_INFINITY;
    let want = DESCRIPTORS_NEEDED.min(hard);
    (soft != infinite && soft < want).then_some(want)
}

/// Raises the soft `RLIMIT_NOFILE` to what [`DESCRIPTORS_NEEDED`] takes, within the hard limit
/// (systemd and many shells start processes at a soft 1,024): a checkpoint of hundreds of shards
/// must not fail with `too many open files` while the engine still bounds what it keeps open
/// (`engine::tuning::OPEN_SOURCES`). Remembers the limit it found for [`restore_for_child`].
/// Returns the soft limit in force afterwards. Failing to raise it changes nothing but the
/// headroom, so it is only logged.
pub fn raise_open_files_limit() -> u64 {
    let Some(mut limit) = get_limit() else { return 0 };
    let Some(raised) = raised_soft_limit(limit.rlim_cur, limit.rlim_max) else {
        return limit.rlim_cur;
    };
    let before = limit.rlim_cur;
    limit.rlim_cur = raised;
    // SAFETY: setrlimit reads the struct we pass; a soft limit up to the hard one is always allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        log::debug!("setrlimit(RLIMIT_NOFILE, {raised}): {}", std::io::Error::last_os_error());
        return before;
    }
    ORIGINAL_SOFT.store(before, Relaxed);
    log::debug!("open files limit raised from {before} to {raised}");
    raised
}

/// Puts the soft `RLIMIT_NOFILE` back to what [`raise_open_files_limit`] found, if it raised it:
/// for a child between `fork` and `exec` (the watcher, `fusermount3`), which must start with the
/// caller's limit, not the daemon's. Async-signal-safe (two system calls, one atomic load).
pub fn restore_for_child() {
    let original = ORIGINAL_SOFT.load(Relaxed);
    if original == NOT_RAISED {
        return;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we pass; setrlimit reads it; lowering the soft limit is
    // always allowed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = original;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Runs `start` (which starts a child it cannot prepare, as fuser starts `fusermount3`) with the
/// soft limit the process started with, then raises it again. The daemon holds few descriptors
/// while it mounts, far fewer than any soft limit.
pub fn with_original_limit<T>(start: impl FnOnce() -> T) -> T {
    let Some(original) = original_soft_limit() else { return start() };
    let raised = get_limit();
    restore_for_child();
    let result = start();
    if let Some(raised) = raised {
        // SAFETY: setrlimit reads the struct we pass: the limits in force before, within the hard one.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
    log::debug!("started a child with the open files limit of {original}");
    result
}

/// The soft limit the process started with, while [`raise_open_files_limit`] has it raised.
pub fn original_soft_limit() -> Option<u64> {
    Some(ORIGINAL_SOFT.load(Relaxed)).filter(|v| *v != NOT_RAISED)
}

/// This process's `RLIMIT_NOFILE`, or `None` (logged) if it cannot be read.
fn get_limit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        log::debug!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error());
        return None;
    }
    Some(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule alone: the process's own limit is left to the real-mount test (`tests/mount.rs`),
    /// which reads a daemon's and its watcher's limits, so no other test here sees it change.
    #[test]
    fn the_soft_limit_is_raised_to_the_budget_only() {
        let infinite = libc::RLIM_INFINITY;
        assert_eq!(raised_soft_limit(1024, 1 << 30), Some(DESCRIPTORS_NEEDED));
        assert_eq!(raised_soft_limit(1024, infinite), Some(DESCRIPTORS_NEEDED));
        assert_eq!(raised_soft_limit(256, 2000), Some(2000), "never past the hard limit");
        assert_eq!(raised_soft_limit(2000, 2000), None);
        assert_eq!(raised_soft_limit(DESCRIPTORS_NEEDED + 1, 1 << 30), None, "never lowered");
        assert_eq!(raised_soft_limit(infinite, infinite), None);
    }
}

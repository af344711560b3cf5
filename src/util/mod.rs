//! Small helpers every layer may use: one locking policy, the wording of I/O errors, sizes, and
//! the "did you mean" of a misspelt name.

pub mod size;
pub mod suggest;
#[cfg(test)]
pub(crate) mod test_support;

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// Locks a mutex, ignoring poisoning. The policy for the whole crate: every critical section in
/// stfs leaves the data it guards consistent at each step (counters, maps, queues), so a panic on
/// another thread never leaves a half-made state to refuse; refusing it would turn one failed
/// request into a dead mount.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes a read lock, ignoring poisoning by the policy of [`lock`].
pub fn read<T>(rw: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    rw.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a write lock, ignoring poisoning by the policy of [`lock`].
pub fn write<T>(rw: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    rw.write().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `condvar` until notified, ignoring poisoning by the policy of [`lock`].
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `condvar` while `waiting` holds, at most `timeout`, ignoring poisoning by the policy of
/// [`lock`]. The caller looks at the guarded state to see whether the wait ended in time.
pub fn wait_while<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
    waiting: impl FnMut(&mut T) -> bool,
) -> MutexGuard<'a, T> {
    condvar.wait_timeout_while(guard, timeout, waiting).unwrap_or_else(PoisonError::into_inner).0
}

/// An I/O error as a short lower-case phrase ("no such file or directory").
pub fn describe_io(e: &std::io::Error) -> String {
    let text = e.to_string();
    // std appends " (os error N)"; the phrase alone reads better in a one-line message.
    let text = match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

//! Small helpers every layer may use: one locking policy, the wording of I/O errors, sizes.

pub mod size;
#[cfg(test)]
pub(crate) mod test_support;

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, ignoring poisoning. The policy for the whole crate: every critical section in
/// stfs leaves the data it guards consistent at each step (counters, maps, queues), so a panic on
/// another thread never leaves a half-made state to refuse; refusing it would turn one failed
/// request into a dead mount.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

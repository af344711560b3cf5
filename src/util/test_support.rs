//! Helpers shared by the unit tests.

use std::time::{Duration, Instant};

/// Polls `done` until it holds or 5 s pass: waits for background work without timing claims.
pub(crate) fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

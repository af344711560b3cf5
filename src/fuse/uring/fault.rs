//! The faults the real-mount tests inject into the ring threads, to show that a wait that fails
//! or a handler that panics strands no request (`tests/uring.rs`). Read from
//! `STFS_TEST_URING_FAULT` in debug builds only: a release build never looks at the variable, and
//! its waits never fail nor its handlers panic on purpose.
//!
//! The value is `QUEUE COUNT [TRIGGER]`, failing waits: `QUEUE` a queue number or `all`; `COUNT`
//! how many waits fail (with EIO, as if `io_uring_enter` had), or `always`; `TRIGGER` a path: the
//! waits start failing once it exists (without one, at the thread's first wait for a request).
//! Or `panic TRIGGER`, a handler that panics: the first read served from a ring entry once
//! `TRIGGER` exists panics in its handler, once ([`panic_in_handler_once`]).

use std::io;
use std::path::{Path, PathBuf};

/// The environment variable a debug build reads the fault from.
#[cfg(debug_assertions)]
const VARIABLE: &str = "STFS_TEST_URING_FAULT";

/// The failing waits asked for one ring thread.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub struct WaitFault {
    /// Waits left to fail; None: every one from the trigger on.
    left: Option<u32>,
    /// The file whose existence starts the failures.
    trigger: Option<PathBuf>,
    /// The thread waits for requests now (its entry is registered).
    armed: bool,
    /// Waits failed so far.
    failed: u64,
}

impl WaitFault {
    /// The fault asked for queue `qid`'s threads, if any (never in a release build).
    pub fn for_queue(qid: u16) -> Option<WaitFault> {
        #[cfg(debug_assertions)]
        {
            let spec = std::env::var(VARIABLE).ok()?;
            let fault = parse(&spec, qid);
            if fault.is_some() {
                log::warn!("{VARIABLE}: the waits of queue {qid}'s ring thread fail as asked ({spec})");
            }
            fault
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = qid;
            None
        }
    }

    /// The thread's entry is registered: its waits for requests may fail from now on.
    pub fn arm(&mut self) {
        self.armed = true;
    }

    /// Waits failed so far.
    #[cfg(test)]
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// A fault whose every wait fails from now on (a unit test's).
    #[cfg(test)]
    pub fn always() -> WaitFault {
        WaitFault { left: None, trigger: None, armed: true, failed: 0 }
    }

    /// The error the next wait fails with, if it is to fail.
    pub fn next_wait(&mut self) -> Option<io::Error> {
        if !self.armed || self.trigger.as_ref().is_some_and(|t| !t.exists()) {
            return None;
        }
        match &mut self.left {
            Some(0) => return None,
            Some(n) => *n -= 1,
            None => {}
        }
        self.failed += 1;
        Some(io::Error::from_raw_os_error(libc::EIO))
    }
}

/// In a debug build asked for `panic TRIGGER`: panics the first time it is called once `TRIGGER`
/// exists (the read handler calls it when it answers into a ring entry). Nothing otherwise.
pub fn panic_in_handler_once() {
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        use std::sync::OnceLock;
        static TRIGGER: OnceLock<Option<PathBuf>> = OnceLock::new();
        static PANICKED: AtomicBool = AtomicBool::new(false);
        let trigger = TRIGGER.get_or_init(|| std::env::var(VARIABLE).ok().and_then(|spec| parse_panic(&spec)));
        if trigger.as_deref().is_some_and(Path::exists) && !PANICKED.swap(true, Relaxed) {
            panic!("{VARIABLE}: the handler panics, as asked");
        }
    }
}

/// The trigger of a handler panic `spec` asks for (`panic TRIGGER`), if it asks for one.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn parse_panic(spec: &str) -> Option<PathBuf> {
    match spec.split_whitespace().collect::<Vec<_>>()[..] {
        ["panic", trigger] => Some(Path::new(trigger).to_path_buf()),
        _ => None,
    }
}

/// The fault `spec` asks for queue `qid`: None if it names another queue or does not parse.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn parse(spec: &str, qid: u16) -> Option<WaitFault> {
    let mut words = spec.split_whitespace();
    let queue = words.next()?;
    if queue != "all" && queue.parse::<u16>().ok()? != qid {
        return None;
    }
    let left = match words.next()? {
        "always" => None,
        n => Some(n.parse().ok()?),
    };
    Some(WaitFault { left, trigger: words.next().map(PathBuf::from), armed: false, failed: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_names_its_queues_and_counts_its_failures_once_armed() {
        assert_eq!(parse("1 2", 0), None, "another queue");
        assert_eq!(parse("x 2", 0), None);
        assert_eq!(parse("all", 0), None, "no count");
        let mut f = parse("all 2", 7).unwrap();
        assert!(f.next_wait().is_none(), "not armed before the entry is registered");
        f.arm();
        assert_eq!(f.next_wait().and_then(|e| e.raw_os_error()), Some(libc::EIO));
        assert!(f.next_wait().is_some());
        assert!(f.next_wait().is_none(), "two failures, then none");
        let mut always = parse("3 always", 3).unwrap();
        always.arm();
        assert!((0..100).all(|_| always.next_wait().is_some()));
    }

    #[test]
    fn a_handler_panic_names_its_trigger_and_asks_for_no_failing_wait() {
        assert_eq!(parse_panic("panic /tmp/now"), Some(PathBuf::from("/tmp/now")));
        assert_eq!(parse_panic("panic"), None, "no trigger");
        assert_eq!(parse_panic("all 1"), None);
        assert_eq!(parse("panic /tmp/now", 0), None, "no queue's waits fail");
    }

    #[test]
    fn a_triggered_fault_waits_for_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let trigger = dir.path().join("now");
        let mut f = parse(&format!("0 always {}", trigger.display()), 0).unwrap();
        f.arm();
        assert!(f.next_wait().is_none());
        std::fs::write(&trigger, b"").unwrap();
        assert!(f.next_wait().is_some());
    }
}

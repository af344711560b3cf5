//! Credentials that expire (AWS keys with a session token, a Google access token), fetched again
//! off the read path: one fetch at a time (single flight), each bounded by the mount's
//! `--timeout`; the current credentials handed out while they are valid, even while a fetch is
//! under way or stalled; expired ones never handed out: a caller without valid credentials waits
//! for the fetch in flight, at most the timeout, then gets an error that names no secret.
//!
//! Until [`start_background_refresh`] is called (by the mount, after its last fork, before it
//! serves) no thread is started here: credentials near their expiry are handed out as they are,
//! and expired ones are fetched on the caller's thread. Each fetch runs on a tokio runtime made
//! for it and shut down after it, its blocking threads joined ([`block_on`]), so no thread of a
//! lookup is alive when the mount forks.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::util::{lock, wait_while};

/// Credentials are fetched again once they expire within this long.
const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// Least time between the starts of two fetches while the current credentials are valid
/// (instance metadata hands out the old ones until it rotates them, and a failing endpoint is
/// not asked again at every read).
const REFRESH_PAUSE: Duration = Duration::from_secs(10);
/// Credentials this close to their expiry are not handed out: a request signed with them could
/// reach the store after it.
const EXPIRY_SKEW: Duration = Duration::from_secs(1);
/// For this long after a fetch failed, a caller without valid credentials gets its reason at once
/// rather than starting another fetch: the kernel retries a failed read (and the readahead that
/// failed with it) right away, and each retry must not wait a whole `--timeout` again.
const FAILURE_HOLD: Duration = Duration::from_secs(1);
/// How long the end of a fetch's runtime waits for its blocking threads (DNS lookups, file reads)
/// to finish and be joined.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(2);

/// The name of a lookup runtime's blocking threads.
const LOOKUP_THREAD: &str = "stfs-lookup";

/// Whether fetches may run on threads of their own (see [`start_background_refresh`]).
static BACKGROUND: AtomicBool = AtomicBool::new(false);

/// From now on, credentials near their expiry are fetched again on a thread of their own. Call
/// once the process will not fork any more (a thread alive at a fork is not copied, and any lock
/// it held stays locked in the child).
pub fn start_background_refresh() {
    BACKGROUND.store(true, Ordering::SeqCst);
}

/// Credentials with an expiry (`None`: they never expire).
pub(crate) trait Expiring: Clone + Send + 'static {
    /// When they stop being valid.
    fn expires(&self) -> Option<SystemTime>;
}

/// Fetches new credentials within the time given, or says why not (words that hold no secret).
pub(crate) type Fetch<C> = Box<dyn Fn(Duration) -> Result<C, String> + Send + Sync>;

/// The current credentials of one store, and their refresh.
pub(crate) struct Refreshing<C> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    /// What they are, plural, for the log and errors: "AWS credentials".
    what: &'static str,
    fetch: Fetch<C>,
    /// The mount's `--timeout`: the longest a fetch, and a caller waiting for one, may take.
    timeout: Duration,
    state: Mutex<State<C>>,
    /// Notified at the end of each fetch.
    finished: Condvar,
}

struct State<C> {
    current: C,
    in_flight: bool,
    /// When the last fetch started.
    last_start: Option<Instant>,
    /// Fetches finished so far.
    finished: u64,
    /// Why the last fetch failed (none if it succeeded).
    last_error: Option<String>,
    /// When the last fetch failed.
    last_failure: Option<Instant>,
}

impl<C: Expiring> Refreshing<C> {
    /// Starts from `first` (fetched at open time), fetching again with `fetch`, each fetch and each
    /// wait for one bounded by `timeout`.
    pub fn new(what: &'static str, first: C, timeout: Duration, fetch: Fetch<C>) -> Refreshing<C> {
        let state = State {
            current: first,
            in_flight: false,
            last_start: None,
            finished: 0,
            last_error: None,
            last_failure: None,
        };
        let shared = Shared { what, fetch, timeout, state: Mutex::new(state), finished: Condvar::new() };
        Refreshing { shared: Arc::new(shared) }
    }

    /// Valid credentials: the current ones while they are valid (never waiting, a fetch started in
    /// the background when they expire soon), else new ones, waiting for the fetch in flight until
    /// `deadline` (the read's own), never past it. The error holds no secret.
    pub fn get(&self, deadline: Instant) -> Result<C, String> {
        let shared = &self.shared;
        let mut state = lock(&shared.state);
        // The count of finished fetches when this caller began waiting for one.
        let mut waiting_since: Option<u64> = None;
        loop {
            let now = SystemTime::now();
            let expires = state.current.expires();
            if expires.is_none_or(|at| at > now + EXPIRY_SKEW) {
                let due = expires.is_some_and(|at| at <= now + REFRESH_BEFORE)
                    && !state.in_flight
                    && state.last_start.is_none_or(|at| at.elapsed() >= REFRESH_PAUSE)
                    && BACKGROUND.load(Ordering::SeqCst);
                if due {
                    log::info!("{} expire in {}; fetching them again", shared.what, words(until(expires, now)));
                    Shared::spawn(shared, &mut state);
                }
                return Ok(state.current.clone());
            }
            // The fetch this caller waited for has ended, or one failed a moment ago: its reason.
            let failed = match waiting_since {
                Some(seen) => state.finished != seen,
                None => !state.in_flight && state.last_failure.is_some_and(|at| at.elapsed() < FAILURE_HOLD),
            };
            if failed {
                let why = state.last_error.as_deref().unwrap_or("the new ones had expired too");
                return Err(format!("{} expired and fetching new ones failed: {why}", shared.what));
            }
            if waiting_since.is_none() {
                waiting_since = Some(state.finished);
                if !state.in_flight {
                    log::info!("{} expired; fetching them again", shared.what);
                    if BACKGROUND.load(Ordering::SeqCst) {
                        Shared::spawn(shared, &mut state);
                    } else {
                        state = shared.fetch_here(state, deadline);
                    }
                    continue;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{} expired and fetching new ones did not finish within {} (--timeout)",
                    shared.what,
                    words(shared.timeout)
                ));
            }
            let seen = state.finished;
            state = wait_while(&shared.finished, state, left, |s| s.finished == seen);
        }
    }
}

impl<C: Expiring> Shared<C> {
    /// Starts a fetch on a thread of its own; `state` is locked by the caller.
    fn spawn(shared: &Arc<Shared<C>>, state: &mut State<C>) {
        state.in_flight = true;
        state.last_start = Some(Instant::now());
        let worker = Arc::clone(shared);
        let spawned = std::thread::Builder::new().name("stfs-credentials".to_string()).spawn(move || {
            let result = worker.fetch_bounded(worker.timeout);
            let mut state = lock(&worker.state);
            worker.finish(&mut state, result);
        });
        if let Err(error) = spawned {
            shared.finish(state, Err(format!("cannot start a thread to fetch them: {error}")));
        }
    }

    /// Fetches on the caller's thread (before the mount's last fork), the lock released meanwhile,
    /// ending by the caller's `deadline`.
    fn fetch_here<'a>(&'a self, mut state: MutexGuard<'a, State<C>>, deadline: Instant) -> MutexGuard<'a, State<C>> {
        state.in_flight = true;
        state.last_start = Some(Instant::now());
        drop(state);
        let result = self.fetch_bounded(deadline.saturating_duration_since(Instant::now()).min(self.timeout));
        let mut state = lock(&self.state);
        self.finish(&mut state, result);
        state
    }

    /// One fetch; a panic in the credential library becomes an error rather than a fetch that
    /// never ends.
    fn fetch_bounded(&self, bound: Duration) -> Result<C, String> {
        let fetch = std::panic::AssertUnwindSafe(|| (self.fetch)(bound));
        std::panic::catch_unwind(fetch).unwrap_or_else(|_| Err("the credential lookup panicked".to_string()))
    }

    /// Records a fetch's outcome and wakes the callers waiting for it.
    fn finish(&self, state: &mut State<C>, result: Result<C, String>) {
        state.in_flight = false;
        state.finished += 1;
        let now = SystemTime::now();
        match result {
            Ok(fresh) => {
                let (old, new) = (state.current.expires(), fresh.expires());
                log::info!("fetched new {}, valid for {}", self.what, words(until(new, now)));
                // A source that hands out older credentials than the current ones does not win.
                if new.is_none() || old.is_some_and(|old| new >= Some(old)) {
                    state.current = fresh;
                }
                state.last_error = None;
                state.last_failure = None;
            }
            Err(detail) => {
                match state.current.expires().filter(|at| *at > now + EXPIRY_SKEW) {
                    Some(at) => log::warn!(
                        "fetching {} again failed, the current ones stay valid for {}: {detail}",
                        self.what,
                        words(until(Some(at), now))
                    ),
                    None => log::warn!("fetching {} again failed: {detail}", self.what),
                }
                state.last_error = Some(detail);
                state.last_failure = Some(Instant::now());
            }
        }
        self.finished.notify_all();
    }
}

/// How long from `now` until `expires` (zero if past; a long time for `None`).
fn until(expires: Option<SystemTime>, now: SystemTime) -> Duration {
    expires.map_or(Duration::MAX, |at| at.duration_since(now).unwrap_or_default())
}

/// A duration in words: `2 s`, `1.5 s`, `250 ms`, `4 min 3 s`.
fn words(d: Duration) -> String {
    match d.as_millis() {
        _ if d == Duration::MAX => "ever".to_string(),
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms < 10_000 && ms % 1000 != 0 => format!("{:.1} s", d.as_secs_f64()),
        _ if d.as_secs() >= 60 => format!("{} min {} s", d.as_secs() / 60, d.as_secs() % 60),
        _ => format!("{} s", d.as_secs()),
    }
}

/// Runs `future` to completion, at most `bound`, on a current-thread runtime made for it, then
/// shuts the runtime down joining its blocking threads (waiting at most [`RUNTIME_SHUTDOWN`]):
/// the lookup's HTTP clients and threads never outlive it, nor cross the daemon's fork.
pub(crate) fn block_on<F: Future>(bound: Duration, future: F) -> Result<F::Output, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(LOOKUP_THREAD)
        .build()
        .map_err(|e| format!("cannot start the credential lookup: {e}"))?;
    let deadline = Instant::now() + bound;
    let output = runtime.block_on(async { tokio::time::timeout(bound, future).await });
    // Joining the blocking threads takes from the same bound: a lookup that used all of it is
    // left to end on its own rather than hold its caller past the deadline.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN.min(deadline.saturating_duration_since(Instant::now())));
    output.map_err(|_| format!("the credential lookup did not finish within {} (--timeout)", words(bound)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Clone, Debug, PartialEq)]
    struct Token(u32, SystemTime);

    impl Expiring for Token {
        fn expires(&self) -> Option<SystemTime> {
            Some(self.1)
        }
    }

    /// A fetch that counts its calls, takes `delay`, and gives a token valid an hour.
    fn slow_fetch(calls: Arc<AtomicUsize>, delay: Duration) -> Fetch<Token> {
        Box::new(move |_| {
            let n = calls.fetch_add(1, Ordering::SeqCst) as u32 + 1;
            std::thread::sleep(delay);
            Ok(Token(n, SystemTime::now() + Duration::from_secs(3600)))
        })
    }

    #[test]
    fn valid_credentials_are_handed_out_at_once_while_one_fetch_runs() {
        start_background_refresh();
        let calls = Arc::new(AtomicUsize::new(0));
        let first = Token(0, SystemTime::now() + Duration::from_secs(60));
        let cache = Arc::new(Refreshing::new(
            "test credentials",
            first.clone(),
            Duration::from_secs(5),
            slow_fetch(Arc::clone(&calls), Duration::from_millis(500)),
        ));
        let started = Instant::now();
        let got: Vec<Token> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| cache.get(in_secs(5)).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(started.elapsed() < Duration::from_millis(300), "{:?}", started.elapsed());
        assert!(got.iter().all(|t| *t == first));
        assert!(wait_for(|| cache.get(in_secs(5)).unwrap().0 == 1), "the refresh never landed");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "more than one fetch");
    }

    #[test]
    fn expired_credentials_wait_for_the_one_fetch_up_to_the_timeout() {
        start_background_refresh();
        let expired = Token(0, SystemTime::now() - Duration::from_secs(1));
        // A fetch slower than the timeout: every caller fails within it, none gets the expired token.
        let calls = Arc::new(AtomicUsize::new(0));
        let cache = Refreshing::new(
            "test credentials",
            expired.clone(),
            Duration::from_millis(300),
            slow_fetch(Arc::clone(&calls), Duration::from_secs(2)),
        );
        let started = Instant::now();
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|_| s.spawn(|| cache.get(Instant::now() + Duration::from_millis(300)).unwrap_err())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(started.elapsed() < Duration::from_millis(1000), "{:?}", started.elapsed());
        for error in errors {
            assert_eq!(
                error,
                "test credentials expired and fetching new ones did not finish within 300 ms (--timeout)"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // A fetch within the timeout: callers get its token.
        let cache = Refreshing::new(
            "test credentials",
            expired,
            Duration::from_secs(5),
            slow_fetch(Arc::new(AtomicUsize::new(0)), Duration::from_millis(100)),
        );
        assert_eq!(cache.get(in_secs(5)).unwrap().0, 1);
        // A failing fetch: the waiting caller gets its reason, and so does a caller a moment
        // later (the kernel's repeat of a failed read) without another fetch; later, one more.
        let failures = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&failures);
        let failing = Refreshing::new(
            "test credentials",
            Token(0, SystemTime::now() - Duration::from_secs(1)),
            Duration::from_secs(5),
            Box::new(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                Err("the endpoint said 403".to_string())
            }),
        );
        let said = "test credentials expired and fetching new ones failed: the endpoint said 403";
        assert_eq!(failing.get(in_secs(5)).unwrap_err(), said);
        assert_eq!(failing.get(in_secs(5)).unwrap_err(), said);
        assert_eq!(failures.load(Ordering::SeqCst), 1);
        std::thread::sleep(FAILURE_HOLD);
        assert_eq!(failing.get(in_secs(5)).unwrap_err(), said);
        assert_eq!(failures.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_runtime_of_a_lookup_is_bounded_and_leaves_no_thread() {
        let started = Instant::now();
        let never = block_on(Duration::from_millis(200), std::future::pending::<()>());
        assert_eq!(never.unwrap_err(), "the credential lookup did not finish within 200 ms (--timeout)");
        assert!(started.elapsed() < Duration::from_secs(2));
        // A lookup that used the blocking pool (as DNS lookups and file reads do): its thread is
        // joined when the lookup returns, not left idling into a fork.
        let answer = block_on(Duration::from_secs(5), async {
            tokio::task::spawn_blocking(|| std::thread::current().name().map(str::to_string)).await
        });
        assert_eq!(answer.unwrap().unwrap().as_deref(), Some(LOOKUP_THREAD));
        let lookups = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == LOOKUP_THREAD)
            .count();
        assert_eq!(lookups, 0, "a lookup thread is still alive");
    }

    fn in_secs(seconds: u64) -> Instant {
        Instant::now() + Duration::from_secs(seconds)
    }

    fn wait_for(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

//! Credentials that expire (AWS keys with a session token, a Google access token), fetched again
//! off the read path: one fetch at a time (single flight) on a thread of its own, each bounded by
//! the mount's `--timeout`; the current credentials handed out while they are valid, even while a
//! fetch is under way or stalled; expired ones never handed out: a caller without valid
//! credentials waits for the fetch in flight until its own deadline (the read's), then gets an
//! error that names no secret.
//!
//! The mount opens its sources after it has gone to the background (`cli::mount`), so no fork
//! follows a fetch: every lookup runs as a task on one tokio runtime ([`lookup`]), started at the
//! first and kept for the life of the process, and its caller waits for it on a plain channel with
//! the bound: a credential library that blocks inside its future (gcp_auth runs `gcloud` with a
//! blocking `Command::output`) holds one of the runtime's threads, never its caller past the bound
//! nor the other lookups.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
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

/// The name of the lookup runtime's blocking threads (DNS lookups, file reads).
const LOOKUP_THREAD: &str = "stfs-lookup";
/// The name of the thread each fetch runs on.
const FETCH_THREAD: &str = "stfs-credentials";

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
    /// How long a failed fetch's reason is given at once ([`FAILURE_HOLD`]).
    failure_hold: Duration,
}

impl<C: Expiring> Refreshing<C> {
    /// Starts from `first` (fetched at open time), fetching again with `fetch`, each fetch and each
    /// wait for one bounded by `timeout`.
    pub fn new(what: &'static str, first: C, timeout: Duration, fetch: Fetch<C>) -> Refreshing<C> {
        let state = State {
            current: first,
            in_flight: false,
            // The first credentials were fetched just now, at open time: the next fetch not before
            // the pause, and not while the mount is being opened.
            last_start: Some(Instant::now()),
            finished: 0,
            last_error: None,
            last_failure: None,
            failure_hold: FAILURE_HOLD,
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
                    && state.last_start.is_none_or(|at| at.elapsed() >= REFRESH_PAUSE);
                if due {
                    log::info!("{} expire in {}; fetching them again", shared.what, words(until(expires, now)));
                    Shared::spawn(shared, &mut state);
                }
                return Ok(state.current.clone());
            }
            // The fetch this caller waited for has ended, or one failed a moment ago: its reason.
            let failed = match waiting_since {
                Some(seen) => state.finished != seen,
                None => !state.in_flight && state.last_failure.is_some_and(|at| at.elapsed() < state.failure_hold),
            };
            if failed {
                let why = state.last_error.as_deref().unwrap_or("the new ones had expired too");
                return Err(format!("{} expired and fetching new ones failed: {why}", shared.what));
            }
            if waiting_since.is_none() {
                waiting_since = Some(state.finished);
                if !state.in_flight {
                    log::info!("{} expired; fetching them again", shared.what);
                    Shared::spawn(shared, &mut state);
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
        let spawned = std::thread::Builder::new().name(FETCH_THREAD.to_string()).spawn(move || {
            let result = worker.fetch_bounded();
            let mut state = lock(&worker.state);
            worker.finish(&mut state, result);
        });
        if let Err(error) = spawned {
            shared.finish(state, Err(format!("cannot start a thread to fetch them: {error}")));
        }
    }

    /// One fetch; a panic in the credential library becomes an error rather than a fetch that
    /// never ends.
    fn fetch_bounded(&self) -> Result<C, String> {
        let fetch = std::panic::AssertUnwindSafe(|| (self.fetch)(self.timeout));
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

/// Threads the lookup runtime runs its tasks on: two, so one lookup blocked inside its future
/// leaves the other going.
const LOOKUP_WORKERS: usize = 2;

/// The one runtime every credential lookup runs on (its HTTP clients' connections, DNS lookups
/// and file reads), started at the first lookup.
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(LOOKUP_WORKERS)
                .enable_all()
                .thread_name(LOOKUP_THREAD)
                .build()
                .map_err(|e| format!("cannot start the credential lookup: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `future` to completion as a task of the lookup runtime, waiting at most `bound`: past it
/// the task is aborted (its connections closed; a blocking DNS lookup, file read or `gcloud` run
/// ends on its own, on the runtime's thread) and the caller gets an error at once. The caller's
/// wait is a plain channel's, so it ends at the bound even while the task blocks its thread.
pub(crate) fn lookup<F>(bound: Duration, future: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = runtime()?.spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv_timeout(bound).map_err(|_| {
        task.abort();
        format!("the credential lookup did not finish within {} (--timeout)", words(bound))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    #[derive(Clone, Debug, PartialEq)]
    struct Token(u32, SystemTime);

    impl Expiring for Token {
        fn expires(&self) -> Option<SystemTime> {
            Some(self.1)
        }
    }

    /// Longest any step of these tests waits for something that should happen at once; reached
    /// only when the behaviour under test is broken (nothing here is timed more tightly).
    const HANG: Duration = Duration::from_secs(30);

    /// A fetch held until the test opens its gate: it counts its calls, notes the thread it ran
    /// on, and gives a token valid an hour.
    struct Gated {
        calls: Arc<AtomicUsize>,
        open: mpsc::Sender<()>,
        threads: mpsc::Receiver<Option<String>>,
    }

    fn gated_fetch() -> (Gated, Fetch<Token>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let (open, gate) = mpsc::channel::<()>();
        let (started, threads) = mpsc::channel();
        let gate = Mutex::new(gate);
        let counted = Arc::clone(&calls);
        let fetch: Fetch<Token> = Box::new(move |_| {
            let n = counted.fetch_add(1, Ordering::SeqCst) as u32 + 1;
            let _ = started.send(std::thread::current().name().map(str::to_string));
            // Held until the gate opens (or the test is gone); never longer than HANG.
            let _ = lock(&gate).recv_timeout(HANG);
            Ok(Token(n, SystemTime::now() + Duration::from_secs(3600)))
        });
        (Gated { calls, open, threads }, fetch)
    }

    /// `call` on a thread of its own, its answer within [`HANG`] (`None`: it hung).
    fn answer_of<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(call()));
        rx.recv_timeout(HANG).ok()
    }

    /// Credentials within the refresh margin: every caller gets them while the one fetch they
    /// started is held (a caller that waited for it would hang here), and the fetch runs on a
    /// thread of its own; once it ends its token is handed out.
    #[test]
    fn valid_credentials_are_handed_out_while_the_one_fetch_is_held() {
        let (gated, fetch) = gated_fetch();
        let first = Token(0, SystemTime::now() + Duration::from_secs(60));
        let cache = Arc::new(Refreshing::new("test credentials", first.clone(), HANG, fetch));
        // As if the first credentials were fetched more than the pause ago.
        lock(&cache.shared.state).last_start = None;
        for _ in 0..8 {
            let cache = Arc::clone(&cache);
            let got = answer_of(move || cache.get(Instant::now() + HANG));
            assert_eq!(got, Some(Ok(first.clone())), "a caller waited for the fetch");
        }
        let thread = gated.threads.recv_timeout(HANG).expect("no fetch started");
        assert_eq!(thread.as_deref(), Some(FETCH_THREAD), "the fetch ran on a caller's thread");
        assert_eq!(gated.calls.load(Ordering::SeqCst), 1, "more than one fetch");
        gated.open.send(()).unwrap();
        let deadline = Instant::now() + HANG;
        while cache.get(deadline).unwrap().0 != 1 {
            assert!(Instant::now() < deadline, "the fetched token never came into use");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(gated.calls.load(Ordering::SeqCst), 1, "more than one fetch");
    }

    /// Expired credentials and a held fetch whose own bound is an hour: each caller gives up at
    /// its own deadline (the read's), with a reason and never the expired token; a caller whose
    /// deadline is later gets the token once the fetch ends.
    #[test]
    fn expired_credentials_wait_for_the_one_fetch_until_the_callers_deadline() {
        let (gated, fetch) = gated_fetch();
        let expired = Token(0, SystemTime::now() - Duration::from_secs(1));
        let cache = Arc::new(Refreshing::new("test credentials", expired, Duration::from_secs(3600), fetch));
        let mut waiting = Vec::new();
        for _ in 0..4 {
            let cache = Arc::clone(&cache);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || tx.send(cache.get(Instant::now() + Duration::from_millis(100))));
            waiting.push(rx);
        }
        for rx in waiting {
            let error = rx.recv_timeout(HANG).expect("a caller waited past its deadline").unwrap_err();
            assert_eq!(
                error,
                "test credentials expired and fetching new ones did not finish within 60 min 0 s (--timeout)"
            );
        }
        assert_eq!(gated.calls.load(Ordering::SeqCst), 1, "more than one fetch");
        let later = {
            let cache = Arc::clone(&cache);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || tx.send(cache.get(Instant::now() + HANG)));
            rx
        };
        gated.open.send(()).unwrap();
        let token = later.recv_timeout(HANG).expect("the caller hung").unwrap();
        assert_eq!(token.0, 1);
        assert_eq!(gated.calls.load(Ordering::SeqCst), 1, "more than one fetch");
    }

    /// A failing fetch: the waiting caller gets its reason, and so does a caller soon after (the
    /// kernel's repeat of a failed read) without another fetch; once the hold has passed, a
    /// caller starts one more. (The hold is set here, not timed: an hour, then none.)
    #[test]
    fn a_failed_fetch_is_told_at_once_for_a_while_then_tried_again() {
        let failures = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&failures);
        let failing = Refreshing::new(
            "test credentials",
            Token(0, SystemTime::now() - Duration::from_secs(1)),
            HANG,
            Box::new(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                Err("the endpoint said 403".to_string())
            }),
        );
        lock(&failing.shared.state).failure_hold = Duration::from_secs(3600);
        let said = "test credentials expired and fetching new ones failed: the endpoint said 403";
        assert_eq!(failing.get(Instant::now() + HANG).unwrap_err(), said);
        assert_eq!(failing.get(Instant::now() + HANG).unwrap_err(), said);
        assert_eq!(failures.load(Ordering::SeqCst), 1, "a repeat started another fetch");
        // No hold: the next caller fetches again.
        lock(&failing.shared.state).failure_hold = Duration::ZERO;
        assert_eq!(failing.get(Instant::now() + HANG).unwrap_err(), said);
        assert_eq!(failures.load(Ordering::SeqCst), 2);
    }

    /// A lookup that never ends is cut off at its bound with a reason (a lookup that ignored it
    /// would hang here); lookups run on the one runtime, whose blocking pool they may use.
    #[test]
    fn a_lookup_is_bounded_and_runs_on_the_lookup_runtime() {
        let never = answer_of(|| lookup(Duration::from_millis(100), std::future::pending::<()>()));
        let never = never.expect("a lookup outlived its bound");
        assert_eq!(never.unwrap_err(), "the credential lookup did not finish within 100 ms (--timeout)");
        let answer = answer_of(|| {
            lookup(HANG, async {
                tokio::task::spawn_blocking(|| std::thread::current().name().map(str::to_string)).await
            })
        });
        let name = answer.expect("the lookup hung").unwrap().unwrap();
        assert_eq!(name.as_deref(), Some(LOOKUP_THREAD));
    }

    /// A lookup whose future blocks its thread (as gcp_auth's `gcloud` run does) is given up at its
    /// bound, while it still blocks, and another lookup meanwhile runs to its end: the blocked one
    /// holds one of the runtime's threads, never its caller nor the other lookups. The blocking
    /// future is held on a gate the test opens only after both answers are in.
    #[test]
    fn a_lookup_that_blocks_its_thread_is_bounded_and_holds_up_no_other() {
        let (open, gate) = mpsc::channel::<()>();
        let blocked = answer_of(move || {
            lookup(Duration::from_millis(100), async move {
                let _ = gate.recv_timeout(HANG);
            })
        });
        let blocked = blocked.expect("a lookup that blocks its thread held its caller past its bound");
        assert_eq!(blocked.unwrap_err(), "the credential lookup did not finish within 100 ms (--timeout)");
        let other = answer_of(|| lookup(HANG, async { 7 })).expect("another lookup was held up");
        assert_eq!(other, Ok(7));
        let _ = open.send(());
    }
}

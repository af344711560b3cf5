//! The mount's descriptor budget: how many sources may keep descriptors open at once.
//!
//! A source keeps descriptors from its first read on: its streams' and their prefetch lanes', its
//! spares (`spares`), and what the source keeps itself (a local file's mapping, an HTTP reader's
//! keep-alive connection is its reader's). Once more than [`OPEN_SOURCES`] sources hold them,
//! the least recently read ones close all they hold (each reopens at its next read), so a mount
//! of a thousand shards read one after the other keeps the descriptors of a few dozen, not of
//! every shard it has read, and never runs into the process's limit on open files. A source not
//! read for [`IDLE_DESCRIPTORS_AFTER`](super::tuning::IDLE_DESCRIPTORS_AFTER) closes them too
//! ([`Budget::close_idle`]): a mount left idle keeps no lane descriptor and no keep-alive socket,
//! also when a prefetch queued before that opened one after ([`Budget::holding`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::tuning::OPEN_SOURCES;

/// The engine's count of sources holding descriptors, and the clocks that order their reads.
pub(crate) struct Budget {
    /// Counts reads, to find the least recently read sources.
    clock: AtomicU64,
    /// What [`Activity::last_read_ms`] counts from.
    started: Instant,
    /// Sources marked as holding descriptors ([`Activity::open`]).
    open: AtomicUsize,
    /// Held while one thread closes sources' descriptors; others do not wait for it.
    closing: Mutex<()>,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget { clock: AtomicU64::new(0), started: Instant::now(), open: AtomicUsize::new(0), closing: Mutex::new(()) }
    }
}

/// One source's part of the budget.
#[derive(Default)]
pub(crate) struct Activity {
    /// The budget's clock at the source's last read.
    last_read: AtomicU64,
    /// Milliseconds from [`Budget::started`] to the source's last read.
    last_read_ms: AtomicU64,
    /// Whether the source may hold descriptors (read since they were last all closed).
    open: AtomicBool,
}

impl Budget {
    /// Records a read of the source whose part is `activity`. True when this made more than
    /// [`OPEN_SOURCES`] sources hold descriptors: the caller then calls
    /// [`Budget::close_least_recent`].
    pub(crate) fn on_read(&self, activity: &Activity) -> bool {
        activity.last_read.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        activity.last_read_ms.store(self.millis(), Relaxed);
        if activity.open.load(Relaxed) || activity.open.swap(true, Relaxed) {
            return false;
        }
        self.open.fetch_add(1, Relaxed) + 1 > OPEN_SOURCES
    }

    /// Records that the source whose part is `activity` may hold descriptors, with no read: a
    /// prefetch job queued before [`Budget::close_idle`] closed the source's descriptors (or a
    /// load that outlasted the idle time) opened one after, and calls this once it is left where
    /// closing finds it. Counted again, the source is closed at a later call; unmarked, no call
    /// would ever close it, and an idle mount would keep a descriptor or a socket for its life.
    /// Its last read stays as it was.
    pub(crate) fn holding(&self, activity: &Activity) {
        if !activity.open.load(Relaxed) && !activity.open.swap(true, Relaxed) {
            self.open.fetch_add(1, Relaxed);
        }
    }

    /// Closes the descriptors of the least recently read of `sources` (each with its part of the
    /// budget, `activity`, and `close`, which closes its descriptors and says whether it could
    /// close them all) until three quarters of [`OPEN_SOURCES`] hold any (a quarter of room, so
    /// this runs once per that many newly read sources, not at each). A source with a descriptor
    /// in use right now (a load in flight) keeps it and stays counted, to be closed at a later
    /// round. Another thread already closing: nothing (it will have made room).
    pub(crate) fn close_least_recent<T>(
        &self,
        sources: &[T],
        activity: impl Fn(&T) -> &Activity,
        close: impl Fn(&T) -> bool,
    ) {
        let Ok(_closing) = self.closing.try_lock() else { return };
        let mut open: Vec<(u64, &T)> = sources
            .iter()
            .filter(|e| activity(e).open.load(Relaxed))
            .map(|e| (activity(e).last_read.load(Relaxed), e))
            .collect();
        let keep = OPEN_SOURCES / 4 * 3;
        if open.len() <= keep {
            return;
        }
        open.sort_unstable_by_key(|&(last_read, _)| last_read);
        for &(_, source) in &open[..open.len() - keep] {
            self.close_one(source, activity(source), &close);
        }
    }

    /// Closes the descriptors of each of `sources` that holds some and was last read `idle` or
    /// more ago (as [`Budget::close_least_recent`] closes them: a descriptor in use stays, to be
    /// closed at a later call). Another thread already closing: nothing.
    pub(crate) fn close_idle<T>(
        &self,
        sources: &[T],
        activity: impl Fn(&T) -> &Activity,
        close: impl Fn(&T) -> bool,
        idle: Duration,
    ) {
        let Ok(_closing) = self.closing.try_lock() else { return };
        let now = self.millis();
        let idle = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        for source in sources {
            let part = activity(source);
            if part.open.load(Relaxed) && now.saturating_sub(part.last_read_ms.load(Relaxed)) >= idle {
                self.close_one(source, part, &close);
            }
        }
    }

    /// Closes one source's descriptors, keeping the count of sources that hold some right.
    fn close_one<T>(&self, source: &T, activity: &Activity, close: &impl Fn(&T) -> bool) {
        // Unmarked first: a read racing with the close marks it again (and counts it).
        if activity.open.swap(false, Relaxed) {
            self.open.fetch_sub(1, Relaxed);
        }
        if !close(source) && !activity.open.swap(true, Relaxed) {
            self.open.fetch_add(1, Relaxed);
        }
    }

    /// Milliseconds since the budget was made.
    fn millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A source as the budget sees it: its part, and its idle descriptors (a count).
    #[derive(Default)]
    struct Held {
        activity: Activity,
        descriptors: AtomicUsize,
        busy: AtomicBool,
    }

    fn close(held: &Held) -> bool {
        if held.busy.load(Relaxed) {
            return false;
        }
        held.descriptors.store(0, Relaxed);
        true
    }

    #[test]
    fn only_the_most_recently_read_sources_keep_descriptors() {
        let sources: Vec<Held> = (0..10 * OPEN_SOURCES).map(|_| Held::default()).collect();
        let budget = Budget::default();
        let open = |sources: &[Held]| sources.iter().map(|h| h.descriptors.load(Relaxed)).sum::<usize>();
        // One source has a load in flight throughout: it keeps its descriptors and stays counted.
        sources[1].busy.store(true, Relaxed);
        for held in &sources {
            if budget.on_read(&held.activity) {
                budget.close_least_recent(&sources, |h| &h.activity, close);
            }
            // A read leaves two descriptors behind.
            held.descriptors.fetch_add(2, Relaxed);
            assert!(budget.open.load(Relaxed) <= OPEN_SOURCES);
            assert!(open(&sources) <= 2 * OPEN_SOURCES, "{} descriptors open", open(&sources));
        }
        // The sources read last kept theirs; the first ones closed theirs, but the busy one.
        assert!(sources.last().unwrap().activity.open.load(Relaxed));
        assert_eq!(sources.last().unwrap().descriptors.load(Relaxed), 2);
        assert!(!sources[0].activity.open.load(Relaxed));
        assert_eq!(sources[0].descriptors.load(Relaxed), 0);
        assert!(sources[1].activity.open.load(Relaxed));
        assert_eq!(sources[1].descriptors.load(Relaxed), 2);
        // Once its load is done, the next round closes it.
        sources[1].busy.store(false, Relaxed);
        let fresh: Vec<Held> = (0..OPEN_SOURCES).map(|_| Held::default()).collect();
        for held in &fresh {
            if budget.on_read(&held.activity) {
                budget.close_least_recent(&sources, |h| &h.activity, close);
            }
        }
        assert_eq!(sources[1].descriptors.load(Relaxed), 0);
        // Read again, a source counts again, and is the last to be closed.
        if budget.on_read(&sources[0].activity) {
            budget.close_least_recent(&sources, |h| &h.activity, close);
        }
        assert!(sources[0].activity.open.load(Relaxed));
    }

    #[test]
    fn sources_idle_for_long_enough_close_their_descriptors() {
        let sources: Vec<Held> = (0..3).map(|_| Held::default()).collect();
        let budget = Budget::default();
        for held in &sources {
            budget.on_read(&held.activity);
            held.descriptors.fetch_add(2, Relaxed);
        }
        // Nothing has been idle for a minute.
        budget.close_idle(&sources, |h| &h.activity, close, Duration::from_secs(60));
        assert!(sources.iter().all(|h| h.descriptors.load(Relaxed) == 2));
        // Idle for 20 ms: all close, but the one with a load in flight, which a later sweep closes.
        sources[2].busy.store(true, Relaxed);
        std::thread::sleep(Duration::from_millis(30));
        budget.on_read(&sources[1].activity);
        budget.close_idle(&sources, |h| &h.activity, close, Duration::from_millis(20));
        let held: Vec<usize> = sources.iter().map(|h| h.descriptors.load(Relaxed)).collect();
        assert_eq!(held, [0, 2, 2], "the one just read and the busy one keep theirs");
        assert_eq!(budget.open.load(Relaxed), 2);
        sources[2].busy.store(false, Relaxed);
        std::thread::sleep(Duration::from_millis(30));
        budget.close_idle(&sources, |h| &h.activity, close, Duration::from_millis(20));
        assert!(sources.iter().all(|h| h.descriptors.load(Relaxed) == 0));
        assert_eq!(budget.open.load(Relaxed), 0);
    }
}

//! The mount's descriptor budget: how many sources may keep descriptors open at once.
//!
//! A source keeps descriptors from its first read on: its streams' and their prefetch lanes', its
//! spares (`spares`), and what the source keeps itself (a local file's mapping, an HTTP reader's
//! keep-alive connection is its reader's). Once more than [`OPEN_SOURCES`] sources hold them,
//! the least recently read ones close all they hold (each reopens at its next read), so a mount
//! of a thousand shards read one after the other keeps the descriptors of a few dozen, not of
//! every shard it has read, and never runs into the process's limit on open files.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::shared::SourceEntry;
use super::tuning::OPEN_SOURCES;

/// The engine's count of sources holding descriptors, and the clock that orders their reads.
#[derive(Default)]
pub(crate) struct Budget {
    /// Counts reads, to find the least recently read sources.
    clock: AtomicU64,
    /// Sources marked as holding descriptors ([`Activity::open`]).
    open: AtomicUsize,
    /// Held while one thread closes sources' descriptors; others do not wait for it.
    closing: Mutex<()>,
}

/// One source's part of the budget.
#[derive(Default)]
pub(crate) struct Activity {
    /// The budget's clock at the source's last read.
    last_read: AtomicU64,
    /// Whether the source may hold descriptors (read since they were last all closed).
    open: AtomicBool,
}

impl Budget {
    /// Records a read of the source whose part is `activity`. True when this made more than
    /// [`OPEN_SOURCES`] sources hold descriptors: the caller then calls
    /// [`Budget::close_least_recent`].
    pub(crate) fn on_read(&self, activity: &Activity) -> bool {
        activity.last_read.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        if activity.open.load(Relaxed) || activity.open.swap(true, Relaxed) {
            return false;
        }
        self.open.fetch_add(1, Relaxed) + 1 > OPEN_SOURCES
    }

    /// Closes the descriptors of the least recently read of `sources` until three quarters of
    /// [`OPEN_SOURCES`] hold any (a quarter of room, so this runs once per that many newly read
    /// sources, not at each). A source with a descriptor in use right now (a load in flight)
    /// keeps it and stays counted, to be closed at a later round. Another thread already closing:
    /// nothing (it will have made room).
    pub(crate) fn close_least_recent(&self, sources: &[Arc<SourceEntry>]) {
        let Ok(_closing) = self.closing.try_lock() else { return };
        let mut open: Vec<(u64, &SourceEntry)> = sources
            .iter()
            .filter(|e| e.activity.open.load(Relaxed))
            .map(|e| (e.activity.last_read.load(Relaxed), &**e))
            .collect();
        let keep = OPEN_SOURCES / 4 * 3;
        if open.len() <= keep {
            return;
        }
        open.sort_unstable_by_key(|&(last_read, _)| last_read);
        for &(_, entry) in &open[..open.len() - keep] {
            // Unmarked first: a read racing with the close marks it again (and counts it).
            if entry.activity.open.swap(false, Relaxed) {
                self.open.fetch_sub(1, Relaxed);
            }
            if !entry.close_descriptors() && !entry.activity.open.swap(true, Relaxed) {
                self.open.fetch_add(1, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::readahead::ReadaheadConfig;
    use crate::source::{Source, SourceReader};
    use std::io;

    /// A source whose readers count themselves while open.
    struct Counted(Arc<AtomicUsize>);

    struct Reader(Arc<AtomicUsize>);

    impl Drop for Reader {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Relaxed);
        }
    }

    impl SourceReader for Reader {
        fn read_exact_at(&mut self, _: &mut [u8], _: u64) -> io::Result<()> {
            Ok(())
        }
    }

    impl Source for Counted {
        fn len(&self) -> u64 {
            1
        }
        fn name(&self) -> &str {
            "counted"
        }
        fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
            self.0.fetch_add(1, Relaxed);
            Ok(Box::new(Reader(Arc::clone(&self.0))))
        }
    }

    #[test]
    fn only_the_most_recently_read_sources_keep_descriptors() {
        let open = Arc::new(AtomicUsize::new(0));
        let entries: Vec<Arc<SourceEntry>> = (0..10 * OPEN_SOURCES)
            .map(|id| {
                let source = Arc::new(Counted(Arc::clone(&open)));
                Arc::new(SourceEntry::new(id, source, ReadaheadConfig::new(1, 1 << 20), None, false))
            })
            .collect();
        let budget = Budget::default();
        for entry in &entries {
            if budget.on_read(&entry.activity) {
                budget.close_least_recent(&entries);
            }
            // A read leaves two idle descriptors behind; one read again leaves none more.
            entry.spares.keep(entry.source.open_reader().ok());
            entry.spares.keep(entry.source.open_reader().ok());
            assert!(budget.open.load(Relaxed) <= OPEN_SOURCES);
            assert!(open.load(Relaxed) <= 2 * OPEN_SOURCES, "{} descriptors open", open.load(Relaxed));
        }
        // The sources read last kept theirs; the first ones closed theirs.
        assert!(entries.last().unwrap().activity.open.load(Relaxed));
        assert!(entries.last().unwrap().spares.take().is_some());
        assert!(!entries[0].activity.open.load(Relaxed));
        assert!(entries[0].spares.take().is_none());
        // Read again, a source counts again, and is the last to be closed.
        if budget.on_read(&entries[0].activity) {
            budget.close_least_recent(&entries);
        }
        assert!(entries[0].activity.open.load(Relaxed));
    }
}

//! The control file `.stfs/stats.json`: the live counters as a JSON document. Each lookup of its
//! name takes a snapshot under an inode number of its own (the kernel looks the name up at every
//! open), which serves every read and getattr of that inode unchanged until the kernel forgets it.
//! So each opener reads one whole document of one size, however many others open the file
//! meanwhile: the way procfs gives each open its own buffer, without a round trip per open.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::stats::Stats;
use crate::tree::namespace::{Content, Ino, NodeKind};
use crate::util::lock;

/// The first inode number given to a snapshot; the tree's own inodes are numbered from 1 and
/// never reach it.
pub(crate) const FIRST_SNAPSHOT_INO: Ino = 1 << 48;

/// Snapshots kept at once: beyond it the oldest is dropped (its inode then reads as gone). The
/// kernel forgets a snapshot's inode soon after its file is closed, so only readers holding the
/// file open count; a few thousand documents of about 2 KiB is a few MiB.
const MAX_SNAPSHOTS: usize = 4096;

/// One rendering of the document.
#[derive(Clone)]
pub(crate) struct Snapshot {
    /// The document's bytes.
    pub(crate) bytes: Arc<[u8]>,
    /// When it was taken: its mtime.
    pub(crate) taken: SystemTime,
}

/// The stats document's snapshots, by inode.
pub(crate) struct StatsFile {
    stats: Arc<Stats>,
    state: Mutex<Snapshots>,
}

struct Snapshots {
    /// Snapshots the kernel may still ask for, oldest (lowest inode) first.
    by_ino: BTreeMap<Ino, Snapshot>,
    /// The inode the next snapshot gets.
    next_ino: Ino,
    /// The last snapshot taken, for the tree's own inode of the file (a `readdirplus` entry).
    latest: Snapshot,
}

impl StatsFile {
    /// The document of `stats`, rendered once now.
    pub(crate) fn new(stats: Arc<Stats>) -> StatsFile {
        let latest = Snapshot { bytes: render(&stats), taken: SystemTime::now() };
        let state = Snapshots { by_ino: BTreeMap::new(), next_ino: FIRST_SNAPSHOT_INO, latest };
        StatsFile { stats, state: Mutex::new(state) }
    }

    /// Renders the document anew under a new inode (its mtime later than the last one's), and
    /// returns both.
    pub(crate) fn take(&self) -> (Ino, Snapshot) {
        let bytes = render(&self.stats);
        let mut state = lock(&self.state);
        let mut taken = SystemTime::now();
        if taken <= state.latest.taken {
            taken = state.latest.taken + Duration::from_nanos(1);
        }
        let snapshot = Snapshot { bytes, taken };
        let ino = state.next_ino;
        state.next_ino += 1;
        state.by_ino.insert(ino, snapshot.clone());
        if state.by_ino.len() > MAX_SNAPSHOTS {
            state.by_ino.pop_first();
        }
        state.latest = snapshot.clone();
        (ino, snapshot)
    }

    /// The snapshot of inode `ino`, if it is one the kernel may still hold.
    pub(crate) fn snapshot(&self, ino: Ino) -> Option<Snapshot> {
        lock(&self.state).by_ino.get(&ino).cloned()
    }

    /// The last snapshot taken.
    pub(crate) fn latest(&self) -> Snapshot {
        lock(&self.state).latest.clone()
    }

    /// The kernel has forgotten inode `ino`: its snapshot goes.
    pub(crate) fn forget(&self, ino: Ino) {
        lock(&self.state).by_ino.remove(&ino);
    }

    /// Snapshots held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        lock(&self.state).by_ino.len()
    }
}

/// Whether `ino` is in the range of snapshot inodes (it may have been forgotten since).
pub(crate) fn is_snapshot_ino(ino: Ino) -> bool {
    ino >= FIRST_SNAPSHOT_INO
}

/// Whether a node is the stats document, rendered anew at each lookup.
pub(crate) fn is_stats(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::File { content: Content::Stats, .. })
}

/// The document: the counters as pretty JSON, ending in a newline.
fn render(stats: &Stats) -> Arc<[u8]> {
    let mut json = serde_json::to_vec_pretty(&stats.to_json()).unwrap_or_default();
    json.push(b'\n');
    json.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn each_snapshot_keeps_its_document_until_forgotten() {
        let stats = Arc::new(Stats::default());
        let file = StatsFile::new(Arc::clone(&stats));
        let (first, a) = file.take();
        stats.kernel_open_requests.fetch_add(1000, Relaxed);
        let (second, b) = file.take();
        assert_ne!(first, second);
        assert!(first >= FIRST_SNAPSHOT_INO && is_snapshot_ino(second));
        assert!(b.taken > a.taken, "a later snapshot has a later mtime");
        assert_ne!(a.bytes, b.bytes);
        assert_eq!(file.snapshot(first).unwrap().bytes, a.bytes, "the first keeps its own document");
        assert_eq!(file.latest().bytes, b.bytes);
        file.forget(first);
        assert!(file.snapshot(first).is_none());
        assert_eq!(file.snapshot(second).unwrap().bytes, b.bytes);
    }

    #[test]
    fn holds_at_most_max_snapshots_dropping_the_oldest() {
        let file = StatsFile::new(Arc::new(Stats::default()));
        let (oldest, _) = file.take();
        for _ in 0..MAX_SNAPSHOTS {
            file.take();
        }
        assert_eq!(file.held(), MAX_SNAPSHOTS);
        assert!(file.snapshot(oldest).is_none());
        assert!(file.snapshot(oldest + 1).is_some());
    }
}

//! The control file `.stfs/stats.json`: the live counters as a JSON document. A lookup of its
//! name takes a snapshot under an inode number of its own (the kernel looks the name up at every
//! open), which serves every read and getattr of that inode unchanged until the kernel forgets it.
//! So each opener reads one whole document of one size, however many others open the file
//! meanwhile: the way procfs gives each open its own buffer, without a round trip per open.
//!
//! A lookup answers the last snapshot again, instead of taking a new one, while nothing has read
//! it and it is less than [`REUSED_WITHIN`] old: the lookup an open makes right after a `stat` of
//! the name (`cp`, `tar`: stat, open, fstat, read to the end) so finds the inode, size and mtime
//! the stat gave. Before, the open's lookup took another snapshot under another inode, and `cp`
//! skipped the file ("replaced while being copied"); a reader that reads gets a fresh document at
//! its next open as before.
//!
//! A snapshot answered to several lookups goes once the kernel has forgotten each (a FORGET
//! carries how many it forgets); [`MAX_SNAPSHOTS`] bounds them all the same.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

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

/// How long an unread snapshot answers the lookups of the name: the time a copying tool may take
/// between its `stat` and its `open` on a loaded machine, and the most a document read after a
/// bare `stat` (`ls -l`) lags behind the counters.
pub(crate) const REUSED_WITHIN: Duration = Duration::from_secs(1);

/// One rendering of the document.
#[derive(Clone)]
pub(crate) struct Snapshot {
    /// The document's bytes.
    pub(crate) bytes: Arc<[u8]>,
    /// When it was taken: its mtime.
    pub(crate) taken: SystemTime,
}

/// A snapshot the kernel may still ask for.
struct Held {
    snapshot: Snapshot,
    /// When it was taken, for [`REUSED_WITHIN`].
    at: Instant,
    /// Lookups answered with it, less the FORGETs heard for it.
    lookups: u64,
    /// Some of its bytes were read: the next lookup takes a new one.
    read: bool,
}

/// The stats document's snapshots, by inode.
pub(crate) struct StatsFile {
    stats: Arc<Stats>,
    state: Mutex<Snapshots>,
}

struct Snapshots {
    /// Snapshots the kernel may still ask for, oldest (lowest inode) first.
    by_ino: BTreeMap<Ino, Held>,
    /// The inode the next snapshot gets.
    next_ino: Ino,
    /// The last snapshot taken, for the tree's own inode of the file (a `readdirplus` entry); none
    /// until the first is asked for (a reader with no mount, the Python module, never asks).
    latest: Option<Snapshot>,
    /// Its inode.
    latest_ino: Option<Ino>,
}

impl StatsFile {
    /// The document of `stats`, rendered when first asked for (rendering samples the process:
    /// a tenth of a millisecond of every in-process open, which never reads it).
    pub(crate) fn new(stats: Arc<Stats>) -> StatsFile {
        let state = Snapshots { by_ino: BTreeMap::new(), next_ino: FIRST_SNAPSHOT_INO, latest: None, latest_ino: None };
        StatsFile { stats, state: Mutex::new(state) }
    }

    /// The snapshot a lookup of the name answers, and its inode: the last one while it is unread
    /// and younger than [`REUSED_WITHIN`], else the document rendered anew under a new inode (its
    /// mtime later than the last one's).
    pub(crate) fn look_up(&self) -> (Ino, Snapshot) {
        if let Some(found) = self.reusable() {
            return found;
        }
        let bytes = render(&self.stats);
        let mut state = lock(&self.state);
        let mut taken = SystemTime::now();
        if let Some(before) = state.latest.as_ref().map(|s| s.taken).filter(|&t| taken <= t) {
            taken = before + Duration::from_nanos(1);
        }
        let snapshot = Snapshot { bytes, taken };
        let ino = state.next_ino;
        state.next_ino += 1;
        state.by_ino.insert(ino, Held { snapshot: snapshot.clone(), at: Instant::now(), lookups: 1, read: false });
        if state.by_ino.len() > MAX_SNAPSHOTS {
            state.by_ino.pop_first();
        }
        state.latest = Some(snapshot.clone());
        state.latest_ino = Some(ino);
        (ino, snapshot)
    }

    /// The last snapshot, counted as looked up once more, if a lookup may answer it again.
    fn reusable(&self) -> Option<(Ino, Snapshot)> {
        let mut state = lock(&self.state);
        let ino = state.latest_ino?;
        let held = state.by_ino.get_mut(&ino).filter(|h| !h.read && h.at.elapsed() < REUSED_WITHIN)?;
        held.lookups += 1;
        Some((ino, held.snapshot.clone()))
    }

    /// The snapshot of inode `ino`, if it is one the kernel may still hold.
    pub(crate) fn snapshot(&self, ino: Ino) -> Option<Snapshot> {
        lock(&self.state).by_ino.get(&ino).map(|h| h.snapshot.clone())
    }

    /// The snapshot of inode `ino`, to read from: the next lookup takes a new one.
    pub(crate) fn read(&self, ino: Ino) -> Option<Snapshot> {
        let mut state = lock(&self.state);
        let held = state.by_ino.get_mut(&ino)?;
        held.read = true;
        Some(held.snapshot.clone())
    }

    /// The last snapshot taken (the first, rendered now, if none was).
    pub(crate) fn latest(&self) -> Snapshot {
        let mut state = lock(&self.state);
        state.latest.get_or_insert_with(|| Snapshot { bytes: render(&self.stats), taken: SystemTime::now() }).clone()
    }

    /// The kernel has forgotten `lookups` of its lookups of inode `ino` (FORGET's count): its
    /// snapshot goes once every lookup answered with it is forgotten.
    pub(crate) fn forget(&self, ino: Ino, lookups: u64) {
        let mut state = lock(&self.state);
        if let Some(held) = state.by_ino.get_mut(&ino) {
            held.lookups = held.lookups.saturating_sub(lookups);
            if held.lookups == 0 {
                state.by_ino.remove(&ino);
            }
        }
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
        let (first, a) = file.look_up();
        file.read(first).unwrap();
        stats.kernel_open_requests.fetch_add(1000, Relaxed);
        let (second, b) = file.look_up();
        assert_ne!(first, second);
        assert!(first >= FIRST_SNAPSHOT_INO && is_snapshot_ino(second));
        assert!(b.taken > a.taken, "a later snapshot has a later mtime");
        assert_ne!(a.bytes, b.bytes);
        assert_eq!(file.snapshot(first).unwrap().bytes, a.bytes, "the first keeps its own document");
        assert_eq!(file.latest().bytes, b.bytes);
        file.forget(first, 1);
        assert!(file.snapshot(first).is_none());
        assert_eq!(file.snapshot(second).unwrap().bytes, b.bytes);
    }

    /// Issue 44, item 10: `cp` stats the name, opens it (the kernel looks it up again), fstats
    /// the open file and compares the inodes. Until something reads it, and for at most
    /// [`REUSED_WITHIN`], a lookup answers the last snapshot; it goes once each lookup answered
    /// with it is forgotten.
    #[test]
    fn a_lookup_answers_the_last_snapshot_until_it_is_read() {
        let stats = Arc::new(Stats::default());
        let file = StatsFile::new(Arc::clone(&stats));
        let (stat, a) = file.look_up();
        stats.kernel_open_requests.fetch_add(1000, Relaxed);
        let (open, b) = file.look_up();
        assert_eq!((open, b.taken), (stat, a.taken), "the open's lookup finds the stat's inode");
        assert_eq!(b.bytes, a.bytes);
        assert_eq!(file.read(open).unwrap().bytes, a.bytes);
        let (next, c) = file.look_up();
        assert_ne!(next, stat, "read: the next open gets a document of its own");
        assert_ne!(c.bytes, a.bytes);
        // Two lookups of `stat`: a FORGET of one leaves it, the next takes it.
        file.forget(stat, 1);
        assert!(file.snapshot(stat).is_some());
        file.forget(stat, 1);
        assert!(file.snapshot(stat).is_none());
        let other = StatsFile::new(Arc::new(Stats::default()));
        let (twice, _) = other.look_up();
        assert_eq!(other.look_up().0, twice);
        other.forget(twice, 1);
        assert!(other.snapshot(twice).is_some());
        other.forget(twice, 1);
        assert!(other.snapshot(twice).is_none());
        let (batched, _) = other.look_up();
        assert_eq!(other.look_up().0, batched);
        other.forget(batched, 2);
        assert!(other.snapshot(batched).is_none(), "a FORGET of two lookups takes the snapshot");
        // An unread snapshot older than REUSED_WITHIN is not answered again.
        lock(&file.state).by_ino.get_mut(&next).unwrap().at -= REUSED_WITHIN;
        assert_ne!(file.look_up().0, next);
    }

    #[test]
    fn holds_at_most_max_snapshots_dropping_the_oldest() {
        let file = StatsFile::new(Arc::new(Stats::default()));
        let (oldest, _) = file.look_up();
        file.read(oldest);
        for _ in 0..MAX_SNAPSHOTS {
            let (ino, _) = file.look_up();
            file.read(ino);
        }
        assert_eq!(file.held(), MAX_SNAPSHOTS);
        assert!(file.snapshot(oldest).is_none());
        assert!(file.snapshot(oldest + 1).is_some());
    }
}

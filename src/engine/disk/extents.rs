//! The extent files' lifecycle in this process: when one is assembled, when it is verified, and
//! when it is handed over for FUSE passthrough, all decided here; the FUSE adapter only says that
//! a tensor file was opened (and takes the file it is given, if any) or closed.
//!
//! Nothing here runs long on the caller's thread (a FUSE thread answering OPEN or RELEASE): an
//! open costs the quick check of `extent::open_checked` (two `stat`s and a 100-byte read), and
//! deciding to assemble costs a look at the blocks this process knows are on disk (`Tier`), not
//! a `stat` per block. Everything that reads a whole extent, its assembly and its full check (the
//! first open after a reboot, a restored copy), is queued for the disk tier's writer thread; the
//! tensor is served from its blocks meanwhile, and an open after the work is done gets the file.
//! The lock on the extents' states is held only to read or set one: the room on the directory's
//! filesystem (a `statvfs`, asked before a failed assembly is tried again) is measured outside
//! it, so a slow or hung cache filesystem stalls only the close that asked, not every open.
//!
//! Each extent has at most one piece of work queued at a time. An assembly that found a block
//! missing forgets that block (the next close asks again once it is back); one that failed to
//! write (and left nothing behind: `extent::assemble`) is tried again only once the directory has
//! taken another write since, or after [`RETRY_FAILED_AFTER`]: a full or read-only disk is not
//! asked at every close, and a disk that takes writes again gets the extent. An extent found
//! corrupt is removed and may be assembled again.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::behind::{Job, WriteBehind};
use super::extent::{self, Assembled, Opened};
use super::store::ObjectKey;
use super::tier::Tier;
use crate::stats::Stats;
use crate::util::lock;

/// One extent: the source's key and the byte range.
type Id = (ObjectKey, u64, u64);

/// How long an assembly that failed to write waits before it may be tried again, if the directory
/// took no write meanwhile.
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(300);

/// Where an extent stands in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its assembly or its full check is queued or running.
    Queued,
    /// Its assembly failed to write, when the directory had taken `writes` writes
    /// ([`Tier::writes`]): tried again once it took another and its filesystem has room for the
    /// extent, or after [`RETRY_FAILED_AFTER`]. A block written meanwhile alone is no sign of room:
    /// on a filesystem other users fill, a retry at every close would read and write the whole
    /// extent again each time, only to fail.
    Failed { writes: u64, at: Instant },
}

impl State {
    /// Whether work on an extent of `bytes` bytes in this state may be queued now; `free` measures
    /// the room on the directory's filesystem, asked only of a failed extent whose directory took
    /// a write since. Called with no lock held: `free` is a `statvfs`, which a slow or hung cache
    /// filesystem may hold for as long as it likes.
    fn may_queue(state: Option<State>, tier: &Tier, bytes: u64, free: &FreeBytes) -> bool {
        match state {
            None => true,
            Some(State::Queued) => false,
            Some(State::Failed { writes, at }) => {
                at.elapsed() >= RETRY_FAILED_AFTER || (writes != tier.writes() && (free.0)(&tier.root) >= bytes)
            }
        }
    }
}

/// Measures the bytes free to this user on a directory's filesystem: [`super::open::free_bytes`],
/// or a test's probe (one that blocks, to show that no lock is held across it).
pub(crate) struct FreeBytes(Box<dyn Fn(&Path) -> u64 + Send + Sync>);

impl Default for FreeBytes {
    fn default() -> Self {
        FreeBytes(Box::new(super::open::free_bytes))
    }
}

impl fmt::Debug for FreeBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FreeBytes")
    }
}

/// A tensor file's extent: which source, which bytes, and the source's layout in blocks.
#[derive(Debug, Clone)]
pub(crate) struct Extent {
    pub(crate) key: ObjectKey,
    pub(crate) block_size: u64,
    pub(crate) source_len: u64,
    pub(crate) range: Range<u64>,
}

impl Extent {
    fn id(&self) -> Id {
        (self.key.clone(), self.range.start, self.range.end)
    }

    fn blocks(&self) -> Range<u64> {
        self.range.start / self.block_size..self.range.end.div_ceil(self.block_size)
    }

    fn name(&self) -> String {
        format!("extent {:?} of {}", self.range, self.key.as_str())
    }
}

/// The extent files of one cache directory as this process handles them.
#[derive(Debug)]
pub(crate) struct Extents {
    /// Extent files are made and served (the mount can pass them to the kernel).
    on: AtomicBool,
    /// Extent files may be turned on (not `--no-passthrough`).
    allowed: AtomicBool,
    /// Where each extent stands. Held only to read or set an entry: never across a system call.
    states: Mutex<HashMap<Id, State>>,
    /// The room on the directory's filesystem, asked before a failed assembly is tried again.
    free: FreeBytes,
}

impl Default for Extents {
    fn default() -> Self {
        Extents::with_free_bytes(FreeBytes::default())
    }
}

impl Extents {
    /// Extent files off until [`Extents::enable`], asking `free` for the room on the directory's
    /// filesystem.
    fn with_free_bytes(free: FreeBytes) -> Extents {
        Extents { on: AtomicBool::new(false), allowed: AtomicBool::new(true), states: Mutex::default(), free }
    }

    /// Turns extent files on, unless forbidden; returns whether they are on.
    pub(crate) fn enable(&self) -> bool {
        let on = self.allowed.load(Relaxed);
        self.on.store(on, Relaxed);
        on
    }

    /// Keeps extent files off (`--no-passthrough`).
    pub(crate) fn forbid(&self) {
        self.allowed.store(false, Relaxed);
        self.on.store(false, Relaxed);
    }

    /// A tensor file spanning `extent` is opened: its extent file if it is there and passes the
    /// quick check, for the kernel to read. Otherwise `None` (the tensor is served from its
    /// blocks), having queued what would make the next open find one: the full check of a file
    /// whose stats or boot differ from its record, or the assembly of a missing one whose blocks
    /// are all on disk.
    pub(crate) fn opened(
        self: &Arc<Self>,
        tier: &Arc<Tier>,
        queue: &Arc<WriteBehind>,
        extent: &Extent,
    ) -> Option<File> {
        if !self.usable(extent) {
            return None;
        }
        match extent::open_checked(&tier.root, &extent.key, &extent.range) {
            Opened::Verified(file) => Some(file),
            Opened::Unchecked => {
                self.queue_work(tier, queue, extent, Work::Check);
                None
            }
            Opened::Absent => {
                self.want(tier, queue, extent);
                None
            }
            opened => {
                self.failed(tier, extent, opened);
                None
            }
        }
    }

    /// A tensor file spanning `extent` was closed (its blocks may all be on disk now): queues the
    /// assembly of its extent file if it has none and every block it covers is on disk or
    /// queued for it. Costs one `stat` and a look at the blocks known to be on disk.
    pub(crate) fn closed(self: &Arc<Self>, tier: &Arc<Tier>, queue: &Arc<WriteBehind>, extent: &Extent) {
        let idle = || self.may_queue(tier, extent, self.state(&extent.id()));
        if self.usable(extent) && idle() && !extent::extent_path(&tier.root, &extent.key, &extent.range).exists() {
            self.want(tier, queue, extent);
        }
    }

    /// Where `id` stands now (the lock is held for the look only).
    fn state(&self, id: &Id) -> Option<State> {
        lock(&self.states).get(id).copied()
    }

    /// Whether work on `extent`, found in `state`, may be queued now (no lock held: see
    /// [`State::may_queue`]).
    fn may_queue(&self, tier: &Tier, extent: &Extent, state: Option<State>) -> bool {
        State::may_queue(state, tier, extent.range.end - extent.range.start, &self.free)
    }

    fn usable(&self, extent: &Extent) -> bool {
        self.on.load(Relaxed) && !extent.range.is_empty() && extent.block_size > 0
    }

    /// Queues the assembly of `extent` if every block it covers is on disk or queued.
    fn want(self: &Arc<Self>, tier: &Arc<Tier>, queue: &Arc<WriteBehind>, extent: &Extent) {
        if tier.all_present(&extent.key, extent.blocks(), |b| queue.get(&extent.key, b).is_some()) {
            self.queue_work(tier, queue, extent, Work::Assemble);
        }
    }

    /// Queues `work` on `extent` for the writer thread, unless work on it is queued already (or
    /// its assembly failed and may not be tried again yet).
    fn queue_work(self: &Arc<Self>, tier: &Arc<Tier>, queue: &Arc<WriteBehind>, extent: &Extent, work: Work) {
        let id = extent.id();
        let seen = self.state(&id);
        if !self.may_queue(tier, extent, seen) {
            return;
        }
        {
            // Queued only if nobody changed its state while the room was measured (another
            // thread may have queued it meanwhile).
            let mut states = lock(&self.states);
            if states.get(&id).copied() != seen {
                return;
            }
            states.insert(id.clone(), State::Queued);
        }
        let (this, job_extent) = (Arc::clone(self), extent.clone());
        let job = Job::Extent(Box::new(move |tier: &Tier| this.run(tier, &job_extent, work)));
        if !queue.push_extent(tier, job) {
            lock(&self.states).remove(&id);
        }
    }

    /// Runs `work` on `extent` (on the writer thread).
    fn run(&self, tier: &Tier, extent: &Extent, work: Work) {
        let Extent { key, block_size, source_len, range } = extent;
        let mut next = None;
        match work {
            Work::Assemble => match extent::assemble(&tier.root, key, *block_size, *source_len, range) {
                Ok(Assembled::Written(bytes)) => {
                    Stats::add(&tier.stats.disk_cache_extents_written, 1);
                    tier.wrote(bytes);
                }
                Ok(Assembled::Missing(block)) => {
                    log::debug!("{}: block {block} is not on disk", extent.name());
                    tier.mark(key, block, false);
                }
                Ok(Assembled::Published) => log::debug!("{}: published by another process first", extent.name()),
                Err(e) => {
                    tier.failed_write(&e);
                    next = Some(State::Failed { writes: tier.writes(), at: Instant::now() });
                }
            },
            Work::Check => match extent::check(&tier.root, key, range) {
                Opened::Verified(_) => log::info!("{}: verified in full (its record was stale)", extent.name()),
                Opened::Absent | Opened::Unpublished => {}
                opened => self.failed(tier, extent, opened),
            },
        }
        let mut states = lock(&self.states);
        match next {
            Some(state) => states.insert(extent.id(), state),
            None => states.remove(&extent.id()),
        };
    }

    /// Counts and logs an extent file that could not be used; one found corrupt was removed, and
    /// may be assembled again.
    fn failed(&self, tier: &Tier, extent: &Extent, opened: Opened) {
        let stats = &tier.stats;
        match opened {
            Opened::Corrupt(why) => {
                Stats::add(&stats.disk_cache_corrupt, 1);
                log::warn!("{}: {why}; removed, served from blocks", extent.name());
                lock(&self.states).remove(&extent.id());
            }
            Opened::Io(e) => {
                Stats::add(&stats.disk_cache_errors, 1);
                log::debug!("{}: {e}", extent.name());
            }
            Opened::Unpublished => log::debug!("{}: being published by another process", extent.name()),
            Opened::Verified(_) | Opened::Unchecked | Opened::Absent => {}
        }
    }
}

/// What the writer thread does to an extent.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// Assemble it from its blocks (`extent::assemble`).
    Assemble,
    /// Check it in full against its record (`extent::check`).
    Check,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{Extent, Extents, FreeBytes, State};
    use crate::util::lock;

    /// Issue 44, item 5: the room on the cache's filesystem (a `statvfs`) is measured with no lock
    /// held, so a slow or hung cache filesystem holds up only the close that asked, never another
    /// tensor's open or close. Here the probe blocks until the test lets go (30 s at most) while
    /// another extent is opened and closed; before, both waited for the `states` lock.
    #[test]
    fn a_slow_free_space_probe_holds_up_no_other_open_or_close() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cache, stats, key, _) = super::super::tests::with_blocks(dir.path());
        let (entered, probing) = mpsc::channel();
        // The probe waits until `release` is dropped.
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let probe = FreeBytes(Box::new(move |dir: &std::path::Path| {
            let _ = entered.send(());
            let _ = lock(&released).recv_timeout(Duration::from_secs(30));
            super::super::open::free_bytes(dir)
        }));
        let extents = Arc::new(Extents::with_free_bytes(probe));
        assert!(extents.enable());
        cache.extents = Arc::clone(&extents);
        let cache = Arc::new(cache);
        // An extent whose assembly failed when the directory had taken no write: it has taken six
        // since (the blocks), so its next close measures the room before trying again.
        let failed = Extent { key: key.clone(), block_size: 1000, source_len: 5500, range: 0..900 };
        lock(&extents.states).insert(failed.id(), State::Failed { writes: 0, at: Instant::now() });
        let closing = {
            let cache = Arc::clone(&cache);
            let key = key.clone();
            std::thread::spawn(move || cache.extent_closed(&key, 1000, 5500, 0..900))
        };
        probing.recv_timeout(Duration::from_secs(10)).expect("the close never measured the room");
        // Meanwhile another tensor (blocks 1..2, all on disk) is opened and closed.
        let (done, finished) = mpsc::channel();
        let other = {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                let started = Instant::now();
                let file = cache.extent_opened(&key, 1000, 5500, 1000..2000);
                cache.extent_closed(&key, 1000, 5500, 1000..2000);
                let _ = done.send((file.is_none(), started.elapsed()));
            })
        };
        let other_finished = finished.recv_timeout(Duration::from_secs(5));
        drop(release); // lets the probe go (every call of it from now on)
        closing.join().unwrap();
        other.join().unwrap();
        let (served_from_blocks, took) = other_finished.expect("another extent's open and close waited for the probe");
        assert!(served_from_blocks && took < Duration::from_secs(5), "{took:?}");
        // Both extents are assembled in the end: the failed one, the disk having room, is retried.
        assert!(cache.flush(Duration::from_secs(10)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.disk_cache_extents_written.load(Relaxed) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stats.disk_cache_extents_written.load(Relaxed), 2);
    }
}

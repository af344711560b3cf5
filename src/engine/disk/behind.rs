//! Write-behind: the disk tier's writes leave the reader's path. A block that lands from the store
//! is copied into a bounded queue and handed to the reader at once; one writer thread (started
//! with the first write, so after the daemon forks) stores the queued blocks in order. Until its
//! file is written a queued block is served from the queue, so a reader never refetches a block
//! only because its write is late. When the queue is full a reader's own load drops its write
//! (counted in `disk_cache_write_drops`; a later mount fetches that block again) rather than wait
//! for the disk; a prefetch lane makes its block pending before readers get it and then waits,
//! bounded by [`LANE_WAIT`], for room. Extent jobs (`extents`: assembly, verification) run on
//! the same thread once no block is queued or pending. When the cache is dropped (at unmount)
//! the queue is flushed for at most [`FLUSH_WAIT`] and the writer given [`STOP_WAIT`] to end its
//! job; a writer still busy then (a multi-GB extent, a hung disk) is abandoned to the process's
//! exit, and the temporary file it leaves is removed by a later scan (`evict`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::store::ObjectKey;
use super::tier::Tier;
use crate::stats::Stats;
use crate::util::{lock, wait, wait_while};

/// Bytes of blocks the queue holds at most: sixteen 4 MiB blocks, enough for two of a URL's
/// 8 MiB prefetch chunks per lane to wait for the disk.
pub(crate) const QUEUE_BYTES: u64 = 64 << 20;

/// How long a prefetch lane waits for room in a full queue before dropping its write.
pub(crate) const LANE_WAIT: Duration = Duration::from_secs(5);

/// How long dropping the cache waits for the queue to drain before giving up on the rest: with
/// [`STOP_WAIT`], what the disk cache adds to a daemon's exit at most, well within the 10 s an
/// unmount may take to end its daemon.
pub(crate) const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// How long stopping the writer waits for it to end its current job before leaving it behind.
pub(crate) const STOP_WAIT: Duration = Duration::from_secs(2);

/// Spare buffers kept for the next copies (fresh 4 MiB allocations cost page faults).
const SPARES: usize = 4;

/// One queued write.
pub(crate) enum Job {
    /// Store block `block` of `key`.
    Block { key: ObjectKey, block: u64, data: Arc<Vec<u8>> },
    /// Work on an extent file (`extents`: its assembly from the blocks on disk, or its full
    /// check). Taken only when no block waits, so the blocks queued before it are written by then.
    Extent(Box<dyn FnOnce(&Tier) + Send>),
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Extent jobs, after every block.
    extents: VecDeque<Job>,
    /// Blocks queued or being written, served from here until written.
    pending: HashMap<(ObjectKey, u64), Arc<Vec<u8>>>,
    /// Bytes of queued blocks, the one being written included.
    bytes: u64,
    /// The writer is working on a job it took off the queue.
    busy: bool,
    stopping: bool,
    /// The writer thread has returned.
    exited: bool,
    /// No lane waits for room any more (the engine is stopping).
    closed: bool,
    /// Blocks of prefetch lanes made pending and not queued yet (handed to readers, or waiting for
    /// room): extent jobs wait for them.
    waiting: usize,
    /// Tests hold the writer to see the queue as readers do.
    held: bool,
    spares: Vec<Vec<u8>>,
}

impl State {
    /// Nothing queued, nothing being written.
    fn drained(&self) -> bool {
        self.jobs.is_empty() && self.extents.is_empty() && !self.busy && self.waiting == 0
    }

    /// Block `block` of `key` is no longer pending, if `data` is still what is pending for it (a
    /// later copy of the same block stays).
    fn unpend(&mut self, key: ObjectKey, block: u64, data: &Arc<Vec<u8>>) {
        let entry = (key, block);
        if self.pending.get(&entry).is_some_and(|p| Arc::ptr_eq(p, data)) {
            self.pending.remove(&entry);
        }
    }
}

/// The queue and its writer thread.
#[derive(Default)]
pub(crate) struct WriteBehind {
    state: Mutex<State>,
    /// Signals the writer: a job was queued, or it must stop.
    work: Condvar,
    /// Signals flushers: the queue drained.
    idle: Condvar,
    /// Signals lanes waiting for room: a job is done.
    room: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("WriteBehind").field("jobs", &state.jobs.len()).field("bytes", &state.bytes).finish()
    }
}

impl WriteBehind {
    /// Queues block `block` of `key` (a copy of `data`) for `tier`; false (and counted) when the
    /// queue is full or the writer cannot start: the write is dropped.
    pub(crate) fn push(self: &Arc<Self>, tier: &Arc<Tier>, key: &ObjectKey, block: u64, data: &[u8]) -> bool {
        let len = data.len() as u64;
        let spare = {
            let mut state = lock(&self.state);
            if state.stopping || state.bytes + len > QUEUE_BYTES.max(len) || !self.start(tier) {
                drop(state);
                Stats::add(&tier.stats.disk_cache_write_drops, 1);
                return false;
            }
            state.bytes += len;
            state.spares.pop()
        };
        // The copy runs outside the lock: readers of other pending blocks do not wait for it.
        let data = copy_into(spare, data);
        let mut state = lock(&self.state);
        state.pending.insert((key.clone(), block), Arc::clone(&data));
        state.jobs.push_back(Job::Block { key: key.clone(), block, data });
        drop(state);
        self.work.notify_one();
        true
    }

    /// Makes a copy of block `block` of `key` (in a spare buffer) pending before the block is
    /// handed to readers, so that from then on it is served from here and counted as there by
    /// [`WriteBehind::get`]; extent jobs wait until it is queued by [`WriteBehind::push_pending`].
    pub(crate) fn pend(&self, key: &ObjectKey, block: u64, data: &[u8]) -> Arc<Vec<u8>> {
        let spare = lock(&self.state).spares.pop();
        let copy = copy_into(spare, data);
        let mut state = lock(&self.state);
        state.pending.insert((key.clone(), block), Arc::clone(&copy));
        state.waiting += 1;
        copy
    }

    /// Queues a block made pending by [`WriteBehind::pend`] for `tier`, waiting up to `wait` for
    /// room if the queue is full; false (and counted) when it stays full or the writer cannot
    /// start: the write is dropped (and the block no longer pending).
    pub(crate) fn push_pending(
        self: &Arc<Self>,
        tier: &Arc<Tier>,
        key: &ObjectKey,
        block: u64,
        data: Arc<Vec<u8>>,
        wait: Duration,
    ) -> bool {
        let len = data.len() as u64;
        let full = |s: &mut State| !s.stopping && s.bytes + len > QUEUE_BYTES.max(len);
        let wait = if lock(&self.state).closed { Duration::ZERO } else { wait };
        let mut state = lock(&self.state);
        state = wait_while(&self.room, state, wait, full);
        state.waiting -= 1;
        if state.stopping || full(&mut state) || !self.start(tier) {
            state.unpend(key.clone(), block, &data);
            drop(state);
            self.work.notify_one();
            Stats::add(&tier.stats.disk_cache_write_drops, 1);
            return false;
        }
        state.bytes += len;
        state.jobs.push_back(Job::Block { key: key.clone(), block, data });
        drop(state);
        self.work.notify_one();
        true
    }

    /// Queues an extent job (no bytes: it reads the blocks on disk); false if the writer cannot
    /// start or is stopping.
    pub(crate) fn push_extent(self: &Arc<Self>, tier: &Arc<Tier>, job: Job) -> bool {
        let mut state = lock(&self.state);
        if state.stopping || !self.start(tier) {
            return false;
        }
        state.extents.push_back(job);
        drop(state);
        self.work.notify_one();
        true
    }

    /// A queued block's bytes, if `block` of `key` is waiting to be written.
    pub(crate) fn get(&self, key: &ObjectKey, block: u64) -> Option<Arc<Vec<u8>>> {
        lock(&self.state).pending.get(&(key.clone(), block)).cloned()
    }

    /// Waits until every queued write is done, at most `timeout`; false if some are left.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.state);
        while !state.drained() {
            if state.held || state.stopping {
                return false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = wait_while(&self.idle, state, left, |s| !s.drained());
        }
        true
    }

    /// Lanes no longer wait for room (the engine is stopping): a block the full queue cannot
    /// take is dropped at once, so the lanes end without waiting on the disk.
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        self.room.notify_all();
    }

    /// Stops the writer after its current job, waiting at most `wait` for it; what is still
    /// queued is dropped (and counted). A writer that does not end in time is left running (it
    /// holds only its own references) and ends with the process.
    pub(crate) fn stop(&self, stats: &Stats, wait: Duration) {
        let left = {
            let mut state = lock(&self.state);
            state.stopping = true;
            self.room.notify_all();
            let left = state.jobs.len() as u64;
            state.jobs.clear();
            state.extents.clear();
            state.pending.clear();
            left
        };
        Stats::add(&stats.disk_cache_write_drops, left);
        self.work.notify_all();
        let Some(thread) = lock(&self.thread).take() else { return };
        let state = wait_while(&self.idle, lock(&self.state), wait, |s| !s.exited);
        if state.exited {
            drop(state);
            let _ = thread.join();
        } else {
            log::warn!(
                "the disk cache's writer is still busy after {wait:?} (a large extent or a slow disk); left behind"
            );
        }
    }

    /// Holds (or releases) the writer: tests look at the queue as a reader sees it.
    #[cfg(test)]
    pub(crate) fn hold(&self, held: bool) {
        lock(&self.state).held = held;
        self.work.notify_all();
    }

    /// Starts the writer thread if it is not running; false if it cannot be started.
    fn start(self: &Arc<Self>, tier: &Arc<Tier>) -> bool {
        let mut thread = lock(&self.thread);
        if thread.is_some() {
            return true;
        }
        let (queue, tier) = (Arc::clone(self), Arc::clone(tier));
        match std::thread::Builder::new().name("stfs-disk-write".into()).spawn(move || queue.run(&tier)) {
            Ok(handle) => {
                *thread = Some(handle);
                true
            }
            Err(e) => {
                log::warn!("no thread to write the disk cache: {e}");
                false
            }
        }
    }

    /// The writer: takes the jobs in order until stopped.
    fn run(&self, tier: &Tier) {
        let mut state = lock(&self.state);
        loop {
            if state.stopping {
                state.exited = true;
                self.idle.notify_all();
                return;
            }
            // An extent job only once every block queued or waiting for room is written.
            let job = if state.held {
                None
            } else if let Some(job) = state.jobs.pop_front() {
                Some(job)
            } else if state.waiting == 0 {
                state.extents.pop_front()
            } else {
                None
            };
            let Some(job) = job else {
                state = wait(&self.work, state);
                continue;
            };
            state.busy = true;
            drop(state);
            let done = match job {
                Job::Block { key, block, data } => {
                    tier.save(&key, block, &data);
                    Some((key, block, data))
                }
                Job::Extent(work) => {
                    work(tier);
                    None
                }
            };
            state = lock(&self.state);
            if let Some((key, block, data)) = done {
                state.unpend(key, block, &data);
                state.bytes = state.bytes.saturating_sub(data.len() as u64);
                if let Ok(buffer) = Arc::try_unwrap(data) {
                    if state.spares.len() < SPARES {
                        state.spares.push(buffer);
                    }
                }
            }
            state.busy = false;
            self.room.notify_all();
            if state.drained() {
                self.idle.notify_all();
            }
        }
    }
}

/// A copy of `data` in `spare` (a buffer a written block left) or a fresh one.
fn copy_into(spare: Option<Vec<u8>>, data: &[u8]) -> Arc<Vec<u8>> {
    let mut copy = spare.unwrap_or_default();
    copy.clear();
    copy.extend_from_slice(data);
    Arc::new(copy)
}

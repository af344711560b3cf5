//! Background prefetch plumbing: the bounded I/O thread pool and each stream's queue of blocks.
//!
//! The engine decides *what* to prefetch ([`crate::engine::readahead`]) and *how* to load a block; this
//! module only owns the threads, the bounded job queue, and the per-stream state that splits a
//! stream's pending blocks into chunks handed to up to [`LANES`] jobs, each on its own descriptor.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::tuning::LANES;
use crate::source::SourceReader;
use crate::util::lock;

/// A fixed set of threads running jobs from a bounded queue; submitting never blocks.
pub(crate) struct IoPool<J: Send + 'static> {
    jobs: Option<SyncSender<J>>,
    workers: Vec<JoinHandle<()>>,
}

impl<J: Send + 'static> IoPool<J> {
    /// Starts `threads` threads that run `handler` on each job; at most `queue_len` jobs wait.
    pub(crate) fn start<F>(threads: usize, queue_len: usize, handler: F) -> IoPool<J>
    where
        F: Fn(J) + Send + Sync + 'static,
    {
        let (sender, receiver) = mpsc::sync_channel(queue_len);
        let receiver = Arc::new(Mutex::new(receiver));
        let handler = Arc::new(handler);
        let workers = (0..threads)
            .filter_map(|n| {
                let (receiver, handler) = (Arc::clone(&receiver), Arc::clone(&handler));
                let spawned = std::thread::Builder::new()
                    .name(format!("stfs-io-{n}"))
                    .spawn(move || run_jobs(&receiver, &*handler));
                spawned.map_err(|e| log::warn!("cannot start I/O thread: {e}")).ok()
            })
            .collect::<Vec<_>>();
        let jobs = (!workers.is_empty()).then_some(sender);
        IoPool { jobs, workers }
    }

    /// Queues `job`; hands it back if the queue is full or there are no threads.
    pub(crate) fn try_submit(&self, job: J) -> Result<(), J> {
        match &self.jobs {
            Some(jobs) => jobs.try_send(job).map_err(|e| match e {
                mpsc::TrySendError::Full(job) | mpsc::TrySendError::Disconnected(job) => job,
            }),
            None => Err(job),
        }
    }
}

impl<J: Send + 'static> Drop for IoPool<J> {
    /// Closes the queue; each thread finishes the queued jobs (the handler should cut them short
    /// once shutdown is flagged) and is joined.
    fn drop(&mut self) {
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn run_jobs<J>(receiver: &Mutex<Receiver<J>>, handler: &dyn Fn(J)) {
    loop {
        let job = lock(receiver).recv();
        match job {
            Ok(job) => handler(job),
            Err(_) => return,
        }
    }
}

/// The I/O side of one stream: its descriptors and the blocks it still has to prefetch.
pub(crate) struct StreamIo {
    /// The descriptor for this stream's on-demand loads (blocks the prefetch has not reached).
    pub(crate) descriptor: Mutex<Option<Box<dyn SourceReader>>>,
    /// One descriptor per prefetch lane, each opened on first use and used by one job at a time.
    pub(crate) lanes: [Mutex<Option<Box<dyn SourceReader>>>; LANES],
    pending: Mutex<Pending>,
    /// First block a prefetch was refused cache space for, plus one (0: none).
    refused_at: AtomicU64,
    /// Blocks below this one the stream has left behind (and recycled): a lagging prefetch must
    /// not load them again.
    behind: AtomicU64,
}

impl Default for StreamIo {
    fn default() -> Self {
        StreamIo {
            descriptor: Mutex::new(None),
            lanes: std::array::from_fn(|_| Mutex::new(None)),
            pending: Mutex::new(Pending::default()),
            refused_at: AtomicU64::new(0),
            behind: AtomicU64::new(0),
        }
    }
}

/// Blocks `[next, end)` wait to be prefetched in chunks of `chunk_blocks`; `busy` has one bit per
/// lane with a job queued or running, `loading` one per lane whose job is loading a chunk it has
/// claimed; `last` is the source's block count (a chunk cut short by it is still whole).
#[derive(Default)]
struct Pending {
    next: u64,
    end: u64,
    last: u64,
    chunk_blocks: u64,
    busy: u32,
    loading: u32,
}

impl Pending {
    /// The blocks a lane may claim now: the rest of the chunk `next` is in, if the window covers
    /// all of it (or it ends the source). A partial chunk only goes to a lone lane, which then
    /// continues it on the same descriptor, so a small window never costs a jump per read.
    fn claimable(&self, lane: usize, chunk_blocks: u64) -> Option<Range<u64>> {
        if self.next >= self.end {
            return None;
        }
        let chunk_end = (self.next / chunk_blocks + 1).saturating_mul(chunk_blocks).min(self.last.max(self.next + 1));
        if self.end >= chunk_end {
            Some(self.next..chunk_end)
        } else if self.busy & !(1 << lane) == 0 {
            Some(self.next..self.end)
        } else {
            None
        }
    }

    /// Whole chunks wait that no queued lane is about to claim. A lane busy loading its chunk does
    /// not count: on a store with per-request latency, every chunk of the window should be on its
    /// way at once, not wait for a lane to finish the chunk before.
    fn wants_another_lane(&self, chunk_blocks: u64) -> bool {
        let waiting = self.end.saturating_sub(self.next) / chunk_blocks;
        let about_to_claim = (self.busy & !self.loading).count_ones();
        let some_partial = self.busy == 0 && self.next < self.end;
        (waiting > u64::from(about_to_claim) || some_partial) && self.busy.count_ones() < LANES as u32
    }
}

impl StreamIo {
    /// Adds `blocks` (of a source with `last` blocks) to the pending prefetch, to be loaded in
    /// chunks of `chunk_blocks` from now on, and starts jobs for idle lanes while whole chunks
    /// wait: `submit(lane)` queues a job for that lane (called under the stream's lock). Returns
    /// false if no job could be queued and none runs (the pending blocks are then dropped).
    pub(crate) fn add_pending(
        &self,
        blocks: Range<u64>,
        last: u64,
        chunk_blocks: u64,
        mut submit: impl FnMut(usize) -> bool,
    ) -> bool {
        let chunk_blocks = chunk_blocks.max(1);
        let mut pending = lock(&self.pending);
        pending.last = last;
        pending.chunk_blocks = chunk_blocks;
        if pending.next >= pending.end {
            (pending.next, pending.end) = (blocks.start, blocks.end);
        } else {
            pending.next = pending.next.min(blocks.start);
            pending.end = pending.end.max(blocks.end);
        }
        while pending.wants_another_lane(chunk_blocks) {
            let lane = (!pending.busy).trailing_zeros() as usize;
            pending.busy |= 1 << lane;
            if !submit(lane) {
                pending.busy &= !(1 << lane);
                break;
            }
        }
        if pending.busy == 0 {
            pending.next = pending.end;
            return false;
        }
        true
    }

    /// The next run of blocks for the job of `lane`, or `None` when it should end (nothing it may
    /// claim, or `stop`); ending frees the lane so a later [`StreamIo::add_pending`] can use it.
    pub(crate) fn next_chunk(&self, lane: usize, stop: bool) -> Option<Range<u64>> {
        let mut pending = lock(&self.pending);
        pending.next = pending.next.max(self.behind.load(Relaxed));
        pending.loading &= !(1 << lane);
        let claim = if stop { None } else { pending.claimable(lane, pending.chunk_blocks.max(1)) };
        match claim {
            Some(run) => {
                pending.next = run.end;
                pending.loading |= 1 << lane;
                Some(run)
            }
            None => {
                pending.busy &= !(1 << lane);
                if stop {
                    pending.next = pending.end;
                }
                None
            }
        }
    }

    /// Drops the pending blocks because `block` found no room, and remembers it for the next read.
    pub(crate) fn refuse(&self, block: u64) {
        let mut pending = lock(&self.pending);
        pending.next = pending.end;
        let mark = block.saturating_add(1);
        let _ = self.refused_at.fetch_update(Relaxed, Relaxed, |old| (old == 0 || mark < old).then_some(mark));
    }

    /// Records that the stream has left every block below `block` behind.
    pub(crate) fn left_behind(&self, block: u64) {
        self.behind.fetch_max(block, Relaxed);
    }

    /// Whether the stream has left `block` behind (prefetching it would be wasted).
    pub(crate) fn is_behind(&self, block: u64) -> bool {
        block < self.behind.load(Relaxed)
    }

    /// The first refused block since the last call, if any.
    pub(crate) fn take_refusal(&self) -> Option<u64> {
        self.refused_at.swap(0, Relaxed).checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn pool_runs_jobs_and_joins_on_drop() {
        let done = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&done);
        let pool = IoPool::start(2, 8, move |n: usize| {
            counter.fetch_add(n, Relaxed);
        });
        for n in 1..=4 {
            assert!(pool.try_submit(n).is_ok());
        }
        drop(pool);
        assert_eq!(done.load(Relaxed), 10, "every queued job ran before the threads were joined");
        let idle = IoPool::start(0, 8, |_: usize| {});
        assert_eq!(idle.try_submit(1), Err(1));
    }

    /// Adds `blocks` (of 100) in chunks of `chunk_blocks`, accepting every job; the lanes started.
    fn started_lanes(io: &StreamIo, blocks: Range<u64>, chunk_blocks: u64) -> Vec<usize> {
        let mut lanes = Vec::new();
        assert!(io.add_pending(blocks, 100, chunk_blocks, |lane| {
            lanes.push(lane);
            true
        }));
        lanes
    }

    #[test]
    fn lanes_claim_whole_chunks_in_order() {
        let io = StreamIo::default();
        // 3 whole chunks of 4 blocks and a partial one: three lanes start.
        assert_eq!(started_lanes(&io, 0..14, 4), vec![0, 1, 2]);
        assert_eq!(io.next_chunk(0, false), Some(0..4));
        assert_eq!(io.next_chunk(1, false), Some(4..8));
        assert_eq!(io.next_chunk(2, false), Some(8..12));
        // 12..14 is a partial chunk and other lanes are busy: lane 2 waits for the window.
        assert_eq!(io.next_chunk(2, false), None);
        assert_eq!(io.next_chunk(1, false), None);
        // The lone remaining lane may take the partial chunk, then continues it as it grows.
        assert_eq!(io.next_chunk(0, false), Some(12..14));
        assert!(io.add_pending(14..15, 100, 4, |_| unreachable!("lane 0 still runs")));
        assert_eq!(io.next_chunk(0, false), Some(14..15));
        assert_eq!(io.next_chunk(0, false), None);
        // The end of the source closes a chunk early, so it counts as whole.
        assert!(io.add_pending(97..100, 100, 8, |lane| lane == 0));
        assert_eq!(io.next_chunk(0, false), Some(97..100));
        assert_eq!(io.next_chunk(0, false), None);
        assert!(!io.add_pending(100..101, 101, 4, |_| false), "a full queue drops the blocks");
        assert_eq!(io.next_chunk(0, false), None);
    }

    #[test]
    fn chunks_that_wait_start_idle_lanes_while_others_are_loading() {
        let io = StreamIo::default();
        assert_eq!(started_lanes(&io, 0..16, 4), vec![0, 1, 2, 3], "one lane per whole chunk");
        for lane in 0..4 {
            assert!(io.next_chunk(lane, false).is_some());
        }
        // The window grows by two chunks while all four lanes are loading: two more lanes go,
        // rather than the chunks waiting for a lane to finish (a round trip each on a network store).
        assert_eq!(started_lanes(&io, 16..24, 4), vec![4, 5]);
        assert_eq!(io.next_chunk(4, false), Some(16..20));
        assert_eq!(io.next_chunk(5, false), Some(20..24));
    }

    #[test]
    fn refusal_drops_pending_blocks_and_is_reported_once() {
        let io = StreamIo::default();
        io.add_pending(0..4, 10, 1, |_| true);
        assert_eq!(io.next_chunk(0, false), Some(0..1));
        io.refuse(1);
        io.refuse(3);
        assert_eq!(io.next_chunk(0, false), None);
        assert_eq!(io.take_refusal(), Some(1));
        assert_eq!(io.take_refusal(), None);
        io.add_pending(0..4, 10, 1, |_| true);
        assert_eq!(io.next_chunk(0, true), None, "stop ends the job");
    }
}

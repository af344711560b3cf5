//! Background prefetch plumbing: the bounded I/O thread pool and each stream's queue of blocks.
//!
//! The engine decides *what* to prefetch ([`crate::readahead`]) and *how* to load a block; this
//! module only owns the threads, the bounded job queue, and the per-stream state that lets one job
//! at a time load a stream's blocks in order on the stream's own descriptor.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::cache::lock;
use crate::source::SourceStream;

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
                spawned
                    .map_err(|e| log::warn!("cannot start I/O thread: {e}"))
                    .ok()
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

/// The I/O side of one stream: its descriptor and the blocks it still has to prefetch.
#[derive(Default)]
pub(crate) struct StreamIo {
    /// The stream's own descriptor, opened on first use.
    pub(crate) descriptor: Mutex<Option<Box<dyn SourceStream>>>,
    pending: Mutex<Pending>,
    /// First block a prefetch was refused cache space for, plus one (0: none).
    refused_at: AtomicU64,
}

/// Blocks `[next, end)` wait to be prefetched; `queued` says a job is queued or running for them.
#[derive(Default)]
struct Pending {
    next: u64,
    end: u64,
    queued: bool,
}

impl StreamIo {
    /// Adds `blocks` to the pending prefetch. If no job is queued or running for this stream,
    /// calls `submit` (under the stream's lock, so exactly one job exists); if that fails, the
    /// pending blocks are dropped and false is returned.
    pub(crate) fn add_pending(&self, blocks: Range<u64>, submit: impl FnOnce() -> bool) -> bool {
        let mut pending = lock(&self.pending);
        if pending.next >= pending.end {
            (pending.next, pending.end) = (blocks.start, blocks.end);
        } else {
            pending.next = pending.next.min(blocks.start);
            pending.end = pending.end.max(blocks.end);
        }
        if pending.queued {
            return true;
        }
        pending.queued = submit();
        if !pending.queued {
            pending.next = pending.end;
        }
        pending.queued
    }

    /// The next block for this stream's job, or `None` when it should end (nothing pending, or
    /// `stop`); ending clears the job's claim so the next [`StreamIo::add_pending`] submits anew.
    pub(crate) fn next_block(&self, stop: bool) -> Option<u64> {
        let mut pending = lock(&self.pending);
        if pending.next >= pending.end || stop {
            pending.next = pending.end;
            pending.queued = false;
            return None;
        }
        pending.next += 1;
        Some(pending.next - 1)
    }

    /// Drops the pending blocks because `block` found no room, and remembers it for the next read.
    pub(crate) fn refuse(&self, block: u64) {
        let mut pending = lock(&self.pending);
        pending.next = pending.end;
        let mark = block.saturating_add(1);
        let _ = self.refused_at.fetch_update(Relaxed, Relaxed, |old| {
            (old == 0 || mark < old).then_some(mark)
        });
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
        assert_eq!(
            done.load(Relaxed),
            10,
            "every queued job ran before the threads were joined"
        );
        let idle = IoPool::start(0, 8, |_: usize| {});
        assert_eq!(idle.try_submit(1), Err(1));
    }

    #[test]
    fn one_job_per_stream_walks_its_blocks_in_order() {
        let io = StreamIo::default();
        let mut submitted = 0;
        assert!(io.add_pending(3..5, || {
            submitted += 1;
            true
        }));
        assert!(io.add_pending(5..7, || unreachable!("a job is already queued")));
        let walked: Vec<u64> = std::iter::from_fn(|| io.next_block(false)).collect();
        assert_eq!((walked, submitted), (vec![3, 4, 5, 6], 1));
        assert!(
            !io.add_pending(7..8, || false),
            "a full queue drops the blocks"
        );
        assert_eq!(io.next_block(false), None);
    }

    #[test]
    fn refusal_drops_pending_blocks_and_is_reported_once() {
        let io = StreamIo::default();
        io.add_pending(0..4, || true);
        assert_eq!(io.next_block(false), Some(0));
        io.refuse(1);
        io.refuse(3);
        assert_eq!(io.next_block(false), None);
        assert_eq!(io.take_refusal(), Some(1));
        assert_eq!(io.take_refusal(), None);
        io.add_pending(0..4, || true);
        assert_eq!(io.next_block(true), None, "stop ends the job");
    }
}

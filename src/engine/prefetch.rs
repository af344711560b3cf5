//! The prefetch lanes: jobs on the I/O pool, each running one lane of one stream.
//!
//! A stream's reads queue its pending blocks (`stream`); each lane with a job claims chunks of them
//! in order and loads every run of missing blocks in one backing read on the lane's own
//! descriptor, publishing each block as soon as it lands, so a reader waiting at the front of a
//! chunk does not wait for all of it. A block the cache has no room for ends the lane's work (the
//! stream halves its window at its next read); so does the engine stopping. A lane never loads a
//! block its stream has left behind.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::backing;
use super::cache::{LoadTicket, Prefetch};
use super::pool::IoPool;
use super::shared::{Shared, SourceEntry};
use super::stream::{Descriptor, StreamIo};
use super::tuning::JOB_QUEUE_LEN;
use crate::source::Mapping;
use crate::stats::Stats;
use crate::util::lock;

/// One lane of one stream's prefetch, queued for an I/O thread.
struct Job {
    source: Arc<SourceEntry>,
    stream: Arc<StreamIo>,
    lane: usize,
}

/// The I/O threads running the prefetch lanes, fed by a bounded queue of [`JOB_QUEUE_LEN`] jobs.
pub(crate) struct Prefetcher {
    pool: IoPool<Job>,
}

impl Prefetcher {
    /// Starts `threads` I/O threads (none: nothing is ever prefetched).
    pub(crate) fn start(shared: &Arc<Shared>, threads: usize) -> Prefetcher {
        let shared = Arc::clone(shared);
        Prefetcher { pool: IoPool::start(threads, JOB_QUEUE_LEN, move |job: Job| run_lane(&shared, &job)) }
    }

    /// Queues a job for lane `lane` of `stream` of `source`; false if the queue is full (or there
    /// are no threads).
    pub(crate) fn submit(&self, source: &Arc<SourceEntry>, stream: &Arc<StreamIo>, lane: usize) -> bool {
        let job = Job { source: Arc::clone(source), stream: Arc::clone(stream), lane };
        self.pool.try_submit(job).is_ok()
    }
}

/// Runs one lane of a stream's prefetch: claims chunks of the pending blocks in order and loads
/// each run of missing blocks in one read on the lane's own descriptor (or, for a source served
/// from its mapping, reads the chunk into the page cache through the mapping).
fn run_lane(shared: &Shared, job: &Job) {
    load_lane(shared, job);
    // The lane's descriptor (or the mapping) is left where closing the source finds it: counted
    // as held, in case the source was closed as idle while this job waited in the queue.
    shared.descriptors.holding(&job.source.activity);
}

/// [`run_lane`]'s work.
fn load_lane(shared: &Shared, job: &Job) {
    let bs = shared.config.block_size;
    let Some(lane) = job.stream.lanes.get(job.lane) else {
        return;
    };
    if let Some(mapping) = job.source.mapping() {
        return mapped_lane(shared, job, &mapping);
    }
    while let Some(chunk) = job.stream.next_chunk(job.lane, shared.stopping.load(Relaxed)) {
        let mut run: Vec<LoadTicket<'_>> = Vec::new();
        let mut run_start = chunk.start;
        let mut refused = None;
        for block in chunk {
            if job.stream.is_behind(block) {
                load_run(shared, job, lane, run_start, std::mem::take(&mut run));
                continue;
            }
            match shared.cache.prefetch((job.source.id, block), job.source.block_len(block, bs)) {
                Prefetch::Load(ticket) => {
                    if run.is_empty() {
                        run_start = block;
                    }
                    run.push(ticket);
                    continue;
                }
                Prefetch::Present => {}
                Prefetch::Refused => refused = Some(block),
            }
            load_run(shared, job, lane, run_start, std::mem::take(&mut run));
            if let Some(block) = refused {
                job.stream.refuse(block);
                break;
            }
        }
        load_run(shared, job, lane, run_start, run);
    }
}

/// A mapped source's lane: each chunk it claims (whole aligned blocks, 1 to 8 MiB) is read into the
/// page cache through the mapping ([`Mapping::read_ahead`]), so the storage below sees large
/// requests ahead of the reader, in parallel across lanes, while the reader's replies are copied
/// by the kernel straight from the page cache, and the file is left in large folios for every
/// later reader of it. Nothing is cached in the engine, so nothing is refused; blocks the stream
/// has passed are skipped.
fn mapped_lane(shared: &Shared, job: &Job, mapping: &Mapping) {
    let bs = shared.config.block_size;
    while let Some(chunk) = job.stream.next_chunk(job.lane, shared.stopping.load(Relaxed)) {
        let first = chunk.start.max(job.stream.behind());
        if first >= chunk.end {
            continue;
        }
        let start = first.saturating_mul(bs);
        let end = chunk.end.saturating_mul(bs).min(job.source.len);
        if start >= end {
            continue;
        }
        mapping.read_ahead(start..end);
        let stats = &shared.stats;
        Stats::add(&stats.backing_reads, 1);
        Stats::add(&stats.backing_read_bytes, end - start);
        Stats::add(&stats.prefetched_bytes, end - start);
    }
}

/// Loads a run of reserved neighbouring blocks starting at `first` in one backing read on the
/// lane's descriptor, publishing each block as soon as it lands.
fn load_run(shared: &Shared, job: &Job, lane: &Descriptor, first: u64, mut run: Vec<LoadTicket<'_>>) {
    if run.is_empty() {
        return;
    }
    let mut descriptor = lock(lane);
    if descriptor.is_none() {
        *descriptor = job.source.spares.take();
    }
    let buffers = backing::buffers(shared, &job.source, first, run.iter_mut());
    let mut tickets = run.into_iter();
    let result = backing::read_blocks(shared, &job.source, first, buffers, &mut descriptor, true, &mut |data| {
        if let Some(ticket) = tickets.next() {
            Stats::add(&shared.stats.prefetched_bytes, data.len() as u64);
            ticket.complete(data);
        }
    });
    drop(descriptor);
    if let Err(e) = result {
        tickets.for_each(|ticket| ticket.fail(&e));
    }
}

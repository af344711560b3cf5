//! The prefetch lanes: jobs on the I/O pool, each running one lane of one stream; and the
//! read-ahead of a mapped source, one job per chunk its stream asks for.
//!
//! A stream's reads queue its pending blocks (`stream`); each lane with a job claims chunks of them
//! in order and loads every run of missing blocks in one backing read on the lane's own
//! descriptor, publishing each block as soon as it lands, so a reader waiting at the front of a
//! chunk does not wait for all of it. A block the cache has no room for ends the lane's work (the
//! stream halves its window at its next read); so does the engine stopping. A lane never loads a
//! block its stream has left behind, nor, for a stream reading the re-served checkpoint file, one
//! the kernel was given whole through that file (`delivered`). A third kind of job fetches one
//! run of blocks a loader's faults will ask for next (`faults`), on a spare descriptor.

use std::ops::Range;
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

/// Work queued for an I/O thread: one lane of one stream's prefetch, one chunk of a mapped
/// source's read-ahead, or one run of blocks a loader's faults will ask for.
enum Job {
    Lane { source: Arc<SourceEntry>, stream: Arc<StreamIo>, lane: usize },
    ReadAhead { source: Arc<SourceEntry>, stream: Arc<StreamIo>, blocks: Range<u64> },
    Fetch { source: Arc<SourceEntry>, blocks: Range<u64> },
}

/// The I/O threads running the prefetch lanes, fed by a bounded queue of [`JOB_QUEUE_LEN`] jobs.
pub(crate) struct Prefetcher {
    pool: IoPool<Job>,
}

impl Prefetcher {
    /// Starts `threads` I/O threads (none: nothing is ever prefetched).
    pub(crate) fn start(shared: &Arc<Shared>, threads: usize) -> Prefetcher {
        let shared = Arc::clone(shared);
        Prefetcher {
            pool: IoPool::start(threads, JOB_QUEUE_LEN, move |job: Job| match job {
                Job::Lane { source, stream, lane } => run_lane(&shared, &LaneJob { source, stream, lane }),
                Job::ReadAhead { source, stream, blocks } => read_ahead(&shared, &source, &stream, blocks),
                Job::Fetch { source, blocks } => fetch(&shared, &source, blocks),
            }),
        }
    }

    /// Queues a job for lane `lane` of `stream` of `source`; false if the queue is full (or there
    /// are no threads).
    pub(crate) fn submit(&self, source: &Arc<SourceEntry>, stream: &Arc<StreamIo>, lane: usize) -> bool {
        let job = Job::Lane { source: Arc::clone(source), stream: Arc::clone(stream), lane };
        self.pool.try_submit(job).is_ok()
    }

    /// Queues the read-ahead of `blocks` of `source`, a source served from its mapping, for
    /// `stream`; false if the queue is full (or there are no threads).
    pub(crate) fn submit_read_ahead(
        &self,
        source: &Arc<SourceEntry>,
        stream: &Arc<StreamIo>,
        blocks: Range<u64>,
    ) -> bool {
        let job = Job::ReadAhead { source: Arc::clone(source), stream: Arc::clone(stream), blocks };
        self.pool.try_submit(job).is_ok()
    }

    /// Queues the fetch of `blocks` of `source` (a loader's next faults, `faults`); false if the
    /// queue is full (or there are no threads).
    pub(crate) fn submit_fetch(&self, source: &Arc<SourceEntry>, blocks: Range<u64>) -> bool {
        self.pool.try_submit(Job::Fetch { source: Arc::clone(source), blocks }).is_ok()
    }
}

/// One lane of one stream's prefetch, running.
struct LaneJob {
    source: Arc<SourceEntry>,
    stream: Arc<StreamIo>,
    lane: usize,
}

/// Runs one lane of a stream's prefetch: claims chunks of the pending blocks in order and loads
/// each run of missing blocks in one read on the lane's own descriptor.
fn run_lane(shared: &Shared, job: &LaneJob) {
    load_lane(shared, job);
    // The lane's descriptor is left where closing the source finds it: counted as held, in case
    // the source was closed as idle while this job waited in the queue.
    shared.descriptors.holding(&job.source.activity);
}

/// A mapped source's read-ahead of `blocks` (one chunk its stream asked for, `core`), for a read
/// the kernel copies or one in user space alike: read into the page cache through the mapping,
/// unless the stream has passed them meanwhile.
fn read_ahead(shared: &Shared, source: &SourceEntry, stream: &StreamIo, blocks: Range<u64>) {
    let first = blocks.start.max(stream.behind());
    if first < blocks.end && !shared.stopping.load(Relaxed) {
        if let Some(mapping) = source.mapping() {
            read_into_page_cache(shared, source, &mapping, first..blocks.end, true);
        }
    }
    shared.descriptors.holding(&source.activity);
}

/// Reads `blocks` of a mapped source into the page cache and returns once they are there
/// ([`Mapping::read_ahead`]), or, unless `wait`, only asks the kernel to start reading them
/// ([`Mapping::advise`]); counted as one backing read either way.
pub(crate) fn read_into_page_cache(
    shared: &Shared,
    source: &SourceEntry,
    mapping: &Mapping,
    blocks: Range<u64>,
    wait: bool,
) {
    let bs = shared.config.block_size;
    let start = blocks.start.saturating_mul(bs).min(source.len);
    let end = blocks.end.saturating_mul(bs).min(source.len);
    if start >= end {
        return;
    }
    if wait {
        mapping.read_ahead(start..end);
    } else {
        mapping.advise(start..end);
    }
    let stats = &shared.stats;
    Stats::add(&stats.backing_reads, 1);
    Stats::add(&stats.backing_read_bytes, end - start);
    Stats::add(&stats.prefetched_bytes, end - start);
}

/// [`run_lane`]'s work.
fn load_lane(shared: &Shared, job: &LaneJob) {
    let bs = shared.config.block_size;
    let Some(lane) = job.stream.lanes.get(job.lane) else {
        return;
    };
    while let Some(chunk) = job.stream.next_chunk(job.lane, shared.stopping.load(Relaxed)) {
        let mut run: Vec<LoadTicket<'_>> = Vec::new();
        let mut run_start = chunk.start;
        let mut refused = None;
        let reading_checkpoint_file = job.stream.reading_checkpoint_file.load(Relaxed);
        for block in chunk {
            let start = block.saturating_mul(bs);
            let held = || job.source.delivered.covers(start..start + job.source.block_len(block, bs));
            if job.stream.is_behind(block) || (reading_checkpoint_file && held()) {
                load_run(shared, &job.source, lane, run_start, std::mem::take(&mut run));
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
            load_run(shared, &job.source, lane, run_start, std::mem::take(&mut run));
            if let Some(block) = refused {
                job.stream.refuse(block);
                break;
            }
        }
        load_run(shared, &job.source, lane, run_start, run);
    }
}

/// Fetches the blocks of `blocks` of `source` that are neither cached nor held by the kernel
/// (`delivered`), each run in one backing read on a spare descriptor: the read-around of a
/// loader's next faults (`faults`). Stops at a block the cache has no room for.
fn fetch(shared: &Shared, source: &SourceEntry, blocks: Range<u64>) {
    let bs = shared.config.block_size;
    let descriptor: Descriptor = std::sync::Mutex::new(source.spares.take());
    let mut run: Vec<LoadTicket<'_>> = Vec::new();
    let mut run_start = blocks.start;
    for block in blocks {
        if shared.stopping.load(Relaxed) {
            break;
        }
        let start = block.saturating_mul(bs);
        let len = source.block_len(block, bs);
        let prefetch = if source.delivered.covers(start..start + len) {
            Prefetch::Present
        } else {
            shared.cache.prefetch((source.id, block), len)
        };
        match prefetch {
            Prefetch::Load(ticket) => {
                if run.is_empty() {
                    run_start = block;
                }
                run.push(ticket);
                continue;
            }
            Prefetch::Present => load_run(shared, source, &descriptor, run_start, std::mem::take(&mut run)),
            Prefetch::Refused => break,
        }
    }
    load_run(shared, source, &descriptor, run_start, run);
    source.spares.keep(descriptor.into_inner().unwrap_or_else(|e| e.into_inner()));
    shared.descriptors.holding(&source.activity);
}

/// Loads a run of reserved neighbouring blocks of `source` starting at `first` in one backing read
/// on `lane` (a lane's descriptor, or a spare), publishing each block as soon as it lands.
fn load_run(shared: &Shared, source: &SourceEntry, lane: &Descriptor, first: u64, mut run: Vec<LoadTicket<'_>>) {
    if run.is_empty() {
        return;
    }
    let mut descriptor = lock(lane);
    if descriptor.is_none() {
        *descriptor = source.spares.take();
    }
    let buffers = backing::buffers(shared, source, first, run.iter_mut());
    let mut tickets = run.into_iter();
    let result = backing::read_blocks(shared, source, first, buffers, &mut descriptor, true, &mut |data| {
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

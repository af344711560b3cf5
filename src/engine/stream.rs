//! One stream's state in one place, and the table of a source's streams.
//!
//! A *stream* is a reader the engine has seen going through a source in order. Its [`Stream`]
//! holds all it has: its readahead state ([`Readahead`]: cursor, window, what it has asked for),
//! and its I/O ([`StreamIo`]): the descriptor for its on-demand loads, one descriptor per prefetch
//! lane, the blocks waiting to be prefetched in chunks, the first block the cache refused it, and
//! how far it has left blocks behind. The readahead state changes only under the source's stream
//! lock, on a read; the I/O half is shared (an `Arc`) with the prefetch jobs running its lanes.
//!
//! [`Streams`] is a source's table of at most [`ReadaheadConfig::max_streams`] streams; a new
//! stream replaces the least recently used one. [`Streams::on_read`] is everything one read does
//! to its stream: find it (or start one, closing the replaced stream's descriptors into the
//! source's spares), learn of a refusal the lanes met, queue the new prefetch, and hand the blocks
//! the stream has passed to drop-behind.
//!
//! A stream's pending blocks are claimed in chunks ([`readahead::chunk_blocks`]) by up to
//! [`LANES`] jobs, each on its own descriptor, so every descriptor only moves forward in big steps.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::cache::BlockCache;
use super::readahead::{self, Decision, Extent, Readahead, ReadaheadConfig};
use super::spares::Spares;
use super::tuning::{MAX_LANES, PREFETCH_CHUNK_BYTES};
use crate::source::{SourceId, SourceReader};
use crate::stats::Stats;
use crate::util::lock;

/// A descriptor slot: opened on first use, used by one thread at a time.
pub(crate) type Descriptor = Mutex<Option<Box<dyn SourceReader>>>;

/// The streams of one source; see the module doc.
pub(crate) struct Streams {
    config: ReadaheadConfig,
    /// The source, to name its blocks in the cache.
    source: SourceId,
    /// The source's length in bytes.
    len: u64,
    table: Mutex<Table>,
}

struct Table {
    streams: Vec<Stream>,
    /// Counts reads, to find the least recently used stream.
    clock: u64,
}

/// One sequential reader of a source; see the module doc.
struct Stream {
    readahead: Readahead,
    /// The table's clock at this stream's last read.
    last_used: u64,
    io: Arc<StreamIo>,
}

impl Streams {
    /// An empty table for source `source` of `len` bytes (a block size of 0 is taken as 1, and at
    /// least one stream is tracked).
    pub(crate) fn new(mut config: ReadaheadConfig, source: SourceId, len: u64) -> Streams {
        config.block_size = config.block_size.max(1);
        config.max_streams = config.max_streams.max(1);
        Streams { config, source, len, table: Mutex::new(Table { streams: Vec::new(), clock: 0 }) }
    }

    /// Everything the read of `range` (not empty, inside the source) of a file spanning `extent`
    /// does to its stream (see the module doc). `submit(io, lane)` queues a prefetch job for that
    /// lane of the stream and says whether it could. Returns the stream's I/O if the stream is
    /// sequential: its loads then use its own descriptor.
    pub(crate) fn on_read(
        &self,
        range: Range<u64>,
        extent: Extent,
        cache: &BlockCache,
        spares: &Spares,
        stats: &Stats,
        mut submit: impl FnMut(&Arc<StreamIo>, usize) -> bool,
    ) -> Option<Arc<StreamIo>> {
        let bs = self.config.block_size;
        let last = self.len.div_ceil(bs);
        let in_checkpoint_file = extent.in_checkpoint_file;
        let (io, sequential) = self.with_stream(range, extent, spares, stats, |stream, decision| {
            stream.io.reading_checkpoint_file.store(in_checkpoint_file, Relaxed);
            if !decision.prefetch.is_empty() {
                let lanes = self.config.lanes.clamp(1, MAX_LANES);
                let chunk_blocks = readahead::chunk_blocks(decision.window_blocks, bs, lanes);
                let io = &stream.io;
                if !io.add_pending(decision.prefetch.clone(), last, chunk_blocks, lanes, |lane| submit(io, lane)) {
                    stream.readahead.refused(decision.prefetch.start);
                }
            }
            for block in decision.consumed.clone() {
                cache.recycle((self.source, block));
            }
        });
        sequential.then_some(io)
    }

    /// [`Streams::on_read`] for a source served from its mapping, whose prefetch only reads the
    /// file into the page cache: the blocks the read's stream should now ask the kernel to read ahead, in
    /// whole aligned chunks of [`PREFETCH_CHUNK_BYTES`] (a shorter run only where the source ends
    /// or the reader would otherwise catch up with what was asked for). The caller hands each chunk
    /// to an I/O thread, which reads it into the page cache: in whole chunks, so a reader whose
    /// requests are small (128 KiB without a raised kernel readahead) does not cost a thread
    /// hand-off and a read per request, as lanes claiming what each read adds would.
    pub(crate) fn on_mapped_read(
        &self,
        range: Range<u64>,
        extent: Extent,
        spares: &Spares,
        stats: &Stats,
    ) -> Option<(Arc<StreamIo>, Range<u64>)> {
        let bs = self.config.block_size;
        let last = self.len.div_ceil(bs);
        let chunk_blocks = (PREFETCH_CHUNK_BYTES / bs).max(1);
        let reader_end = range.end.div_ceil(bs);
        let mut advice = None;
        let (io, _) = self.with_stream(range, extent, spares, stats, |stream, decision| {
            advice = stream.io.take_advice(decision.prefetch.clone(), last, chunk_blocks, reader_end);
        });
        advice.map(|blocks| (io, blocks))
    }

    /// Whether a read at `offset` is within the back slack of a stream's cursor, either side: it
    /// continues that stream's reader (or comes a little early or late for it).
    pub(crate) fn reader_near(&self, offset: u64) -> bool {
        let slack = self.config.back_slack;
        lock(&self.table).streams.iter().any(|s| s.readahead.cursor().abs_diff(offset) <= slack)
    }

    /// Closes the descriptors of every stream (they reopen at the stream's next load); those a
    /// load is using right now stay open. False if any did.
    pub(crate) fn close_descriptors(&self) -> bool {
        let table = lock(&self.table);
        let mut all = true;
        for stream in &table.streams {
            for descriptor in std::iter::once(&stream.io.descriptor).chain(&stream.io.lanes) {
                match descriptor.try_lock() {
                    Ok(mut descriptor) => drop(descriptor.take()),
                    Err(_) => all = false,
                }
            }
        }
        all
    }

    /// Finds (or starts) the stream of the read of `range` in `extent`, runs `prefetch` on it with
    /// the readahead's decision under the table's lock, records what the stream has left behind
    /// and the table's totals. Returns the stream's I/O and whether it is sequential.
    fn with_stream(
        &self,
        range: Range<u64>,
        extent: Extent,
        spares: &Spares,
        stats: &Stats,
        prefetch: impl FnOnce(&mut Stream, &Decision),
    ) -> (Arc<StreamIo>, bool) {
        let bs = self.config.block_size;
        let mut table = lock(&self.table);
        let before = table.totals(bs);
        let (index, decision, replaced) =
            table.classify(&self.config, range.start, range.end - range.start, self.len, extent);
        if let Some(replaced) = replaced {
            replaced.io.close(spares);
        }
        let stream = &mut table.streams[index];
        if let Some(refused) = stream.io.take_refusal() {
            stream.readahead.refused(refused);
        }
        prefetch(stream, &decision);
        if !decision.consumed.is_empty() {
            stream.io.left_behind(decision.consumed.end);
        }
        let io = Arc::clone(&stream.io);
        let after = table.totals(bs);
        drop(table);
        stats.streams.fetch_add(after.0.wrapping_sub(before.0), Relaxed);
        stats.window_bytes.fetch_add(after.1.wrapping_sub(before.1), Relaxed);
        (io, decision.sequential)
    }
}

impl Table {
    /// Gives the read of `[offset, offset + len)` to the closest stream that accepts it, a
    /// confirmed one before any new one, or starts a new one (replacing the least recently used if
    /// the table is full): the stream's index, what to do, and the replaced stream.
    ///
    /// Confirmed first: a reader that seeks to a file's end and back before reading it (C stdio's
    /// `fseek(SEEK_END)` reads the buffer-aligned tail, as numpy's `fromfile` does) leaves a new
    /// stream whose cursor is exactly where the sequential reader arrives later; handing the
    /// sequential reader to it would restart its window and lanes at every file.
    fn classify(
        &mut self,
        config: &ReadaheadConfig,
        offset: u64,
        len: u64,
        source_len: u64,
        extent: Extent,
    ) -> (usize, Decision, Option<Stream>) {
        self.clock += 1;
        let closest = self
            .streams
            .iter()
            .enumerate()
            .filter_map(|(index, s)| {
                let distance = s.readahead.distance(config, offset)?;
                Some((index, (!s.readahead.confirmed(), distance)))
            })
            .min_by_key(|&(_, rank)| rank)
            .map(|(index, _)| index);
        if let Some(index) = closest {
            let stream = &mut self.streams[index];
            stream.last_used = self.clock;
            return (index, stream.readahead.advance(config, offset, len, source_len, extent), None);
        }
        let (readahead, decision) = Readahead::start(config, offset, len, source_len, extent);
        let stream = Stream { readahead, last_used: self.clock, io: Arc::default() };
        if self.streams.len() < config.max_streams {
            self.streams.push(stream);
            return (self.streams.len() - 1, decision, None);
        }
        let oldest = (0..self.streams.len()).min_by_key(|&i| self.streams[i].last_used).unwrap_or(0);
        let replaced = std::mem::replace(&mut self.streams[oldest], stream);
        (oldest, decision, Some(replaced))
    }

    /// Streams tracked, and the sum of their windows in bytes.
    fn totals(&self, block_size: u64) -> (u64, u64) {
        let blocks: u64 = self.streams.iter().map(|s| s.readahead.window_blocks()).sum();
        (self.streams.len() as u64, blocks.saturating_mul(block_size))
    }
}

/// The I/O half of a stream, shared with the prefetch jobs of its lanes: its descriptors and the
/// blocks it still has to prefetch.
pub(crate) struct StreamIo {
    /// The descriptor for this stream's on-demand loads (blocks the prefetch has not reached).
    pub(crate) descriptor: Descriptor,
    /// One descriptor per prefetch lane, each used by one job at a time (the stream uses the
    /// first `lanes` of its [`ReadaheadConfig`]).
    pub(crate) lanes: [Descriptor; MAX_LANES],
    pending: Mutex<Pending>,
    /// First block a prefetch was refused cache space for, plus one (0: none).
    refused_at: AtomicU64,
    /// Blocks below this one the stream has left behind (and recycled): a lagging prefetch must
    /// not load them again.
    behind: AtomicU64,
    /// The stream's last read was of the re-served checkpoint file: its prefetch skips the blocks
    /// the kernel was given whole through that file (`delivered`).
    pub(crate) reading_checkpoint_file: AtomicBool,
}

impl Default for StreamIo {
    fn default() -> Self {
        StreamIo {
            descriptor: Mutex::new(None),
            lanes: std::array::from_fn(|_| Mutex::new(None)),
            pending: Mutex::new(Pending::default()),
            refused_at: AtomicU64::new(0),
            behind: AtomicU64::new(0),
            reading_checkpoint_file: AtomicBool::new(false),
        }
    }
}

/// Blocks `[next, end)` wait to be prefetched in chunks of `chunk_blocks` by up to `lanes` lanes;
/// `busy` has one bit per lane with a job queued or running, `loading` one per lane whose job is
/// loading a chunk it has claimed; `last` is the source's block count (a chunk cut short by it is
/// still whole).
#[derive(Default)]
struct Pending {
    next: u64,
    end: u64,
    last: u64,
    chunk_blocks: u64,
    lanes: u32,
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
        (waiting > u64::from(about_to_claim) || some_partial) && self.busy.count_ones() < self.lanes
    }
}

impl StreamIo {
    /// Adds `blocks` (of a source with `last` blocks) to the pending prefetch, to be loaded in
    /// chunks of `chunk_blocks` by up to `lanes` lanes from now on, and starts jobs for idle lanes
    /// while whole chunks wait: `submit(lane)` queues a job for that lane (called under the
    /// stream's lock). Returns false if no job could be queued and none runs (the pending blocks
    /// are then dropped).
    fn add_pending(
        &self,
        blocks: Range<u64>,
        last: u64,
        chunk_blocks: u64,
        lanes: usize,
        mut submit: impl FnMut(usize) -> bool,
    ) -> bool {
        let chunk_blocks = chunk_blocks.max(1);
        let mut pending = lock(&self.pending);
        pending.last = last;
        pending.chunk_blocks = chunk_blocks;
        pending.lanes = lanes.clamp(1, MAX_LANES) as u32;
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

    /// Adds `blocks` (of a source with `last` blocks) to the pending read-ahead of a mapped stream
    /// and takes what is due now: every whole chunk of `chunk_blocks` that waits, or all that waits if
    /// it reaches the source's end or the reader (now ending at block `reader_end`) would otherwise
    /// read blocks not yet asked for. Blocks the stream has left behind are skipped.
    fn take_advice(&self, blocks: Range<u64>, last: u64, chunk_blocks: u64, reader_end: u64) -> Option<Range<u64>> {
        let mut pending = lock(&self.pending);
        pending.last = last;
        if !blocks.is_empty() {
            if pending.next >= pending.end {
                (pending.next, pending.end) = (blocks.start, blocks.end);
            } else {
                pending.next = pending.next.min(blocks.start);
                pending.end = pending.end.max(blocks.end);
            }
        }
        pending.next = pending.next.max(self.behind.load(Relaxed));
        if pending.next >= pending.end {
            return None;
        }
        let whole_chunks_end = pending.end / chunk_blocks * chunk_blocks;
        let due = if pending.end >= last || pending.next <= reader_end {
            pending.end
        } else if whole_chunks_end > pending.next {
            whole_chunks_end
        } else {
            return None;
        };
        let advice = pending.next..due;
        pending.next = due;
        Some(advice)
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
    fn left_behind(&self, block: u64) {
        self.behind.fetch_max(block, Relaxed);
    }

    /// The first block the stream has not left behind.
    pub(crate) fn behind(&self) -> u64 {
        self.behind.load(Relaxed)
    }

    /// Whether the stream has left `block` behind (prefetching it would be wasted).
    pub(crate) fn is_behind(&self, block: u64) -> bool {
        block < self.behind.load(Relaxed)
    }

    /// Closes the descriptors of a stream that was replaced into the source's `spares`; one a
    /// prefetch job still uses closes when that job ends instead.
    fn close(&self, spares: &Spares) {
        for descriptor in std::iter::once(&self.descriptor).chain(&self.lanes) {
            if let Ok(mut descriptor) = descriptor.try_lock() {
                spares.keep(descriptor.take());
            }
        }
    }

    /// The first refused block since the last call, if any.
    fn take_refusal(&self) -> Option<u64> {
        self.refused_at.swap(0, Relaxed).checked_sub(1)
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;

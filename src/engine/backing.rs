//! The backing read: one read of whole blocks from a source through a descriptor, counted and
//! logged. Every load, on demand or prefetched, goes through [`read_blocks`], which asks the disk
//! tier first when the mount has one (`disk`): blocks it holds cost no store request.

use std::io;

use super::cache::LoadTicket;
use super::shared::{Shared, SourceEntry};
use crate::source::SourceReader;
use crate::stats::Stats;

/// The tickets' buffers for blocks `first..` of `entry`, each sized to its block.
pub(crate) fn buffers<'a, 't: 'a>(
    shared: &Shared,
    entry: &SourceEntry,
    first: u64,
    tickets: impl Iterator<Item = &'a mut LoadTicket<'t>>,
) -> Vec<Vec<u8>> {
    let bs = shared.config.block_size;
    // A block is at most MAX_BLOCK_SIZE (1 GiB), so its length fits a usize.
    (first..).zip(tickets).map(|(block, t)| t.take_buffer(entry.block_len(block, bs) as usize)).collect()
}

/// One backing read of blocks `first..first + buffers.len()` of `entry` into `buffers` through
/// `descriptor` (opened first if it is `None`), handing each to `landed`, in block order, as soon
/// as the source has filled it ([`SourceReader::read_blocks_at`]); on an error the rest are
/// dropped, and so is the descriptor (it may be broken, e.g. a dropped connection). With a disk
/// tier, blocks found there land from it and only each run of the others is read from the store
/// (and queued for the disk as it lands). A prefetch lane (`lane`) waits for room in the disk
/// tier's write queue when it is full; a read on demand never does (its write is dropped).
pub(crate) fn read_blocks(
    shared: &Shared,
    entry: &SourceEntry,
    first: u64,
    buffers: Vec<Vec<u8>>,
    descriptor: &mut Option<Box<dyn SourceReader>>,
    lane: bool,
    landed: &mut dyn FnMut(Vec<u8>),
) -> io::Result<()> {
    if let (Some(disk), Some(key)) = (&shared.disk, &entry.disk_key) {
        let mut store = |first, buffers, landed: &mut dyn FnMut(Vec<u8>)| {
            read_store(shared, entry, first, buffers, descriptor, landed)
        };
        return disk.read_through(key, first, buffers, &mut store, lane, landed);
    }
    read_store(shared, entry, first, buffers, descriptor, landed)
}

/// [`read_blocks`] from the store itself: one read through `descriptor`.
fn read_store(
    shared: &Shared,
    entry: &SourceEntry,
    first: u64,
    buffers: Vec<Vec<u8>>,
    descriptor: &mut Option<Box<dyn SourceReader>>,
    landed: &mut dyn FnMut(Vec<u8>),
) -> io::Result<()> {
    let stats = &shared.stats;
    let bs = shared.config.block_size;
    let count = buffers.len();
    let mut bytes = 0u64;
    let started = std::time::Instant::now();
    let result = (|| {
        if descriptor.is_none() {
            *descriptor = Some(entry.source.open_reader()?);
        }
        if let Some(fd) = descriptor.as_mut() {
            fd.read_blocks_at(buffers, first * bs, &mut |buffer| {
                bytes += buffer.len() as u64;
                landed(buffer);
            })?;
        }
        Ok(())
    })();
    let took = started.elapsed();
    Stats::add(&stats.backing_reads, 1);
    Stats::add(&stats.backing_read_bytes, bytes);
    // To the last block landed, failed reads included (a timeout is the slowest request of all).
    stats.record_backing_latency(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    // One line per request to the store, for timelines (`-d`, or `RUST_LOG=stfs=debug` with
    // `--log-file`; millisecond timestamps).
    log::debug!(
        "{}: backing read of blocks {first}..{} ({bytes} bytes) in {:.1} ms",
        entry.source.name(),
        first + count as u64,
        took.as_secs_f64() * 1e3
    );
    match &result {
        Ok(()) => {}
        Err(e) => {
            Stats::add(&stats.backing_errors, 1);
            log::warn!(
                "{}: backing read of block {first} (+{}) failed: {e}",
                entry.source.name(),
                count.saturating_sub(1)
            );
            // A descriptor that failed may be broken (e.g. a dropped connection): reopen next time.
            *descriptor = None;
        }
    }
    result
}

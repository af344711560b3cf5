//! Loading blocks: on-demand loads for a request (single block, or a run of cold blocks in one
//! backing read), the backing read itself, and the prefetch lanes' loop. Split from the engine's
//! module so each file reads in one sitting; the types are the engine's own.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use super::tuning::LOAD_WAIT_TIMEOUT;
use super::{Engine, Job, ReadError, Shared, SourceEntry};
use crate::engine::cache::{BlockData, LoadTicket, Lookup, Prefetch};
use crate::engine::stream::StreamIo;
use crate::source::SourceReader;
use crate::stats::Stats;
use crate::util::lock;

impl Engine {
    /// Returns block `block` of `entry`: from the cache, by waiting for its load, or by loading it.
    pub(super) fn demand_block(
        &self,
        entry: &SourceEntry,
        block: u64,
        stream: Option<&StreamIo>,
    ) -> Result<BlockData, ReadError> {
        let shared = &*self.shared;
        let block_start = block * shared.config.block_size;
        let len = entry.block_len(block, shared.config.block_size);
        let mut retried_prefetch = false;
        loop {
            match shared.cache.lookup((entry.id, block), len) {
                Lookup::Hit(data) => return Ok(data),
                Lookup::Wait(slot) => match slot.wait(LOAD_WAIT_TIMEOUT) {
                    Ok(data) => return Ok(data),
                    // A failed prefetch is retried once on demand: the reader should see its own error.
                    Err(_) if slot.is_prefetch() && !retried_prefetch => retried_prefetch = true,
                    Err(e) => return Err(entry.error(block_start, e)),
                },
                Lookup::Load(mut ticket) => {
                    return match shared.fetch_on_demand(entry, block, &mut [&mut ticket], stream) {
                        Ok(mut buffers) => Ok(ticket.complete(buffers.pop().unwrap_or_default())),
                        Err(e) => {
                            ticket.fail(&e);
                            Err(entry.error(block_start, e))
                        }
                    };
                }
            }
        }
    }

    /// Blocks `first..=last` of `entry`, for one request. Runs of consecutive missing blocks are
    /// loaded with one backing read each (one `preadv`, one ranged GET), so a 1 MiB request over
    /// four cold blocks costs one round trip, not four. Every load this thread starts is
    /// finished before it waits for anyone else's, so two readers can never wait on each other.
    pub(super) fn demand_blocks(
        &self,
        entry: &SourceEntry,
        first: u64,
        last: u64,
        stream: Option<&StreamIo>,
    ) -> Result<Vec<BlockData>, ReadError> {
        let shared = &*self.shared;
        let bs = shared.config.block_size;
        let count = (last - first + 1) as usize;
        let mut ready: Vec<Option<BlockData>> = vec![None; count];
        let mut waits = Vec::new();
        let mut run: Vec<(usize, LoadTicket<'_>)> = Vec::new();
        for (i, block) in (first..=last).enumerate() {
            match shared.cache.lookup((entry.id, block), entry.block_len(block, bs)) {
                Lookup::Hit(data) => ready[i] = Some(data),
                Lookup::Wait(slot) => waits.push((i, slot)),
                Lookup::Load(ticket) => {
                    if run.last().is_some_and(|(j, _)| j + 1 != i) {
                        self.load_run(entry, first, &mut run, &mut ready, stream)?;
                    }
                    run.push((i, ticket));
                    continue;
                }
            }
            self.load_run(entry, first, &mut run, &mut ready, stream)?;
        }
        self.load_run(entry, first, &mut run, &mut ready, stream)?;
        for (i, slot) in waits {
            ready[i] = Some(match slot.wait(LOAD_WAIT_TIMEOUT) {
                Ok(data) => data,
                // A failed prefetch is retried on demand: the reader should see its own error.
                Err(_) if slot.is_prefetch() => self.demand_block(entry, first + i as u64, stream)?,
                Err(e) => return Err(entry.error((first + i as u64) * bs, e)),
            });
        }
        Ok(ready.into_iter().flatten().collect())
    }

    /// Loads the consecutive blocks of `run` (indices from `first`) in one backing read.
    pub(super) fn load_run(
        &self,
        entry: &SourceEntry,
        first: u64,
        run: &mut Vec<(usize, LoadTicket<'_>)>,
        ready: &mut [Option<BlockData>],
        stream: Option<&StreamIo>,
    ) -> Result<(), ReadError> {
        let Some(&(start, _)) = run.first() else { return Ok(()) };
        let shared = &*self.shared;
        let (indices, mut tickets): (Vec<usize>, Vec<LoadTicket<'_>>) = run.drain(..).unzip();
        let block = first + start as u64;
        let mut refs: Vec<&mut LoadTicket<'_>> = tickets.iter_mut().collect();
        let loaded = shared.fetch_on_demand(entry, block, &mut refs, stream);
        match loaded {
            Ok(buffers) => {
                for ((i, ticket), buffer) in indices.into_iter().zip(tickets).zip(buffers) {
                    ready[i] = Some(ticket.complete(buffer));
                }
                Ok(())
            }
            Err(e) => {
                for ticket in tickets {
                    ticket.fail(&e);
                }
                Err(entry.error(block * shared.config.block_size, e))
            }
        }
    }
}

impl Shared {
    /// [`Shared::fetch`] for a reader's own loads: through the descriptor of its sequential
    /// stream if it has one and no other thread of that stream is using it, else through a spare
    /// descriptor of the source, returned to the pool afterwards.
    fn fetch_on_demand(
        &self,
        entry: &SourceEntry,
        first: u64,
        tickets: &mut [&mut LoadTicket<'_>],
        stream: Option<&StreamIo>,
    ) -> io::Result<Vec<Vec<u8>>> {
        if let Some(mut own) = stream.and_then(|s| s.descriptor.try_lock().ok()) {
            if own.is_none() {
                *own = entry.spares.take();
            }
            return self.fetch(entry, first, tickets, &mut own);
        }
        let mut spare = entry.spares.take();
        let loaded = self.fetch(entry, first, tickets, &mut spare);
        entry.spares.keep(spare);
        loaded
    }

    /// One backing read of the whole blocks `first..first + tickets.len()` through `descriptor`
    /// (opened first if it is `None`), into the tickets' buffers; returns them in block order.
    pub(super) fn fetch(
        &self,
        entry: &SourceEntry,
        first: u64,
        tickets: &mut [&mut LoadTicket<'_>],
        descriptor: &mut Option<Box<dyn SourceReader>>,
    ) -> io::Result<Vec<Vec<u8>>> {
        let buffers = self.take_buffers(entry, first, tickets.iter_mut().map(|t| &mut **t));
        let mut filled = Vec::with_capacity(tickets.len());
        self.fetch_landing(entry, first, buffers, descriptor, &mut |buffer| filled.push(buffer))?;
        Ok(filled)
    }

    /// The tickets' buffers for blocks `first..`, each sized to its block.
    fn take_buffers<'a, 't: 'a>(
        &self,
        entry: &SourceEntry,
        first: u64,
        tickets: impl Iterator<Item = &'a mut LoadTicket<'t>>,
    ) -> Vec<Vec<u8>> {
        let bs = self.config.block_size;
        // A block is at most MAX_BLOCK_SIZE (1 GiB), so its length fits a usize.
        (first..).zip(tickets).map(|(block, t)| t.take_buffer(entry.block_len(block, bs) as usize)).collect()
    }

    /// One backing read of blocks `first..first + buffers.len()` into `buffers` (see
    /// [`Shared::fetch`]), handing each to `landed`, in block order, as soon as the source has
    /// filled it ([`SourceReader::read_blocks_at`]); on an error the rest are dropped.
    pub(super) fn fetch_landing(
        &self,
        entry: &SourceEntry,
        first: u64,
        buffers: Vec<Vec<u8>>,
        descriptor: &mut Option<Box<dyn SourceReader>>,
        landed: &mut dyn FnMut(Vec<u8>),
    ) -> io::Result<()> {
        let bs = self.config.block_size;
        let count = buffers.len();
        let mut bytes = 0u64;
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
        Stats::add(&self.stats.backing_reads, 1);
        Stats::add(&self.stats.backing_read_bytes, bytes);
        match &result {
            Ok(()) => {}
            Err(e) => {
                Stats::add(&self.stats.backing_errors, 1);
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

    /// Runs one lane of a stream's prefetch: claims chunks of the pending blocks in order and loads
    /// each run of missing blocks in one read on the lane's own descriptor.
    pub(super) fn run_prefetch(&self, job: &Job) {
        let bs = self.config.block_size;
        let Some(lane) = job.stream.lanes.get(job.lane) else {
            return;
        };
        while let Some(chunk) = job.stream.next_chunk(job.lane, self.stopping.load(Relaxed)) {
            let mut run: Vec<LoadTicket<'_>> = Vec::new();
            let mut run_start = chunk.start;
            let mut refused = None;
            for block in chunk {
                if job.stream.is_behind(block) {
                    self.prefetch_run(job, lane, run_start, std::mem::take(&mut run));
                    continue;
                }
                match self.cache.prefetch((job.source.id, block), job.source.block_len(block, bs)) {
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
                self.prefetch_run(job, lane, run_start, std::mem::take(&mut run));
                if let Some(block) = refused {
                    job.stream.refuse(block);
                    break;
                }
            }
            self.prefetch_run(job, lane, run_start, run);
        }
    }

    /// Loads a run of reserved neighbouring blocks starting at `first` in one backing read on the
    /// lane's descriptor, publishing each block as soon as it lands.
    pub(super) fn prefetch_run(
        &self,
        job: &Job,
        lane: &Mutex<Option<Box<dyn SourceReader>>>,
        first: u64,
        mut run: Vec<LoadTicket<'_>>,
    ) {
        if run.is_empty() {
            return;
        }
        let mut descriptor = lock(lane);
        if descriptor.is_none() {
            *descriptor = job.source.spares.take();
        }
        let buffers = self.take_buffers(&job.source, first, run.iter_mut());
        let mut tickets = run.into_iter();
        let result = self.fetch_landing(&job.source, first, buffers, &mut descriptor, &mut |data| {
            if let Some(ticket) = tickets.next() {
                Stats::add(&self.stats.prefetched_bytes, data.len() as u64);
                ticket.complete(data);
            }
        });
        drop(descriptor);
        if let Err(e) = result {
            tickets.for_each(|ticket| ticket.fail(&e));
        }
    }
}

impl SourceEntry {
    /// Length of block `block`: a whole block, except the last one of the source.
    pub(super) fn block_len(&self, block: u64, block_size: u64) -> u64 {
        let start = block.saturating_mul(block_size);
        self.len.saturating_sub(start).min(block_size)
    }

    pub(super) fn error(&self, offset: u64, error: io::Error) -> ReadError {
        ReadError { source_name: self.source.name().to_string(), offset, error }
    }
}

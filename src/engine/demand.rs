//! On-demand loads: the blocks one request needs, and its answer.
//!
//! For each block the request covers, the cache answers: ready (used as is), loading (wait for
//! that one load: single flight), or absent (the calling thread loads exactly that block, never
//! the prefetch). A request inside one block is handed to the caller straight from the cached
//! block; a request spanning blocks is joined once in a per-thread buffer. Outside a sequential
//! stream, each run of cold blocks is one backing read (one `preadv`, one ranged GET).

use std::cell::RefCell;
use std::io;

use super::backing;
use super::cache::{BlockData, LoadTicket, Lookup};
use super::error::ReadError;
use super::shared::{Shared, SourceEntry};
use super::stream::StreamIo;
use super::tuning::{load_wait, JOIN_BUFFER_KEEP_BYTES};

thread_local! {
    /// Where a read spanning several blocks is joined, reused by each FUSE thread so that joining
    /// costs one copy and no allocation.
    static JOIN_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One request's loads: of which source, and through which stream.
pub(crate) struct Demand<'a> {
    /// The engine's shared state (cache, counters, block size).
    pub(crate) shared: &'a Shared,
    /// The source read.
    pub(crate) entry: &'a SourceEntry,
    /// The request's stream, if it is sequential: its prefetch lanes are loading what follows, and
    /// its loads use the stream's own descriptor.
    pub(crate) stream: Option<&'a StreamIo>,
}

impl Demand<'_> {
    /// Hands bytes `[offset, end)` of the source (not empty, inside it) to `consume`, which runs on
    /// the calling thread with no lock held.
    pub(crate) fn serve<R>(&self, offset: u64, end: u64, consume: impl FnOnce(&[u8]) -> R) -> Result<R, ReadError> {
        let bs = self.shared.config.block_size;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let slice = |data: &BlockData, block: u64| {
            let block_start = block * bs;
            let from = (offset.max(block_start) - block_start) as usize;
            let to = (end.min(block_start.saturating_add(bs)) - block_start) as usize;
            if data.len() < to {
                return Err(self.entry.error(block_start, io::Error::other("short block in cache")));
            }
            Ok((from, to))
        };
        if first == last {
            let data = self.block(first)?;
            let (from, to) = slice(&data, first)?;
            return Ok(consume(&data[from..to]));
        }
        let blocks = match self.stream {
            // A sequential stream's prefetch lanes are loading what follows in parallel: take the
            // blocks one by one, so this thread claims only what it must.
            Some(_) => (first..=last).map(|block| self.block(block)).collect::<Result<Vec<_>, _>>()?,
            // Nobody else will fetch these: one backing read for each run of cold blocks.
            None => self.blocks(first, last)?,
        };
        JOIN_BUFFER.with(|cell| {
            // A reentrant call (none today) gets its own buffer rather than a borrow panic.
            let mut own = Vec::new();
            let mut borrowed = cell.try_borrow_mut();
            let out = borrowed.as_deref_mut().unwrap_or(&mut own);
            out.clear();
            for (block, data) in (first..).zip(&blocks) {
                let (from, to) = slice(data, block)?;
                out.extend_from_slice(&data[from..to]);
            }
            let result = consume(out);
            if out.capacity() > JOIN_BUFFER_KEEP_BYTES {
                *out = Vec::new();
            }
            Ok(result)
        })
    }

    /// Block `block`: from the cache, by waiting for its load, or by loading it.
    fn block(&self, block: u64) -> Result<BlockData, ReadError> {
        let (shared, entry) = (self.shared, self.entry);
        let block_start = block * shared.config.block_size;
        let len = entry.block_len(block, shared.config.block_size);
        let mut retried_prefetch = false;
        loop {
            match shared.cache.lookup((entry.id, block), len) {
                Lookup::Hit(data) => return Ok(data),
                Lookup::Wait(slot) => match slot.wait(load_wait(shared.config.source_timeout)) {
                    Ok(data) => return Ok(data),
                    // A failed prefetch is retried once on demand: the reader should see its own error.
                    Err(_) if slot.is_prefetch() && !retried_prefetch => retried_prefetch = true,
                    Err(e) => return Err(entry.error(block_start, e)),
                },
                Lookup::Load(mut ticket) => {
                    return match self.fetch(block, &mut [&mut ticket]) {
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

    /// Blocks `first..=last`. Runs of consecutive missing blocks are loaded with one backing read
    /// each, so a 1 MiB request over four cold blocks costs one round trip, not four. Every load
    /// this thread starts is finished before it waits for anyone else's, so two readers can never
    /// wait on each other.
    fn blocks(&self, first: u64, last: u64) -> Result<Vec<BlockData>, ReadError> {
        let (shared, entry) = (self.shared, self.entry);
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
                        self.load_run(first, &mut run, &mut ready)?;
                    }
                    run.push((i, ticket));
                    continue;
                }
            }
            self.load_run(first, &mut run, &mut ready)?;
        }
        self.load_run(first, &mut run, &mut ready)?;
        for (i, slot) in waits {
            ready[i] = Some(match slot.wait(load_wait(shared.config.source_timeout)) {
                Ok(data) => data,
                // A failed prefetch is retried on demand: the reader should see its own error.
                Err(_) if slot.is_prefetch() => self.block(first + i as u64)?,
                Err(e) => return Err(entry.error((first + i as u64) * bs, e)),
            });
        }
        Ok(ready.into_iter().flatten().collect())
    }

    /// Loads the consecutive blocks of `run` (indices from `first`) in one backing read.
    fn load_run(
        &self,
        first: u64,
        run: &mut Vec<(usize, LoadTicket<'_>)>,
        ready: &mut [Option<BlockData>],
    ) -> Result<(), ReadError> {
        let Some(&(start, _)) = run.first() else { return Ok(()) };
        let (indices, mut tickets): (Vec<usize>, Vec<LoadTicket<'_>>) = run.drain(..).unzip();
        let block = first + start as u64;
        let mut refs: Vec<&mut LoadTicket<'_>> = tickets.iter_mut().collect();
        match self.fetch(block, &mut refs) {
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
                Err(self.entry.error(block * self.shared.config.block_size, e))
            }
        }
    }

    /// One backing read of the whole blocks `first..first + tickets.len()` into the tickets'
    /// buffers, returned in block order: through the descriptor of the request's sequential stream
    /// if it has one and no other thread of that stream is using it, else through a spare
    /// descriptor of the source, returned to the pool afterwards.
    fn fetch(&self, first: u64, tickets: &mut [&mut LoadTicket<'_>]) -> io::Result<Vec<Vec<u8>>> {
        let (shared, entry) = (self.shared, self.entry);
        let buffers = backing::buffers(shared, entry, first, tickets.iter_mut().map(|t| &mut **t));
        let mut filled = Vec::with_capacity(tickets.len());
        let mut land = |buffer| filled.push(buffer);
        if let Some(mut own) = self.stream.and_then(|s| s.descriptor.try_lock().ok()) {
            if own.is_none() {
                *own = entry.spares.take();
            }
            let loaded = backing::read_blocks(shared, entry, first, buffers, &mut own, false, &mut land);
            // A load that outlasted the idle time: the source may have been closed meanwhile.
            shared.descriptors.holding(&entry.activity);
            return loaded.map(|()| filled);
        }
        let mut spare = entry.spares.take();
        let loaded = backing::read_blocks(shared, entry, first, buffers, &mut spare, false, &mut land);
        entry.spares.keep(spare);
        shared.descriptors.holding(&entry.activity);
        loaded.map(|()| filled)
    }
}

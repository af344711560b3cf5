//! Direct reads: byte ranges of a source read straight into memory the caller owns, one backing
//! read each, past the block cache. A whole load (`stfs.load`, every tensor of a remote checkpoint
//! into its own memory) then costs one copy, from the store into the tensors, in as few and as
//! large requests as the caller cuts, where the block path would copy each byte twice (into a
//! block, then out) and fetch it in blocks its streams' windows cut.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::core::Engine;
use super::error::ReadError;
use super::shared::{Shared, SourceEntry};
use crate::source::{SourceId, SourceReader};
use crate::stats::Stats;

/// One caller's direct reads of one source, on a descriptor (a connection, for a remote source) of
/// its own, opened at its first read and kept for the next, so a thread reading many ranges
/// reuses one. Counted as backing reads, as the block path's are.
pub struct DirectReader {
    shared: Arc<Shared>,
    entry: Arc<SourceEntry>,
    descriptor: Option<Box<dyn SourceReader>>,
}

impl Engine {
    /// A reader of `source` past the block cache, or `None` when its reads must go through blocks:
    /// an unknown source, or one the disk tier keeps (its blocks are to land on disk).
    pub fn direct_reader(&self, source: SourceId) -> Option<DirectReader> {
        let entry = self.entry(source).filter(|e| self.reads_directly_entry(e))?;
        Some(DirectReader { shared: Arc::clone(&self.shared), entry, descriptor: None })
    }

    /// Whether `source` may be read past the block cache ([`Engine::direct_reader`]). No system
    /// call.
    pub fn reads_directly(&self, source: SourceId) -> bool {
        self.entry(source).is_some_and(|e| self.reads_directly_entry(&e))
    }

    fn reads_directly_entry(&self, entry: &SourceEntry) -> bool {
        self.shared.disk.is_none() || entry.disk_key.is_none()
    }
}

impl DirectReader {
    /// Fills `bufs`, one after the other, from the source's bytes at `offset`, in one backing read
    /// (a ranged GET, a `preadv`) with the source's own retries. A range past the source's end, or
    /// a source changed since it was pinned, is an error; so is any failure of the store, after
    /// which the descriptor is dropped (it may be broken) and the next read opens another.
    pub fn read(&mut self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<(), ReadError> {
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if bytes == 0 {
            return Ok(());
        }
        if offset.checked_add(bytes).is_none_or(|end| end > self.entry.len) {
            let past = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{bytes} bytes at {offset} are past the end ({} bytes)", self.entry.len),
            );
            return Err(self.entry.error(offset, past));
        }
        let started = Instant::now();
        let result = (|| {
            let descriptor = match &mut self.descriptor {
                Some(descriptor) => descriptor,
                empty => empty.insert(self.entry.source.open_streaming_reader()?),
            };
            descriptor.read_vectored_exact_at(bufs, offset)
        })();
        let stats = &self.shared.stats;
        Stats::add(&stats.backing_reads, 1);
        stats.record_backing_latency(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        log::debug!(
            "{}: direct read of {bytes} bytes at {offset} in {:.1} ms",
            self.entry.source.name(),
            started.elapsed().as_secs_f64() * 1e3
        );
        match result {
            Ok(()) => {
                Stats::add(&stats.backing_read_bytes, bytes);
                Ok(())
            }
            Err(error) => {
                Stats::add(&stats.backing_errors, 1);
                log::warn!("{}: direct read of {bytes} bytes at {offset} failed: {error}", self.entry.source.name());
                self.descriptor = None;
                Err(self.entry.error(offset, error))
            }
        }
    }
}

/// One piece of a run [`cut_run`] cut: what one direct read fills.
#[derive(Debug, PartialEq)]
pub struct RunPiece {
    /// Its first byte's place in the run (bytes from the run's start).
    pub start: u64,
    /// The index (in the run's parts) of the part its first byte belongs to.
    pub first_part: usize,
    /// The parts, or pieces of parts, it fills, in order (`(address, len)`).
    pub parts: Vec<(usize, usize)>,
}

/// The parts of a run of bytes (`(address, len)` each, the run's bytes in order) cut into
/// `ceil(total / piece)` pieces of as even a size as whole bytes allow (none above `piece`).
pub fn cut_run(parts: &[(usize, usize)], piece: u64) -> Vec<RunPiece> {
    let total: u64 = parts.iter().map(|&(_, n)| n as u64).sum();
    let count = total.div_ceil(piece.max(1));
    let mut pieces = Vec::new();
    let mut rest = parts.iter().copied().enumerate().filter(|&(_, (_, n))| n > 0).peekable();
    let mut taken = 0usize; // bytes of the current part already in a piece
    for k in 0..count {
        let start = total * k / count;
        let mut want = (total * (k + 1) / count - start) as usize;
        let mut cut = RunPiece { start, first_part: rest.peek().map_or(0, |&(i, _)| i), parts: Vec::new() };
        while want > 0 {
            let Some(&(_, (address, len))) = rest.peek() else { break };
            let n = (len - taken).min(want);
            cut.parts.push((address + taken, n));
            (want, taken) = (want - n, taken + n);
            if taken == len {
                rest.next();
                taken = 0;
            }
        }
        pieces.push(cut);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::cut_run;

    #[test]
    fn a_run_is_cut_into_even_pieces_that_cover_it_in_order() {
        // Three buffers far apart, 30 bytes in all (and an empty one, which no piece holds).
        let parts = [(1 << 20, 10), (2 << 20, 7), (5 << 20, 0), (3 << 20, 13)];
        let want: Vec<usize> = parts.iter().flat_map(|&(a, n)| a..a + n).collect();
        for piece in [1, 4, 10, 29, 30, 100] {
            let pieces = cut_run(&parts, piece);
            assert_eq!(pieces.len() as u64, 30u64.div_ceil(piece), "{piece}");
            let sizes: Vec<u64> = pieces.iter().map(|p| p.parts.iter().map(|&(_, n)| n as u64).sum()).collect();
            let (least, most) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(*most <= piece && most - least <= 1, "{piece}: {sizes:?}");
            // Every byte of every buffer exactly once, in order.
            let bytes: Vec<usize> = pieces.iter().flat_map(|p| &p.parts).flat_map(|&(a, n)| a..a + n).collect();
            assert_eq!(bytes, want, "{piece}");
            // Each piece starts where the ones before it end, in the part holding its first byte.
            let mut start = 0;
            for (p, size) in pieces.iter().zip(&sizes) {
                assert_eq!(p.start, start, "{piece}");
                let (address, len) = parts[p.first_part];
                assert!((address..address + len).contains(&p.parts[0].0), "{piece}: {p:?}");
                start += size;
            }
        }
        assert!(cut_run(&[], 4).is_empty());
    }
}

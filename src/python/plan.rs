//! How one call's ranges are cut into the readers' jobs (`reads`): raw tensor bytes that join into
//! runs of at least a block are read straight from the store in pieces about an even share of the
//! threads' work (one request each, one copy); everything else (views, short runs such as a column
//! slice's rows, sources a disk tier keeps) goes through the filesystem's block reads in chunks.

use super::reads::{DirectPiece, Job, Read};
use crate::engine::cut_run;
use crate::fs::Fs;
use crate::source::SourceId;
use crate::tree::namespace::Ino;

/// The most bytes one thread reads of a range through the filesystem at a time: a larger range is
/// read as pieces on several.
const READ_PIECE: usize = 16 << 20;
/// Bounds of a direct piece: below, a request's fixed cost (a round trip) outweighs its transfer;
/// above, the threads' shares get too coarse to even out.
const MIN_DIRECT_PIECE: u64 = 4 << 20;
const MAX_DIRECT_PIECE: u64 = 64 << 20;

/// One range a caller wants: `len` bytes of file `ino` (tensor `tensor`'s) from `offset`, to
/// `address`.
pub struct Wanted {
    /// The tensor file.
    pub ino: Ino,
    /// The tensor's index (for its name in an error).
    pub tensor: usize,
    /// The first byte of the file wanted.
    pub offset: u64,
    /// Where the bytes go (as [`Read::address`]).
    pub address: usize,
    /// Bytes wanted.
    pub len: usize,
}

/// A wanted range of raw tensor bytes, placed in its source.
struct Placed {
    wanted: Wanted,
    source: SourceId,
    at: u64,
}

/// The jobs that read every one of `wanted` on `threads` threads: runs of raw tensor bytes
/// (neighbouring in their source) of at least `block_size` bytes as direct pieces of about an even
/// share each, first; the rest as filesystem reads of at most [`READ_PIECE`].
pub fn plan(fs: &Fs, wanted: Vec<Wanted>, threads: usize, block_size: u64) -> Vec<Job> {
    let mut through_fs = Vec::new();
    let mut placed = Vec::new();
    for w in wanted {
        match fs.direct_extent(w.ino) {
            Some((source, start, len)) if w.len > 0 && w.offset.saturating_add(w.len as u64) <= len => {
                placed.push(Placed { source, at: start + w.offset, wanted: w });
            }
            _ => through_fs.push(w),
        }
    }
    placed.sort_by_key(|p| (p.source, p.at));
    let mut runs: Vec<Vec<Placed>> = Vec::new();
    for p in placed {
        match runs.last_mut() {
            Some(run) if run_end(run) == Some((p.source, p.at)) => run.push(p),
            _ => runs.push(vec![p]),
        }
    }
    let (long, short): (Vec<_>, Vec<_>) = runs.into_iter().partition(|run| run_bytes(run) >= block_size.max(1));
    through_fs.extend(short.into_iter().flatten().map(|p| p.wanted));

    let direct_bytes: u64 = long.iter().map(|run| run_bytes(run)).sum();
    let piece = direct_bytes.div_ceil(threads.max(1) as u64).clamp(MIN_DIRECT_PIECE, MAX_DIRECT_PIECE);
    let mut jobs: Vec<Job> = long.iter().flat_map(|run| cut(run, piece)).map(Job::Direct).collect();
    for w in through_fs {
        for at in (0..w.len).step_by(READ_PIECE) {
            let len = READ_PIECE.min(w.len - at);
            let read =
                Read { ino: w.ino, tensor: w.tensor, offset: w.offset + at as u64, address: w.address + at, len };
            jobs.push(Job::Fs(read));
        }
    }
    jobs
}

fn run_bytes(run: &[Placed]) -> u64 {
    run.iter().map(|p| p.wanted.len as u64).sum()
}

/// Where a run ends: its source and the byte after its last.
fn run_end(run: &[Placed]) -> Option<(SourceId, u64)> {
    run.last().map(|p| (p.source, p.at + p.wanted.len as u64))
}

/// `run` cut into pieces of about `piece` bytes ([`cut_run`]), each one request, named by the
/// tensor its first byte belongs to.
fn cut(run: &[Placed], piece: u64) -> Vec<DirectPiece> {
    let Some(first) = run.first() else { return Vec::new() };
    let parts: Vec<(usize, usize)> = run.iter().map(|p| (p.wanted.address, p.wanted.len)).collect();
    cut_run(&parts, piece)
        .into_iter()
        .map(|cut| DirectPiece {
            source: first.source,
            offset: first.at + cut.start,
            tensor: run[cut.first_part].wanted.tensor,
            parts: cut.parts,
        })
        .collect()
}

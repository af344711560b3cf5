//! Many byte ranges of tensor files read at once into memory the caller owns, on a few threads, the
//! GIL released: long runs of raw tensor bytes straight from the store (`Fs::read_direct`: one
//! request per piece, one copy), the rest through the same filesystem reads a mount answers the
//! kernel with (`Fs::read_with`: the engine's blocks, readahead and single flight). The calling
//! thread only waits, looking for a signal every [`SIGNAL_CHECK_EVERY`]: Ctrl-C stops every reader
//! at its next chunk or piece, and the call returns once they have all ended, so none is left
//! reading.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

use crate::engine::DirectReader;
use crate::fs::Fs;
use crate::source::SourceId;
use crate::tree::namespace::Ino;
use crate::util::lock;

/// Bytes asked of the filesystem per call when blocks are smaller (a call ends at a block's end
/// otherwise, so a cached block reaches the caller's memory in one copy).
const CHUNK: u64 = 4 << 20;
/// How often the waiting thread looks for a signal.
const SIGNAL_CHECK_EVERY: Duration = Duration::from_millis(50);

/// One range to read: `len` bytes of file `ino` (tensor `tensor`'s) from `offset`, to `address`.
pub struct Read {
    /// The tensor file's inode.
    pub ino: Ino,
    /// The tensor's index (for its name in an error).
    pub tensor: usize,
    /// The first byte of the file to read.
    pub offset: u64,
    /// Where the bytes go: memory of `len` writable bytes the caller keeps alive.
    pub address: usize,
    /// Bytes to read.
    pub len: usize,
}

/// One piece of a run of raw tensor bytes read straight from the store: `parts`, one after the
/// other, are the bytes of `source` from `offset` (each `(address, len)`: memory the caller keeps
/// alive, as [`Read::address`]).
pub struct DirectPiece {
    /// The source read.
    pub source: SourceId,
    /// Its first byte read.
    pub offset: u64,
    /// Where the bytes go, in order.
    pub parts: Vec<(usize, usize)>,
    /// The tensor whose bytes come first (for its name in an error).
    pub tensor: usize,
}

/// What one reader takes at a time.
pub enum Job {
    /// A range of a tensor file, through the filesystem (the engine's blocks).
    Fs(Read),
    /// A piece of a run read straight from the store.
    Direct(DirectPiece),
}

/// What the readers share: the next job to take, whether to stop, the first failure, how many
/// have ended.
struct Shared<'a> {
    fs: &'a Fs,
    jobs: &'a [Job],
    next: AtomicUsize,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
    ended: (Mutex<usize>, Condvar),
    block_size: u64,
}

/// Does every one of `jobs` on up to `threads` threads, each taking whole jobs in turn (a
/// tensor's chunks in order, so its readahead stream stays sequential). Raises `StfsError` for the
/// first failed read (`stfs: TENSOR: problem`), or the exception a signal handler raised.
pub fn read_all(py: Python<'_>, fs: &Fs, jobs: &[Job], threads: usize, block_size: u64) -> PyResult<()> {
    let threads = threads.clamp(1, jobs.len().max(1));
    let shared = Shared {
        fs,
        jobs,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
        ended: (Mutex::new(0), Condvar::new()),
        block_size,
    };
    let interrupted = py.allow_threads(|| {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    read_some(&shared);
                    *lock(&shared.ended.0) += 1;
                    shared.ended.1.notify_all();
                });
            }
            wait_for(&shared, threads)
        })
    });
    if let Some(error) = interrupted {
        return Err(error);
    }
    let failure = lock(&shared.failure).take();
    failure.map_or(Ok(()), |line| Err(super::error::stfs_error(py, line)))
}

/// Waits until `threads` readers have ended; a pending signal whose handler raises (Ctrl-C's
/// KeyboardInterrupt) tells them to stop, and is returned (the scope then joins them).
fn wait_for(shared: &Shared<'_>, threads: usize) -> Option<PyErr> {
    let mut ended = lock(&shared.ended.0);
    loop {
        if *ended == threads {
            return None;
        }
        let (guard, timeout) =
            shared.ended.1.wait_timeout(ended, SIGNAL_CHECK_EVERY).unwrap_or_else(|e| e.into_inner());
        ended = guard;
        if timeout.timed_out() {
            drop(ended);
            if let Err(error) = Python::with_gil(|py| py.check_signals()) {
                shared.stop.store(true, Relaxed);
                return Some(error);
            }
            ended = lock(&shared.ended.0);
        }
    }
}

/// One reader: takes jobs until none is left, one fails, or the call is stopped. Its direct reads
/// of a source share one descriptor (one connection).
fn read_some(shared: &Shared<'_>) {
    let mut readers: HashMap<SourceId, DirectReader> = HashMap::new();
    while !shared.stop.load(Relaxed) {
        let Some(job) = shared.jobs.get(shared.next.fetch_add(1, Relaxed)) else { return };
        let (tensor, result) = match job {
            Job::Fs(read) => (read.tensor, read_one(shared, read)),
            Job::Direct(piece) => (piece.tensor, read_direct(shared, &mut readers, piece)),
        };
        if let Err(problem) = result {
            let name = shared.fs.namespace().tensors().get(tensor).map_or("?", |t| t.name.as_str());
            let line = format!("stfs: {}: {problem}", crate::format::PrintablePath(name));
            lock(&shared.failure).get_or_insert(line);
            shared.stop.store(true, Relaxed);
        }
    }
}

/// Reads `piece` in one backing read, on this reader's descriptor of its source.
fn read_direct(
    shared: &Shared<'_>,
    readers: &mut HashMap<SourceId, DirectReader>,
    piece: &DirectPiece,
) -> Result<(), String> {
    let reader = match readers.entry(piece.source) {
        std::collections::hash_map::Entry::Occupied(reader) => reader.into_mut(),
        std::collections::hash_map::Entry::Vacant(empty) => {
            let reader = shared.fs.direct_reader(piece.source).ok_or("its source cannot be read directly")?;
            empty.insert(reader)
        }
    };
    // SAFETY: as in `read_one`: `Opened::read_into` took each address from a buffer it checked
    // writable and long enough, holds them exported until this call returns, and refused
    // overlapping ones; the parts of one buffer a plan cuts do not overlap.
    let mut bufs: Vec<&mut [u8]> = piece
        .parts
        .iter()
        .map(|&(address, len)| unsafe { std::slice::from_raw_parts_mut(address as *mut u8, len) })
        .collect();
    shared.fs.read_direct(reader, piece.offset, &mut bufs).map_err(|e| e.to_string())
}

/// Reads `read` chunk by chunk, each ending at a block's end (or [`CHUNK`]'s).
fn read_one(shared: &Shared<'_>, read: &Read) -> Result<(), String> {
    // SAFETY: `Opened::read_into` took the address from a buffer it checked writable, C-contiguous
    // and at least `len` bytes long, and holds exported (alive, unmoved) until this call returns;
    // it refused buffers of one call that overlap (`buffers::held_buffers`).
    let out = unsafe { std::slice::from_raw_parts_mut(read.address as *mut u8, read.len) };
    let step = if shared.block_size >= CHUNK { shared.block_size } else { CHUNK };
    let mut done = 0usize;
    while done < read.len {
        if shared.stop.load(Relaxed) {
            return Ok(());
        }
        let at = read.offset + done as u64;
        let want = (read.len - done).min((step - at % step) as usize).min(u32::MAX as usize) as u32;
        let got = shared.fs.read_with(read.ino, at, want, |bytes| {
            out[done..done + bytes.len()].copy_from_slice(bytes);
            bytes.len()
        });
        match got {
            Ok(0) => return Err(format!("the file ended at byte {at}, {} bytes short", read.len - done)),
            Ok(n) => done += n,
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

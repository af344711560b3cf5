//! `stfs._native.Opened`: a source opened in this process, as a mount would serve it (its
//! filesystem, `crate::fs::Fs`), without the mount: its tensors and shards listed, and byte ranges of
//! its tensor files read into memory the caller owns (`reads`).

use std::os::fd::IntoRawFd;
use std::sync::{Arc, RwLock};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::buffers::{advise_huge_pages, held_buffers};
use super::plan::{plan, Wanted};
use super::reads::read_all;
use crate::fs::Fs;
use crate::tree::namespace::{Ino, NodeKind, ROOT_INO};
use crate::util::read;

/// One tensor as the module lists it: `(name, dtype, shape, shard, start, length, path, served
/// dtype, served length)`; `start` is its first byte in its shard's file, `path` its file's path in
/// the tree a mount shows (with the component's folder in front: `unet/w`).
type Listed = (String, String, Vec<u64>, usize, u64, u64, String, String, u64);

/// A checkpoint opened with `stfs mount`'s options, read with no mount. `close()` ends its engine
/// (its threads joined, its descriptors closed); reads in flight keep it until they end.
#[pyclass(module = "stfs._native", frozen)]
pub struct Opened {
    fs: RwLock<Option<Arc<Fs>>>,
    /// The inode of each tensor's file, in [`crate::tree::namespace::Namespace::tensors`] order
    /// (none for a tensor the tree shows no file of: reading it is an error).
    inodes: Vec<Option<Ino>>,
}

#[pymethods]
impl Opened {
    /// Opens `source` as `stfs mount [flags] source` would (credentials, limits, disk cache); the
    /// GIL is released meanwhile. Raises `StfsError` with the line the CLI prints. Without
    /// `prefetch`, only the blocks a read asks for are fetched.
    #[new]
    #[pyo3(signature = (source, flags, prefetch = true))]
    fn new(py: Python<'_>, source: String, flags: Vec<String>, prefetch: bool) -> PyResult<Opened> {
        let fs = py
            .allow_threads(|| crate::cli::unmounted::open_unmounted(&source, &flags, prefetch))
            .map_err(|line| super::error::stfs_error(py, line))?;
        let inodes = fs.namespace().tensors().iter().map(|t| inode_of(&fs, &t.path)).collect();
        Ok(Opened { fs: RwLock::new(Some(fs)), inodes })
    }

    /// Every tensor, in shard and offset order (see [`Listed`]).
    fn tensors(&self, py: Python<'_>) -> PyResult<Vec<Listed>> {
        let fs = self.fs(py)?;
        let listed = fs.namespace().tensors().iter().map(|t| {
            let (start, len) = (t.start, t.len);
            let (dtype, served) = (t.dtype.name().to_string(), t.served_dtype.name().to_string());
            (t.name.clone(), dtype, t.shape.clone(), t.shard, start, len, t.path.clone(), served, t.served_len)
        });
        Ok(listed.collect())
    }

    /// Every shard: `(name, metadata)`, its path or URL as opened and its header's `__metadata__`
    /// (a dict, or None).
    fn shards<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Option<Bound<'py, PyDict>>)>> {
        let fs = self.fs(py)?;
        let mut out = Vec::new();
        for shard in fs.namespace().shards() {
            let metadata = match &shard.header.metadata {
                Some(map) => {
                    let dict = PyDict::new(py);
                    for (key, value) in map {
                        dict.set_item(key, value)?;
                    }
                    Some(dict)
                }
                None => None,
            };
            out.push((shard.name.clone(), metadata));
        }
        Ok(out)
    }

    /// A new descriptor on shard `shard`'s local file, checked against the file opened (the caller
    /// maps it and closes it), or None for a remote shard, a file on a network or FUSE filesystem,
    /// or a file changed since.
    fn shard_descriptor(&self, py: Python<'_>, shard: usize) -> PyResult<Option<i32>> {
        Ok(self.fs(py)?.shard_opened(shard).map(IntoRawFd::into_raw_fd))
    }

    /// Whether shard `shard` is a local file on a local filesystem, which a load maps (zero copy)
    /// rather than reads through the engine.
    fn shard_is_mappable(&self, py: Python<'_>, shard: usize) -> PyResult<bool> {
        Ok(self.fs(py)?.shard_is_mappable(shard))
    }

    /// Reads each `(tensor, offset, buffer, length)`: `length` bytes of tensor `tensor`'s file (as a
    /// mount serves it) from `offset`, into the start of `buffer` (an object with the writable
    /// buffer protocol, held exported for the call: ValueError if it is read-only, not contiguous,
    /// too small, or overlaps another of the call), on up to `threads` threads, the GIL released:
    /// raw tensor bytes in long runs straight from the store in about even pieces, the rest through
    /// the engine's blocks (`plan`). With `huge_pages`, the buffers are fresh memory the call may
    /// advise the kernel to back with huge pages before its first touch (`advise_huge_pages`). A
    /// signal (Ctrl-C) stops every thread at its next chunk or piece, and its exception is raised
    /// once they all have.
    #[pyo3(signature = (reads, threads, huge_pages = false))]
    fn read_into<'py>(
        &self,
        py: Python<'py>,
        reads: Vec<(usize, u64, Bound<'py, PyAny>, usize)>,
        threads: usize,
        huge_pages: bool,
    ) -> PyResult<()> {
        let fs = self.fs(py)?;
        let buffers: Vec<(Bound<'py, PyAny>, usize)> = reads.iter().map(|(_, _, b, len)| (b.clone(), *len)).collect();
        let held = held_buffers(py, &buffers, "the buffer to read into")?;
        let mut wanted = Vec::with_capacity(reads.len());
        for ((tensor, offset, _, len), &address) in reads.iter().zip(&held.addresses) {
            let Some(&Some(ino)) = self.inodes.get(*tensor) else {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!("no tensor file #{tensor}")));
            };
            if huge_pages {
                advise_huge_pages(address, *len);
            }
            wanted.push(Wanted { ino, tensor: *tensor, offset: *offset, address, len: *len });
        }
        let block_size = block_size(&fs);
        let jobs = plan(&fs, wanted, threads, block_size);
        let result = read_all(py, &fs, &jobs, threads, block_size);
        drop(held);
        result
    }

    /// The engine's counters, by the names stats.json gives them (a few: what a test of how much
    /// was read needs).
    fn stats(&self, py: Python<'_>) -> PyResult<Vec<(&'static str, u64)>> {
        use std::sync::atomic::Ordering::Relaxed;
        let fs = self.fs(py)?;
        let s = fs.stats();
        Ok(vec![
            ("fuse_read_bytes", s.fuse_read_bytes.load(Relaxed)),
            ("backing_reads", s.backing_reads.load(Relaxed)),
            ("backing_read_bytes", s.backing_read_bytes.load(Relaxed)),
            ("opening_read_bytes", s.opening_read_bytes.load(Relaxed)),
            ("http_requests", s.http_requests.load(Relaxed)),
            ("http_bytes", s.http_bytes.load(Relaxed)),
            ("block_size", block_size(&fs)),
        ])
    }

    /// Ends the engine: its threads are joined and its descriptors closed once no read is in flight
    /// (at once if none is). Reads after it raise `StfsError`.
    fn close(&self, py: Python<'_>) {
        let fs = self.fs.write().unwrap_or_else(|e| e.into_inner()).take();
        // Dropped without the GIL: the engine joins its threads.
        py.allow_threads(move || drop(fs));
    }
}

impl Opened {
    fn fs(&self, py: Python<'_>) -> PyResult<Arc<Fs>> {
        read(&self.fs).clone().ok_or_else(|| super::error::stfs_error(py, "stfs: the checkpoint is closed".into()))
    }
}

/// The engine's block size (what a read of a slice may fetch beyond it at each end).
fn block_size(fs: &Fs) -> u64 {
    u64::from(fs.getattr(ROOT_INO).map_or(0, |a| a.blksize))
}

/// The inode of the file at `path` (`/`-separated, from the root), if there is one.
fn inode_of(fs: &Fs, path: &str) -> Option<Ino> {
    let ns = fs.namespace();
    path.split('/').try_fold(ROOT_INO, |dir, name| match &ns.node(dir)?.kind {
        NodeKind::Dir(entries) => entries.get(name),
        NodeKind::File { .. } => None,
    })
}

//! The block engine: byte ranges of registered sources, read only in whole aligned blocks through
//! a byte-bounded LRU cache, with readahead and prefetch lanes.
//!
//! How one read flows through this folder:
//!
//! 1. `core`: [`Engine::read_in`] finds the registered source (`shared::SourceEntry`) and clips
//!    the range to it.
//! 2. `stream`: the source's table of streams gives the read to its stream (then a read inside the
//!    source's opening bytes, [`Source::opening_bytes`](crate::source::Source::opening_bytes), is
//!    answered from them, unless the source is cached on disk); `readahead` decides,
//!    purely, whether the read continues a stream, how far ahead the stream wants data and which
//!    blocks it has left behind. The stream queues its new prefetch for its lanes, learns of any
//!    refusal the lanes met, and hands its passed blocks to drop-behind (`cache::behind`).
//! 3. `demand`: for each block the read covers, the `cache` answers ready, loading (wait for that
//!    one load: `cache::slot`) or absent (this thread loads exactly that block, on the stream's
//!    descriptor or a spare one, `spares`). A read inside one block is handed over straight from
//!    the cached block; one spanning blocks is joined once in a per-thread buffer.
//! 4. `prefetch`: meanwhile, on the I/O threads of the `pool`, each lane of the stream claims
//!    chunks of its pending blocks in order and loads each run of missing ones in one backing read
//!    on its own descriptor, publishing each block as it lands. A stream reading the re-served
//!    checkpoint file skips the blocks the kernel was already given whole through it (`delivered`).
//!    A loader faulting in a mapped checkpoint file at each tensor's start, in file order, has the
//!    read-around of its next faults fetched ahead, one job per run of blocks (`faults`).
//!
//! The mapped path ([`Engine::read_for_kernel`], `core`): a read whose reply only goes to the
//! kernel (a raw tensor through FUSE) of a source with a [`Mapping`](crate::source::Mapping) (a
//! file on a local filesystem, unless `EngineConfig::map_files` is off) takes steps 1 and 2 as
//! above, then skips 3: after the source's pin check it hands the caller the range as
//! [`KernelBytes`](crate::source::KernelBytes), the file and offset and a slice of the mapping,
//! which the FUSE adapter splices into the device (or passes to `writev`), so the kernel copies
//! straight from the file's page cache. The daemon drops its page-table entries for the mapping
//! every `mapped_resident_bytes` of replies. Reads that need the bytes in user space (the `.npy`
//! and F32 views, `stfs extract`) take the block path, step 3, for every source.
//!
//! A mapped source's streams, whichever path their reads take, never give their window to lanes
//! (step 4): the reading thread takes it in whole aligned 8 MiB chunks and queues one job per
//! chunk on the I/O threads, which read it into the page cache through the mapping
//! (`Mapping::read_ahead`: large folios, as a sequential `read` leaves them, where the kernel's
//! readahead advice would leave 4 KiB pages), counted as backing reads.
//!
//! The direct path ([`Engine::direct_reader`], `direct`): a caller that wants long runs of a
//! source's bytes in its own memory at once (the Python module's whole load) reads each piece of
//! them in one backing read straight into that memory, past the cache: one copy, no block
//! boundaries, nothing left in the cache. A source the disk tier keeps never takes it.
//!
//! Every load goes through `backing` (one read of whole blocks, counted), which asks the disk
//! tier (`disk`, with `--cache-dir`; a source it caches takes the block path, never the mapping)
//! first and fetches only the blocks it lacks (queued for the disk tier's writer thread). The disk
//! tier also keeps whole tensor files for FUSE passthrough ([`Engine::extent_opened`]). The cache's budget
//! counts blocks being loaded and spare buffers, and `cache::warm` keeps a few spares faulted in.
//! `descriptors` bounds how many sources keep descriptors open at once (the least recently read
//! close theirs). `shared` holds what the jobs share, `tuning` every constant with its reason,
//! `error` the [`ReadError`] a failed read returns.

mod backing;
pub mod cache;
mod core;
mod delivered;
mod demand;
mod descriptors;
mod direct;
pub mod disk;
mod error;
mod faults;
mod pool;
mod prefetch;
pub mod readahead;
mod shared;
mod spares;
mod stream;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
pub mod tuning;

pub use self::core::Engine;
pub use direct::{cut_run, DirectReader, RunPiece};
pub use error::ReadError;
pub use readahead::ReadaheadConfig;
pub use tuning::{EngineConfig, MIN_PREFETCH_CHUNK_BYTES, PREFETCH_CHUNK_BYTES};

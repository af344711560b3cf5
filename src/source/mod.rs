//! Backing sources: where tensor bytes come from (a local file, an HTTP(S) object), read at absolute
//! offsets.
//!
//! A [`Source`] is one immutable byte string pinned at open time. Each reader asks it for a
//! [`SourceReader`], its own descriptor (or connection), so that every stream the block engine runs
//! looks sequential to the storage below. A reader refuses to read once the source has changed.
//!
//! This file holds the two traits and the helpers their implementations share; `local` holds
//! [`LocalFile`], `mapped` the [`Mapping`] a local file offers for replies only the kernel reads,
//! [`http`] the remote source, [`object`] the object stores (`s3://`, `gs://`) read through it,
//! `resident` whether a local file's pages are in the page cache, and `regular` the opening and
//! bounded reading of a regular file that never waits on a FIFO.

use std::io;
use std::sync::Arc;

pub mod http;
pub mod hub;
mod local;
mod mapped;
pub mod object;
mod regular;
pub mod resident;

pub use local::{on_remote_filesystem, LocalFile, LOCAL_PIECE_BYTES};
pub use mapped::{KernelBytes, Mapping};
pub use regular::{open_regular, open_regular_nofollow, read_at_most, read_regular};

/// Identifies a source among those one engine reads (an index into its table).
pub type SourceId = usize;

/// One immutable backing object (a local file, or a remote object), pinned when it was opened.
pub trait Source: Send + Sync + 'static {
    /// Length in bytes, as pinned at open time.
    fn len(&self) -> u64;
    /// Whether the source holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The path or URL, for messages and logs (never contains credentials).
    fn name(&self) -> &str;
    /// Opens a new independent reader with its own descriptor or connection.
    fn open_reader(&self) -> io::Result<Box<dyn SourceReader>>;
    /// Like [`Source::open_reader`], for a reader that reads long ranges whole, each from its
    /// start to its end (the engine's direct reads): a local file's may then let the kernel read
    /// ahead within them, where a block reader's may not. The default: [`Source::open_reader`].
    fn open_streaming_reader(&self) -> io::Result<Box<dyn SourceReader>> {
        self.open_reader()
    }
    /// Whether the source offers a [`Source::mapping`] (found when it was opened, without mapping
    /// it). False (the default): read only through [`SourceReader`]s, into blocks (a remote
    /// object, or a file on a network filesystem).
    fn mappable(&self) -> bool {
        false
    }
    /// The whole source mapped read-only, for replies the kernel copies straight from its page
    /// cache ([`Mapping::to_kernel`] checks the pin first): mapped at the first call, kept until
    /// [`Source::close_idle`]. `None` if the source is not [`Source::mappable`] or cannot be mapped
    /// now.
    fn mapping(&self) -> Option<Arc<Mapping>> {
        None
    }
    /// Closes what the source itself keeps open (a local file's mapping and its descriptor) until
    /// its next use: the engine calls it for sources nobody has read for a while, so a mount of
    /// many shards keeps a bounded number of descriptors. Nothing (the default) for a source that
    /// keeps nothing open between reads.
    fn close_idle(&self) {}
    /// A new descriptor on the backing file itself, checked unchanged against the pin now, for
    /// the kernel to read directly (FUSE passthrough of a re-served checkpoint file: offset N of
    /// the served file is offset N of this one). `None` (the default) for a source that is not a
    /// file on a local filesystem, or a file that is no longer the pinned one.
    fn pinned_file(&self) -> Option<std::fs::File> {
        None
    }
    /// Whether every read is a request to a store with per-request latency (HTTP, object stores):
    /// the engine then keeps a larger readahead window in flight. False (the default): a file.
    fn remote(&self) -> bool {
        false
    }
    /// When the object was last modified, if known (for the mount's timestamps).
    fn modified(&self) -> Option<std::time::SystemTime> {
        None
    }
    /// The source's first bytes, already fetched when it was opened and kept (an HTTP source's
    /// opening request: the header, and in most checkpoints a first few small tensors). The engine
    /// answers a read that lies inside them from them, with no block load. Empty (the default): a
    /// source that keeps nothing.
    fn opening_bytes(&self) -> &[u8] {
        &[]
    }
    /// What names these exact bytes across processes and restarts, for the disk cache
    /// (`--cache-dir`): a text that changes whenever the object's bytes may have (a local file's
    /// device, inode, size, mtime and ctime; a URL with its ETag or Last-Modified and size). Blocks
    /// are stored under a hash of it, so it is never shown and may hold a signed URL. `None` (the
    /// default) means "not cacheable": the source is always read from its store.
    fn cache_identity(&self) -> Option<String> {
        None
    }
}

/// One reader of a [`Source`]: its own file descriptor (or connection), so its reads stay in order.
pub trait SourceReader: Send {
    /// Fills `buf` from `offset`. Fails with an error if the range is past the pinned length, if the
    /// backing object has changed since it was pinned, or on any I/O error.
    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Fills `bufs` one after the other from `offset`, as *one* backing read of their total length
    /// (the engine coalesces neighbouring blocks this way). The default reads into one joined
    /// buffer and copies out; sources with a scatter read (preadv) override it.
    fn read_vectored_exact_at(&mut self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        read_joined(self, bufs, offset)
    }

    /// Like [`SourceReader::read_vectored_exact_at`] over `bufs` (one backing read, or consecutive
    /// pieces of it on this descriptor), but hands each buffer to `landed`, in order, as soon as it
    /// is full, so the front of a long read can be used before its end arrives. On an error, the
    /// buffers not yet handed out are dropped. The default hands them all out at the end.
    fn read_blocks_at(&mut self, bufs: Vec<Vec<u8>>, offset: u64, landed: &mut dyn FnMut(Vec<u8>)) -> io::Result<()> {
        read_in_pieces(self, bufs, offset, usize::MAX, landed)
    }
}

/// Fills `bufs` from one read of their joined length, copied out (a single buffer is read into
/// directly): for streams without a scatter read.
pub fn read_joined<S: SourceReader + ?Sized>(stream: &mut S, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
    if let [only] = bufs {
        return stream.read_exact_at(only, offset);
    }
    let mut joined = vec![0; bufs.iter().map(|b| b.len()).sum()];
    stream.read_exact_at(&mut joined, offset)?;
    let mut rest = joined.as_slice();
    for buf in bufs.iter_mut() {
        let (head, tail) = rest.split_at(buf.len());
        buf.copy_from_slice(head);
        rest = tail;
    }
    Ok(())
}

/// [`SourceReader::read_blocks_at`] in consecutive vectored reads of whole buffers, each of at most
/// `piece_bytes` (or one buffer, if that is longer), handing each piece's buffers out as it lands.
pub fn read_in_pieces<S: SourceReader + ?Sized>(
    stream: &mut S,
    bufs: Vec<Vec<u8>>,
    offset: u64,
    piece_bytes: usize,
    landed: &mut dyn FnMut(Vec<u8>),
) -> io::Result<()> {
    let (mut at, mut bufs) = (offset, bufs.into_iter().peekable());
    while let Some(first) = bufs.next() {
        let mut piece = vec![first];
        let mut bytes = piece[0].len();
        while let Some(next) = bufs.next_if(|b| bytes + b.len() <= piece_bytes) {
            bytes += next.len();
            piece.push(next);
        }
        let mut slices: Vec<&mut [u8]> = piece.iter_mut().map(Vec::as_mut_slice).collect();
        stream.read_vectored_exact_at(&mut slices, at)?;
        at += bytes as u64;
        piece.into_iter().for_each(&mut *landed);
    }
    Ok(())
}

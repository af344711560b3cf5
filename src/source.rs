//! Backing sources: where tensor bytes come from (a local file; later a URL), read at absolute offsets.
//!
//! A [`Source`] is one immutable byte string pinned at open time. Each reader asks it for a
//! [`SourceStream`], its own descriptor (or connection), so that every stream the block engine runs
//! looks sequential to the storage below. A stream refuses to read once the source has changed.

use std::io;

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
    fn open_stream(&self) -> io::Result<Box<dyn SourceStream>>;
}

/// One reader of a [`Source`]: its own file descriptor (or connection), so its reads stay in order.
pub trait SourceStream: Send {
    /// Fills `buf` from `offset`. Fails with an error if the range is past the pinned length, if the
    /// backing object has changed since it was pinned, or on any I/O error.
    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// A local file pinned by identity (device, inode, size, mtime) when opened.
pub struct LocalFile {
    _private: (),
}

impl LocalFile {
    /// Opens `path` and records its identity. Fails for anything that is not a readable regular file.
    pub fn open(path: &std::path::Path) -> io::Result<LocalFile> {
        let _ = path;
        todo!()
    }

    /// The backing file's modification time (for the mount's attributes).
    pub fn mtime(&self) -> std::time::SystemTime {
        todo!()
    }
}

impl Source for LocalFile {
    fn len(&self) -> u64 {
        todo!()
    }
    fn name(&self) -> &str {
        todo!()
    }
    fn open_stream(&self) -> io::Result<Box<dyn SourceStream>> {
        todo!()
    }
}

//! Opening and reading a regular file without ever waiting on something else: a FIFO or a
//! device is refused before it is opened, and on the opened descriptor if the path became one in
//! between (opened `O_NONBLOCK`), and a whole-file read is bounded.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `path` opened for reading, with its metadata, if it is a regular file (links followed); anything
/// else is refused as [`check_regular`] words it, and never left open: a FIFO is refused before it
/// is opened (opening one read-only waits for a writer), and opened without waiting if the path
/// became one in between.
pub fn open_regular(path: &Path) -> io::Result<(File, Metadata)> {
    check_regular(&std::fs::metadata(path)?)?;
    open_checked(path, 0)
}

/// [`open_regular`] for a path already resolved (no link in it): its last component is not
/// followed if it became a link since (`O_NOFOLLOW`: "too many levels of symbolic links"), and it
/// is checked by [`std::fs::symlink_metadata`] before it is opened, so nothing that is not a
/// regular file is ever opened.
pub fn open_regular_nofollow(path: &Path) -> io::Result<(File, Metadata)> {
    check_regular(&std::fs::symlink_metadata(path)?)?;
    open_checked(path, libc::O_NOFOLLOW)
}

/// `path` opened for reading without waiting (`flags` added), and refused unless the descriptor
/// is a regular file: the type is checked on the opened file itself, not only on the path.
fn open_checked(path: &Path, flags: libc::c_int) -> io::Result<(File, Metadata)> {
    let flags = libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | flags;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path)?;
    let meta = file.metadata()?;
    check_regular(&meta)?;
    // A regular file: its reads block as any file's do (the flag only served the open).
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: plain fcntl calls on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) & !libc::O_NONBLOCK) };
    Ok((file, meta))
}

/// The bytes of the regular file at `path` (a FIFO, a device or a directory refused without
/// blocking, as [`open_regular`] does), at most `limit` of them: a longer file is an error, never
/// a read without end. For the small files stfs reads whole (a token, a CA bundle).
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, meta) = open_regular(path)?;
    read_at_most(&file, &meta, limit)
}

/// The whole of `file` (a regular file opened by [`open_regular`] or [`open_regular_nofollow`],
/// `meta` its metadata), if it holds at most `limit` bytes: one longer, by its length or by what
/// the read finds (it may grow while it is read), is an error, and never more than `limit + 1`
/// bytes are read.
pub fn read_at_most(file: &File, meta: &Metadata, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let too_large = || io::Error::new(io::ErrorKind::InvalidData, format!("is larger than {limit} bytes"));
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Refuses anything but a regular file (errors do not repeat the path: the caller names it).
fn check_regular(meta: &Metadata) -> io::Result<()> {
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() { "is a directory" } else { "is not a regular file" };
    Err(io::Error::new(io::ErrorKind::InvalidInput, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_regular_takes_a_small_regular_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let (small, fifo) = (dir.path().join("token"), dir.path().join("fifo"));
        crate::util::test_support::write_new(&small, b"hf_abc\n");
        assert_eq!(read_regular(&small, 7).unwrap(), b"hf_abc\n");
        assert!(read_regular(&small, 6).unwrap_err().to_string().contains("larger than 6 bytes"));
        crate::util::test_support::make_fifo(&fifo);
        assert_eq!(read_regular(&fifo, 100).unwrap_err().to_string(), "is not a regular file");
        assert_eq!(read_regular(Path::new("/dev/zero"), 100).unwrap_err().to_string(), "is not a regular file");
        // A resolved path is not followed again if it became a link.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&small, &link).unwrap();
        assert!(open_regular(&link).is_ok());
        assert_eq!(open_regular_nofollow(&link).unwrap_err().to_string(), "is not a regular file");
        let (file, meta) = open_regular_nofollow(&small).unwrap();
        assert_eq!(read_at_most(&file, &meta, 7).unwrap(), b"hf_abc\n");
    }
}

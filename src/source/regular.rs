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

/// [`open_regular`] for a path already resolved (no link in it): no component of it is followed
/// if it became a link since (`openat2` with `RESOLVE_NO_SYMLINKS`; where the kernel or a sandbox
/// refuses that call, the last component only, by `O_NOFOLLOW`): "too many levels of symbolic
/// links". It is checked by [`std::fs::symlink_metadata`] before it is opened, so nothing that is
/// not a regular file is ever opened.
pub fn open_regular_nofollow(path: &Path) -> io::Result<(File, Metadata)> {
    check_regular(&std::fs::symlink_metadata(path)?)?;
    let flags = libc::O_NOFOLLOW | OPEN_FLAGS;
    let file = match open_resolving_no_links(path, flags) {
        Some(opened) => opened?,
        None => std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path)?,
    };
    checked_regular(file)
}

/// Every open here: read-only, without waiting (a FIFO), never a controlling terminal.
const OPEN_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

/// `path` opened with `flags` by `openat2` with `RESOLVE_NO_SYMLINKS` (a link anywhere in it,
/// placed there since it was resolved, is `ELOOP`); `None` where the call itself is refused (a
/// kernel before 5.6: `ENOSYS`; a seccomp filter: `EPERM`; a flag it does not know: `EINVAL`,
/// `E2BIG`), for the caller to open the older way.
fn open_resolving_no_links(path: &Path, flags: libc::c_int) -> Option<io::Result<File>> {
    use std::os::fd::FromRawFd;
    let c_path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).ok()?;
    // SAFETY: open_how is plain old data; all-zero is its valid default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads a NUL-terminated path and an open_how of the size given.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, c_path.as_ptr(), &how, std::mem::size_of::<libc::open_how>())
    };
    if fd >= 0 {
        // SAFETY: a descriptor the call just opened, owned by nothing else.
        return Some(Ok(unsafe { File::from_raw_fd(fd as libc::c_int) }));
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::E2BIG) => None,
        _ => Some(Err(error)),
    }
}

/// `path` opened for reading without waiting (`flags` added), and refused unless the descriptor
/// is a regular file: the type is checked on the opened file itself, not only on the path.
fn open_checked(path: &Path, flags: libc::c_int) -> io::Result<(File, Metadata)> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(OPEN_FLAGS | flags).open(path)?;
    checked_regular(file)
}

/// `file` with its metadata if it is a regular file, made blocking again; refused otherwise.
fn checked_regular(file: File) -> io::Result<(File, Metadata)> {
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

    /// A folder of a resolved path swapped for a link after it was resolved (the race a writer of
    /// a model folder could run) is not followed: `openat2` refuses a link anywhere in the path,
    /// not only in its last component.
    #[test]
    fn a_link_anywhere_in_a_resolved_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (real, elsewhere) = (dir.path().join("real"), dir.path().join("elsewhere"));
        std::fs::create_dir(&real).unwrap();
        std::fs::create_dir(&elsewhere).unwrap();
        crate::util::test_support::write_new(&real.join("config.json"), b"inside");
        crate::util::test_support::write_new(&elsewhere.join("config.json"), b"outside");
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        // The last component is a real file, so O_NOFOLLOW alone would follow `linked`.
        let path = linked.join("config.json");
        match open_resolving_no_links(&path, OPEN_FLAGS) {
            None if std::env::var("CI").as_deref() == Ok("true") => panic!("openat2 refused on a CI machine"),
            None => eprintln!("openat2 refused here: the fallback checks the last component only"),
            Some(opened) => assert_eq!(opened.unwrap_err().raw_os_error(), Some(libc::ELOOP)),
        }
        let (file, meta) = open_regular_nofollow(&real.join("config.json")).unwrap();
        assert_eq!(read_at_most(&file, &meta, 100).unwrap(), b"inside");
    }
}

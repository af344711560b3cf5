//! A local file as a source: pinned by its identity at open, checked before and after every read
//! (bytes read while the file changed are an error, never data), read with `pread`/`preadv` on a
//! descriptor per stream, and (on a local filesystem) mapped, so the engine can reply from its page
//! cache with no copy in user space ([`Mapping`]). Opening pins the file and keeps no descriptor:
//! the mapping and every stream's descriptor are opened when first used (a checkpoint of a thousand
//! shards mounts with none open), and the mapping is closed again by [`Source::close_idle`].

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::mapped::Mapping;
use super::regular::open_regular_nofollow;
use super::{read_in_pieces, Source, SourceReader};
use crate::util::lock;

/// How much of a long read a local file stream reads per `preadv` in
/// [`SourceReader::read_blocks_at`]: the next piece continues where the previous one ended (the
/// storage still sees one sequential stream), and each lands for readers as soon as it is read.
pub const LOCAL_PIECE_BYTES: usize = 1 << 20;

/// What pins a local file: which inode it is, and the size, mtime and ctime it had when opened.
/// The ctime matters because anyone who can write the file can also set its mtime back (`cp -p`,
/// `touch -r`, rsync) but nobody can set the ctime; it also moves on chmod, chown and link, which
/// then count as changes too (a safe failure: EIO, never stale bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_sec: i64,
    mtime_nsec: i64,
    ctime_sec: i64,
    ctime_nsec: i64,
}

impl Identity {
    fn of(meta: &Metadata) -> Identity {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_sec: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
            ctime_sec: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

/// A local file pinned by identity (device, inode, size, mtime, ctime) when opened.
pub struct LocalFile {
    /// The path every later descriptor is opened by: the file's canonical path as it was opened
    /// (no link in it), opened again without following a link ([`open_regular_nofollow`]).
    real: PathBuf,
    name: String,
    pinned: Identity,
    /// The file's `st_mode`, from the descriptor it was pinned by.
    mode: u32,
    /// Whether the file is worth mapping: not empty, and not on a network or FUSE filesystem
    /// ([`mappable`]), as found at open.
    mappable: bool,
    /// The whole file mapped, once a reply has wanted it; dropped (with its descriptor) by
    /// [`Source::close_idle`], mapped again at the next use.
    mapping: Mutex<Option<Arc<Mapping>>>,
}

impl LocalFile {
    /// A reader on a new descriptor of the pinned file, its readahead advised with `advice`
    /// (advice only: a failure changes nothing but speed).
    fn open_advised(&self, advice: libc::c_int, announce: bool) -> io::Result<Box<dyn SourceReader>> {
        let file = self.open_pinned()?;
        // SAFETY: plain syscall on a descriptor we own.
        unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, advice) };
        Ok(Box::new(LocalStream { file, path: self.real.clone(), pinned: self.pinned, announce }))
    }

    /// Opens `path` (resolved once, here), records its identity and closes it again. Fails for
    /// anything that is not a readable regular file.
    pub fn open(path: &Path) -> io::Result<LocalFile> {
        let real = std::fs::canonicalize(path)?;
        let (file, meta) = open_regular_nofollow(&real)?;
        Ok(LocalFile::pin(path, &real, &file, &meta))
    }

    /// The regular file `file` (with its metadata `meta`, both taken from the descriptor), named
    /// `path` and pinned as the file at `real`, the canonical path it was opened by: every later
    /// descriptor is opened by `real`, never following a link (a link put at `path` or anywhere
    /// in `real` since is not followed, so nothing else is ever opened: not a device, not a FIFO,
    /// not a hung network path) and must be this very file, unchanged. For a file whose opening
    /// was checked by a rule of the caller's (a model folder's link rule), so the file pinned and
    /// reopened is the one the rule allowed.
    pub fn pin(path: &Path, real: &Path, file: &File, meta: &Metadata) -> LocalFile {
        let name = path.to_string_lossy().into_owned();
        let pinned = Identity::of(meta);
        let mappable = pinned.size > 0 && mappable(file);
        let mode = meta.mode();
        LocalFile { real: real.to_path_buf(), name, pinned, mode, mappable, mapping: Mutex::new(None) }
    }

    /// The file's `st_mode` as pinned (from its descriptor, not by its path).
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// A new descriptor on the pinned file: fails if its canonical path no longer names it
    /// unchanged. Opened by [`open_regular_nofollow`]: checked by `lstat` first (something not a
    /// regular file, a link included, is never opened: no device's open runs, no FIFO or hung
    /// link target is waited on), no link followed, without waiting, its type checked on the
    /// descriptor; the read then fails with EIO.
    fn open_pinned(&self) -> io::Result<File> {
        let (file, _) = open_regular_nofollow(&self.real).map_err(|e| {
            let refused = e.kind() == io::ErrorKind::InvalidInput || e.raw_os_error() == Some(libc::ELOOP);
            if refused {
                changed("the path now names something that is not a regular file".into())
            } else {
                e
            }
        })?;
        check_unchanged(&file, &self.real, self.pinned)?;
        Ok(file)
    }

    /// The backing file's modification time (for the mount's attributes).
    pub fn mtime(&self) -> SystemTime {
        let nanos = u32::try_from(self.pinned.mtime_nsec).unwrap_or(0);
        match u64::try_from(self.pinned.mtime_sec) {
            Ok(secs) => UNIX_EPOCH + Duration::new(secs, nanos),
            // Before 1970: mtime_sec is negative and mtime_nsec counts forward from it.
            Err(_) => {
                UNIX_EPOCH - Duration::from_secs(self.pinned.mtime_sec.unsigned_abs())
                    + Duration::from_nanos(u64::from(nanos))
            }
        }
    }
}

impl Source for LocalFile {
    fn modified(&self) -> Option<SystemTime> {
        Some(self.mtime())
    }
    fn len(&self) -> u64 {
        self.pinned.size
    }

    /// Device, inode, size, mtime and ctime (nanoseconds): what pins the file, so an in-place
    /// rewrite with its mtime set back still changes the identity (the ctime moves).
    fn cache_identity(&self) -> Option<String> {
        let p = &self.pinned;
        Some(format!(
            "file:dev={}:ino={}:size={}:mtime={}.{:09}:ctime={}.{:09}",
            p.dev, p.ino, p.size, p.mtime_sec, p.mtime_nsec, p.ctime_sec, p.ctime_nsec
        ))
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn mappable(&self) -> bool {
        self.mappable
    }

    /// Maps the file at its first use (and again after [`Source::close_idle`]); `None` if it is not
    /// [`mappable`](Source::mappable), no longer the pinned file, or `mmap` fails: the reads then
    /// take the block path, whose check reports the change.
    fn mapping(&self) -> Option<Arc<Mapping>> {
        if !self.mappable {
            return None;
        }
        if let Some(mapping) = lock(&self.mapping).as_ref() {
            return Some(Arc::clone(mapping));
        }
        // Opened and mapped without the lock held: a slow open (a network filesystem) holds up
        // no other reader; of two mapping at once, the first stored is kept.
        let file = self.open_pinned().map_err(|e| log::debug!("{}: not mapped: {e}", self.name)).ok()?;
        let (path, pinned) = (self.real.clone(), self.pinned);
        let check = Box::new(move |file: &File| check_unchanged(file, &path, pinned));
        let mapping = Arc::new(Mapping::new(file, self.pinned.size, check)?);
        Some(Arc::clone(lock(&self.mapping).get_or_insert(mapping)))
    }

    /// Opened afresh (never the mapping's descriptor), so the identity is checked at this open:
    /// a file rewritten or replaced since the mount is refused here.
    fn pinned_file(&self) -> Option<File> {
        if !self.mappable {
            return None;
        }
        self.open_pinned().map_err(|e| log::debug!("{}: not handed to the kernel: {e}", self.name)).ok()
    }

    /// Drops the mapping: its descriptor closes once the replies using it are done.
    fn close_idle(&self) {
        lock(&self.mapping).take();
    }

    fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
        // The engine already reads whole blocks and prefetches on its own; kernel readahead on
        // top would read past what it asked for (on a network mount: bytes fetched twice or for
        // nothing).
        self.open_advised(libc::POSIX_FADV_RANDOM, false)
    }

    /// A direct read takes a long range whole: each read announces its range to the kernel first
    /// (`POSIX_FADV_WILLNEED`), which then has the requests for all of it in flight while the first
    /// ones are copied (on a FUSE or network filesystem, where each request waits a round trip),
    /// and nothing past it (the readahead stays off, as a block reader's).
    fn open_streaming_reader(&self) -> io::Result<Box<dyn SourceReader>> {
        self.open_advised(libc::POSIX_FADV_RANDOM, true)
    }
}

/// One descriptor on a [`LocalFile`]; checks the file is still the pinned one before every read,
/// and again after it: bytes read while a writer rewrote the file in place (same size, a block
/// mixing old and new bytes) are an error, never handed to the cache or the disk tier.
struct LocalStream {
    file: File,
    path: PathBuf,
    pinned: Identity,
    /// Whether each read announces its range to the kernel first (`POSIX_FADV_WILLNEED`).
    announce: bool,
}

impl LocalStream {
    fn check_unchanged(&self) -> io::Result<()> {
        check_unchanged(&self.file, &self.path, self.pinned)
    }
}

/// Whether `file` is the one `pinned` at `path`: one fstat of the descriptor (catches writes and
/// truncation) and one stat of the path (catches a rename over it or a delete). Two syscalls per
/// check (a piece of a block run, before and after it is read, or one FUSE request on the mapped
/// path) cost nothing visible. A write moves the ctime before its bytes land, so a check after a
/// read sees any write whose bytes the read may have picked up (on a network or FUSE filesystem,
/// as soon as its attributes are fresh: they are cached for up to its attribute timeout).
fn check_unchanged(file: &File, path: &Path, pinned: Identity) -> io::Result<()> {
    let ours = Identity::of(&file.metadata()?);
    if ours.dev != pinned.dev || ours.ino != pinned.ino {
        return Err(changed("the path was replaced before this descriptor was opened".into()));
    }
    if ours.size != pinned.size {
        return Err(changed(format!("size {} -> {}", pinned.size, ours.size)));
    }
    if (ours.mtime_sec, ours.mtime_nsec) != (pinned.mtime_sec, pinned.mtime_nsec) {
        return Err(changed("modification time changed".into()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(now) if now.dev() == pinned.dev && now.ino() == pinned.ino => {}
        Ok(_) => return Err(changed("the path now names a different file".into())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(changed("the file was deleted".into())),
        Err(e) => return Err(e),
    }
    // Checked last: deleting or renaming over the file moves it too, and those have their own,
    // more specific messages above.
    if (ours.ctime_sec, ours.ctime_nsec) != (pinned.ctime_sec, pinned.ctime_nsec) {
        return Err(changed("change time moved (rewritten, or its metadata changed)".into()));
    }
    Ok(())
}

/// Whether a file is worth serving from a mapping: yes on a local filesystem (its page cache is
/// the file's, and `POSIX_FADV_WILLNEED` makes the disk see large reads), no on a network or FUSE
/// filesystem. There the page cache is not ours to rely on (FUSE without `keep_cache` drops a
/// file's pages at every open, and stfs opens a descriptor per prefetch lane; NFS revalidates at
/// open), and the block path controls the size and order of every request the storage sees.
fn mappable(file: &File) -> bool {
    // SAFETY: fstatfs fills the struct we pass for a descriptor we own.
    statfs_kind(|st| unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(file), st) }).is_some_and(is_local_kind)
}

/// Whether `path` (a file or directory) is on a network or FUSE filesystem, whose storage serves
/// each request with latency (false if unknown).
pub fn on_remote_filesystem(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs fills the struct we pass; the path is a valid C string.
    statfs_kind(|st| unsafe { libc::statfs(c_path.as_ptr(), st) }).is_some_and(|kind| !is_local_kind(kind))
}

/// The filesystem type `call` reports into a `statfs` struct, if it succeeds.
fn statfs_kind(call: impl FnOnce(&mut libc::statfs) -> libc::c_int) -> Option<i64> {
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if call(&mut st) != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 on x86_64, other widths elsewhere
    Some(st.f_type as i64)
}

/// Whether a filesystem type (statfs `f_type`) is a local one: not a network or FUSE filesystem.
fn is_local_kind(kind: i64) -> bool {
    const NOT_LOCAL: &[i64] = &[
        0x6573_5546, // FUSE
        0x6969,      // NFS
        0x517B,      // SMB
        0xFF53_4D42, // CIFS
        0xFE53_4D42, // SMB2
        0x00C3_6400, // Ceph
        0x0102_1997, // 9P
        0x5346_414F, // AFS
        0x0BD0_0BD0, // Lustre
        0x0116_1970, // GFS2
        0x7461_636F, // OCFS2
    ];
    !NOT_LOCAL.contains(&kind)
}

impl LocalStream {
    /// Refuses a read of `len` bytes at `offset` past the pinned length, then checks the file.
    fn check_range(&self, len: usize, offset: u64) -> io::Result<()> {
        let end = u64::try_from(len).ok().and_then(|len| offset.checked_add(len));
        if end.is_none_or(|end| end > self.pinned.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read of {len} bytes at {offset} is past the pinned length {}", self.pinned.size),
            ));
        }
        self.check_unchanged()
    }
}

impl SourceReader for LocalStream {
    /// Pieces of about [`LOCAL_PIECE_BYTES`] (whole buffers), one `preadv` each, front to back.
    fn read_blocks_at(&mut self, bufs: Vec<Vec<u8>>, offset: u64, landed: &mut dyn FnMut(Vec<u8>)) -> io::Result<()> {
        read_in_pieces(self, bufs, offset, LOCAL_PIECE_BYTES, landed)
    }

    /// One preadv per call (repeated only after a short read), straight into the block buffers.
    fn read_vectored_exact_at(&mut self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.check_range(total, offset)?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.file);
        if self.announce {
            if let (Ok(at), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(total)) {
                // SAFETY: plain syscall on a descriptor we own; advice only.
                unsafe { libc::posix_fadvise(fd, at, len, libc::POSIX_FADV_WILLNEED) };
            }
        }
        // (index of the first unfilled buffer, bytes of it already filled)
        let (mut index, mut filled, mut done) = (0, 0, 0usize);
        while done < total {
            let iov: Vec<libc::iovec> = bufs
                .iter_mut()
                .skip(index)
                .take(1024) // IOV_MAX
                .enumerate()
                .map(|(i, b)| {
                    let skip = if i == 0 { filled } else { 0 };
                    let rest = &mut b[skip..];
                    libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() }
                })
                .collect();
            let at = offset
                .checked_add(done as u64)
                .and_then(|at| libc::off_t::try_from(at).ok())
                .ok_or_else(|| io::Error::other("offset out of range"))?;
            // SAFETY: every iovec points into a live, exclusively borrowed buffer of `bufs`, with its
            // exact remaining length; the kernel writes at most that many bytes into each.
            let n = unsafe { libc::preadv(fd, iov.as_ptr(), iov.len() as libc::c_int, at) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(changed("the file ended early".into()));
            }
            let mut n = n as usize;
            done += n;
            while n > 0 {
                let left = bufs[index].len() - filled;
                if n < left {
                    filled += n;
                    n = 0;
                } else {
                    n -= left;
                    index += 1;
                    filled = 0;
                }
            }
            while index < bufs.len() && bufs[index].len() == filled {
                index += 1;
            }
        }
        // Checked again after the read: a rewrite in place during it may have mixed versions.
        self.check_unchanged()
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(buf.len(), offset)?;
        // std's read_exact_at already retries EINTR; a short file here means it shrank under us.
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                changed("the file ended early".into())
            } else {
                e
            }
        })?;
        // Checked again after the read: a rewrite in place during it may have mixed versions.
        self.check_unchanged()
    }
}

fn changed(what: String) -> io::Error {
    io::Error::other(format!("backing file changed since mount ({what})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn read(source: &LocalFile, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        source.open_reader()?.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    #[test]
    fn reads_pinned_bytes_and_reports_identity() {
        let (_dir, path) = file_with(b"0123456789");
        let file = LocalFile::open(&path).unwrap();
        assert_eq!(file.len(), 10);
        assert_eq!(file.name(), path.to_string_lossy());
        assert_eq!(file.mtime(), std::fs::metadata(&path).unwrap().modified().unwrap());
        assert_eq!(read(&file, 3, 4).unwrap(), b"3456");
        assert_eq!(read(&file, 0, 10).unwrap(), b"0123456789");
    }

    /// Descriptors of this process open on `path`.
    fn descriptors_on(path: &Path) -> usize {
        let entries = std::fs::read_dir("/proc/self/fd").unwrap().flatten();
        entries.filter(|e| std::fs::read_link(e.path()).is_ok_and(|target| target == path)).count()
    }

    #[test]
    fn opening_keeps_no_descriptor_and_an_idle_mapping_closes_its_own() {
        let (_dir, path) = file_with(&[7; 4096]);
        let file = LocalFile::open(&path).unwrap();
        assert_eq!(descriptors_on(&path), 0, "pinned, and closed again");
        assert_eq!(read(&file, 0, 10).unwrap(), [7; 10]);
        assert_eq!(descriptors_on(&path), 0, "a reader's descriptor closes with it");
        assert!(file.mappable(), "a file on a local filesystem can be mapped");
        let mapping = file.mapping().unwrap();
        assert!(Arc::ptr_eq(&mapping, &file.mapping().unwrap()), "mapped once");
        assert_eq!(descriptors_on(&path), 1);
        file.close_idle();
        assert_eq!(descriptors_on(&path), 1, "a reply still using the mapping keeps it");
        drop(mapping);
        assert_eq!(descriptors_on(&path), 0);
        assert!(file.mapping().is_some(), "mapped again at the next use");
        // A file changed since it was pinned is not mapped again: its reads take the block path,
        // whose check says what changed.
        file.close_idle();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(10).unwrap();
        assert!(file.mapping().is_none());
        assert_eq!(descriptors_on(&path), 0);
    }

    #[test]
    fn vectored_reads_fill_each_buffer_in_turn() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let (_dir, path) = file_with(&bytes);
        let file = LocalFile::open(&path).unwrap();
        let mut stream = file.open_reader().unwrap();
        let (mut a, mut b, mut c) = (vec![0; 1000], vec![0; 0], vec![0; 2500]);
        stream.read_vectored_exact_at(&mut [&mut a, &mut b, &mut c], 1500).unwrap();
        assert_eq!((&a[..], &c[..]), (&bytes[1500..2500], &bytes[2500..5000]));
        let err = stream.read_vectored_exact_at(&mut [&mut a, &mut c], 2000).unwrap_err();
        assert!(err.to_string().contains("past the pinned length"), "{err}");
    }

    #[test]
    fn block_reads_land_in_order_in_pieces_of_whole_buffers() {
        let bytes: Vec<u8> = (0..3 * LOCAL_PIECE_BYTES + 5000).map(|i| (i % 253) as u8).collect();
        let (_dir, path) = file_with(&bytes);
        let file = LocalFile::open(&path).unwrap();
        let mut stream = file.open_reader().unwrap();
        let sizes = [LOCAL_PIECE_BYTES / 2, LOCAL_PIECE_BYTES, 0, 7, LOCAL_PIECE_BYTES + 3, 4990];
        let bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        let mut landed = Vec::new();
        stream.read_blocks_at(bufs, 10, &mut |b| landed.push(b)).unwrap();
        assert_eq!(landed.iter().map(Vec::len).collect::<Vec<_>>(), sizes);
        assert_eq!(landed.concat(), &bytes[10..10 + sizes.iter().sum::<usize>()]);
        // Past the end: an error, and only the buffers before the failing piece were handed out.
        let mut count = 0;
        let bufs = vec![vec![0; LOCAL_PIECE_BYTES], vec![0; LOCAL_PIECE_BYTES], vec![0; 2 * LOCAL_PIECE_BYTES]];
        assert!(stream.read_blocks_at(bufs, 0, &mut |_| count += 1).is_err());
        assert_eq!(count, 2);
    }

    #[test]
    fn refuses_directories_and_missing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let err = LocalFile::open(dir.path()).err().unwrap();
        assert!(err.to_string().contains("is a directory"), "{err}");
        let err = LocalFile::open(&dir.path().join("nope")).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn refuses_reads_past_the_pinned_length() {
        let (_dir, path) = file_with(b"0123456789");
        let file = LocalFile::open(&path).unwrap();
        let err = read(&file, 8, 3).unwrap_err();
        assert!(err.to_string().contains("past the pinned length"), "{err}");
        assert!(read(&file, u64::MAX, 1).is_err());
    }

    #[test]
    fn truncation_after_open_fails_reads() {
        let (_dir, path) = file_with(&[7; 100]);
        let file = LocalFile::open(&path).unwrap();
        let mut stream = file.open_reader().unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(50).unwrap();
        let err = stream.read_exact_at(&mut [0; 10], 0).unwrap_err();
        assert!(err.to_string().contains("size 100 -> 50"), "{err}");
        assert!(file.open_reader().is_err());
    }

    #[test]
    fn rewrite_in_place_fails_reads() {
        let (_dir, path) = file_with(&[7; 100]);
        let file = LocalFile::open(&path).unwrap();
        let mut stream = file.open_reader().unwrap();
        let mut handle = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        handle.write_all(&[8; 10]).unwrap();
        // Same size; force an mtime that differs even on filesystems with coarse timestamps.
        handle.set_modified(UNIX_EPOCH + Duration::from_secs(1_000_000)).unwrap();
        let err = stream.read_exact_at(&mut [0; 10], 0).unwrap_err();
        assert!(err.to_string().contains("modification time changed"), "{err}");
    }

    #[test]
    fn replacement_by_rename_fails_reads() {
        let (dir, path) = file_with(&[7; 100]);
        let file = LocalFile::open(&path).unwrap();
        let mut stream = file.open_reader().unwrap();
        let other = dir.path().join("new");
        std::fs::write(&other, [9; 100]).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let err = stream.read_exact_at(&mut [0; 10], 0).unwrap_err();
        assert!(err.to_string().contains("different file"), "{err}");
        let err = file.open_reader().err().unwrap();
        assert!(err.to_string().contains("replaced"), "{err}");
    }

    /// A file pinned through a link is reopened by the path it resolved to, never by the link: the
    /// link pointed elsewhere after the open (a FIFO, a device) is never opened, and the pinned
    /// file is still read; its own path made a link is refused without being followed.
    #[test]
    fn a_link_swapped_after_the_open_is_never_followed() {
        let (dir, real) = file_with(b"0123456789");
        let (outside, link) = (tempfile::tempdir().unwrap(), dir.path().join("linked.safetensors"));
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let file = LocalFile::open(&link).unwrap();
        assert_eq!(file.name(), link.to_string_lossy());
        let watch = crate::util::test_support::FifoWatch::new(&outside.path().join("fifo"));
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&watch.fifo, &link).unwrap();
        assert_eq!(read(&file, 0, 10).unwrap(), b"0123456789", "the pinned file, by its own path");
        assert!(file.mapping().is_some() && file.pinned_file().is_some());
        assert!(!watch.opened(), "the link's new target was opened");
        // The resolved path itself made a link to the FIFO: refused, the FIFO untouched.
        file.close_idle();
        std::fs::rename(&real, dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&watch.fifo, &real).unwrap();
        let err = file.open_reader().err().unwrap();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(file.mapping().is_none() && file.pinned_file().is_none());
        assert!(!watch.opened(), "the resolved path was followed");
    }

    #[test]
    fn deletion_fails_reads() {
        let (_dir, path) = file_with(&[7; 100]);
        let file = LocalFile::open(&path).unwrap();
        let mut stream = file.open_reader().unwrap();
        std::fs::remove_file(&path).unwrap();
        let err = stream.read_exact_at(&mut [0; 10], 0).unwrap_err();
        assert!(err.to_string().contains("deleted"), "{err}");
    }
}

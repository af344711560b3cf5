//! Read replies spliced from a local file into the FUSE device. The reply header is written into a
//! pipe, the file's pages are spliced in after it (page references, no copy), and the pipe is
//! spliced into `/dev/fuse`, where the kernel copies the pages once, into the reader's page cache.
//! Against `writev` from the file's mapping, the daemon never faults the mapping's page tables in
//! and never has to drop them again (docs/notes/benchmarks.md has the measurements).
//!
//! The kernel takes a spliced reply only whole: the header and all the data must sit in the pipe
//! at once. Each FUSE thread keeps one pipe of a power of two of page slots ([`Sizes`]: 256,
//! which `/proc/sys/fs/pipe-max-size` allows without privilege, up to 4,096 for root where
//! `fs.fuse.max_pages_limit` lets requests grow to 16 MiB), and the mount asks the kernel for reads
//! of two pages less: their data covers at most one page less than the pipe at any file offset,
//! and the header takes the last slot.
//!
//! A pipe holds page references only while a reply passes through it, but the kernel charges its
//! 256 slots to the user (`/proc/sys/fs/pipe-user-pages-soft`, 16384 pages by default, which root
//! with CAP_SYS_ADMIN is exempt from): a user whose pipes are over it gets no pipe of this size,
//! and that thread then copies its replies instead.
//!
//! A reply must go to the descriptor its request was read from (the kernel looks the request up in
//! that descriptor's queue), so a session that splices runs its threads on one shared descriptor,
//! not per-thread clones, and [`Splicer`] writes to a duplicate of it.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Bytes of a pipe slot (and of a page: the kernel's `max_pages` counts these).
const PAGE: u32 = 4096;

/// The largest read request stfs can ask the kernel for (`--max-request-kb`): 16 MiB (4,096
/// pages), what fuser's `max_write` allows and gcsfuse uses; the kernel grants at most
/// `fs.fuse.max_pages_limit` pages.
pub const MAX_REQUEST_BYTES: u32 = 16 << 20;

/// The read request size a mount asks for and the splice pipe that carries one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Largest read the kernel will send (the granted `max_pages`, in bytes); for a splicing
    /// mount also its `max_write`, two pages less than the pipe.
    pub request_bytes: u32,
    /// Bytes of each FUSE thread's splice pipe (0: not splicing).
    pub pipe_bytes: usize,
}

/// The sizes for a mount that asks for requests of `asked_bytes` (at most [`MAX_REQUEST_BYTES`]):
/// the kernel grants `min(asked, limit_pages)` pages per request (`limit_pages`:
/// `fs.fuse.max_pages_limit`, or 32 on a kernel without `FUSE_MAX_PAGES`); a splicing mount asks
/// for no more than a pipe of at most `pipe_max` bytes carries (a power of two of pages, less two:
/// one for an unaligned read's extra page, one for the header).
pub fn sizes(splice: bool, asked_bytes: u32, limit_pages: u32, pipe_max: usize) -> Sizes {
    let asked_pages = (asked_bytes / PAGE).clamp(1, MAX_REQUEST_BYTES / PAGE);
    let granted = limit_pages.clamp(1, asked_pages);
    if !splice {
        return Sizes { request_bytes: granted * PAGE, pipe_bytes: 0 };
    }
    let most_slots = u32::try_from(pipe_max / PAGE as usize).unwrap_or(u32::MAX).max(4);
    let slots = granted.max(4).next_power_of_two().min(prev_power_of_two(most_slots));
    Sizes { request_bytes: granted.min(slots - 2) * PAGE, pipe_bytes: (slots * PAGE) as usize }
}

fn prev_power_of_two(n: u32) -> u32 {
    1 << (31 - n.leading_zeros())
}

/// `fs.fuse.max_pages_limit` (pages a request may span; a sysctl since Linux 6.13), or 256, the
/// fixed limit before it.
pub fn max_pages_limit() -> u32 {
    let text = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit").unwrap_or_default();
    text.trim().parse().unwrap_or(256)
}

/// The largest pipe this process may make: any size for root (`CAP_SYS_RESOURCE`), else
/// `/proc/sys/fs/pipe-max-size` (1 MiB by default).
pub fn pipe_max_bytes() -> usize {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return usize::MAX;
    }
    let text = std::fs::read_to_string("/proc/sys/fs/pipe-max-size").unwrap_or_default();
    text.trim().parse().unwrap_or(1 << 20)
}

/// The kernel readahead (in KiB) a splicing mount with reads of `read_bytes` uses for `kb`:
/// rounded down to whole reads, so that a readahead window is not split into full reads and a
/// short one (1024 KiB would be 1016 + 8). Below one read it is left alone.
pub fn readahead_in_whole_reads(kb: u32, read_bytes: u32) -> u32 {
    let read_kb = (read_bytes >> 10).max(1);
    if kb < read_kb {
        kb
    } else {
        kb / read_kb * read_kb
    }
}

/// Size of `struct fuse_out_header`: length, error, request id.
const HEADER_BYTES: usize = 16;

/// Writes spliced read replies to the session's FUSE device; see the module doc.
#[derive(Debug)]
pub struct Splicer {
    device: OwnedFd,
    /// Bytes of each thread's pipe ([`Sizes::pipe_bytes`]).
    pipe_bytes: usize,
}

/// What became of a spliced reply.
#[derive(Debug)]
pub enum Spliced {
    /// The reply is with the kernel (or its request was already gone: interrupted).
    Sent,
    /// Nothing was sent: this thread has no usable pipe, the reply does not fit, or the device
    /// refused it. The caller answers the ordinary way.
    NotSent,
    /// The file could not give the bytes: it ended early (it shrank after the pin check) or
    /// failed. Nothing was sent; the caller answers with an error.
    Failed(io::Error),
}

/// One FUSE thread's pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its size in bytes.
    bytes: usize,
}

/// A thread's pipe: not made yet, made, or refused (made once, and never retried on that thread).
enum PipeSlot {
    Unmade,
    Ready(Pipe),
    Refused,
}

thread_local! {
    static PIPE: RefCell<PipeSlot> = const { RefCell::new(PipeSlot::Unmade) };
}

impl Splicer {
    /// A splicer writing to a duplicate of `device`, the session's `/dev/fuse` descriptor,
    /// through pipes of `pipe_bytes`.
    pub fn new(device: BorrowedFd<'_>, pipe_bytes: usize) -> io::Result<Splicer> {
        Ok(Splicer { device: device.try_clone_to_owned()?, pipe_bytes })
    }

    /// Answers request `unique` with `len` bytes of `file` at `offset`.
    pub fn reply(&self, unique: u64, file: BorrowedFd<'_>, offset: u64, len: usize) -> Spliced {
        let total = HEADER_BYTES + len;
        if total > self.pipe_bytes {
            return Spliced::NotSent;
        }
        PIPE.with(|slot| {
            let mut slot = slot.borrow_mut();
            if matches!(&*slot, PipeSlot::Ready(pipe) if pipe.bytes != self.pipe_bytes) {
                *slot = PipeSlot::Unmade;
            }
            if matches!(*slot, PipeSlot::Unmade) {
                *slot = match Pipe::new(self.pipe_bytes) {
                    Ok(pipe) => PipeSlot::Ready(pipe),
                    Err(e) => {
                        log::debug!("no splice pipe for this thread ({e}): its replies are copied");
                        PipeSlot::Refused
                    }
                };
            }
            let PipeSlot::Ready(pipe) = &*slot else { return Spliced::NotSent };
            let outcome = self.send(pipe, unique, file, offset, len, total);
            if !matches!(outcome, Spliced::Sent) {
                // Whatever is left in the pipe belongs to no reply: a fresh pipe next time.
                *slot = PipeSlot::Unmade;
            }
            outcome
        })
    }

    fn send(&self, pipe: &Pipe, unique: u64, file: BorrowedFd<'_>, offset: u64, len: usize, total: usize) -> Spliced {
        let header = header(total, unique);
        // SAFETY: writes 16 bytes from a live array to a descriptor we own.
        let written = unsafe { libc::write(pipe.write.as_raw_fd(), header.as_ptr().cast(), HEADER_BYTES) };
        if written != HEADER_BYTES as isize {
            return Spliced::NotSent;
        }
        let Ok(mut at) = libc::loff_t::try_from(offset) else { return Spliced::NotSent };
        let mut moved = 0;
        while moved < len {
            // SAFETY: plain syscall on live descriptors; `at` is a valid offset out-parameter.
            let n = unsafe {
                libc::splice(
                    file.as_raw_fd(),
                    &mut at,
                    pipe.write.as_raw_fd(),
                    std::ptr::null_mut(),
                    len - moved,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                0 => return Spliced::Failed(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank")),
                n if n > 0 => moved += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => continue,
                        // The pipe is full (a read bigger than the mount asked for), or the
                        // file's filesystem cannot splice: copy instead.
                        Some(libc::EAGAIN | libc::EINVAL | libc::ENOSYS) => return Spliced::NotSent,
                        _ => return Spliced::Failed(e),
                    }
                }
            }
        }
        loop {
            // SAFETY: plain syscall on descriptors we own.
            let n = unsafe {
                libc::splice(
                    pipe.read.as_raw_fd(),
                    std::ptr::null_mut(),
                    self.device.as_raw_fd(),
                    std::ptr::null_mut(),
                    total,
                    0,
                )
            };
            if n == total as isize {
                return Spliced::Sent;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) if n < 0 => continue,
                // The request was interrupted and is gone: there is nothing left to answer.
                Some(libc::ENOENT) if n < 0 => return Spliced::Sent,
                _ => {
                    log::debug!("splicing a reply of {total} bytes to the FUSE device: {n}, {e}");
                    return Spliced::NotSent;
                }
            }
        }
    }
}

impl Pipe {
    /// A non-blocking pipe of `bytes`; an error if the kernel will not make it that large.
    fn new(bytes: usize) -> io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills `fds` with two descriptors we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just returned by pipe2 and are owned by nobody else.
        let pipe = unsafe { Pipe { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]), bytes } };
        let want = libc::c_int::try_from(bytes).map_err(|_| io::Error::other("pipe too large"))?;
        // SAFETY: plain fcntl on a descriptor we own.
        let size = unsafe { libc::fcntl(pipe.write.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        if (size as usize) < bytes {
            return Err(io::Error::other(format!("pipe of {size} bytes")));
        }
        Ok(pipe)
    }
}

/// A `fuse_out_header` for a successful reply of `total` bytes (header included) to `unique`.
fn header(total: usize, unique: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0; HEADER_BYTES];
    h[0..4].copy_from_slice(&(total as u32).to_ne_bytes());
    // Bytes 4..8: error 0.
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    /// The pipe of a mount without privilege: 256 slots.
    const PIPE_BYTES: usize = 1 << 20;
    /// Its largest read: 254 pages.
    const MAX_READ_BYTES: u32 = 254 * 4096;

    /// A splicer whose "device" is the write end of a pipe: what it writes can be read back.
    fn splicer_into_pipe() -> (Splicer, std::fs::File) {
        let pipe = Pipe::new(PIPE_BYTES).unwrap();
        // Blocking reads of what arrives.
        // SAFETY: plain fcntl on a descriptor we own.
        assert_eq!(unsafe { libc::fcntl(pipe.read.as_raw_fd(), libc::F_SETFL, 0) }, 0);
        (Splicer { device: pipe.write, pipe_bytes: PIPE_BYTES }, std::fs::File::from(pipe.read))
    }

    #[test]
    fn a_reply_is_the_header_then_the_files_bytes_at_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (splicer, mut out) = splicer_into_pipe();
        // An unaligned read of the largest size the mount allows spans 255 pages.
        for (unique, offset, len) in [(7u64, 1234u64, MAX_READ_BYTES as usize), (8, 4096, 4096), (9, 3, 1)] {
            assert!(matches!(splicer.reply(unique, file.as_fd(), offset, len), Spliced::Sent));
            let mut got = vec![0; HEADER_BYTES + len];
            out.read_exact(&mut got).unwrap();
            assert_eq!(got[0..4], ((HEADER_BYTES + len) as u32).to_ne_bytes());
            assert_eq!(got[4..8], [0; 4]);
            assert_eq!(got[8..16], unique.to_ne_bytes());
            assert!(got[16..] == data[offset as usize..offset as usize + len]);
        }
    }

    #[test]
    fn readahead_is_rounded_down_to_whole_spliced_reads() {
        assert_eq!(readahead_in_whole_reads(1024, MAX_READ_BYTES), 1016);
        assert_eq!(readahead_in_whole_reads(4096, MAX_READ_BYTES), 4064);
        assert_eq!(readahead_in_whole_reads(1016, MAX_READ_BYTES), 1016);
        assert_eq!(readahead_in_whole_reads(128, MAX_READ_BYTES), 128);
        assert_eq!(readahead_in_whole_reads(0, MAX_READ_BYTES), 0);
        assert_eq!(readahead_in_whole_reads(20_000, 4094 * 4096), 16376);
    }

    #[test]
    fn requests_grow_with_the_kernel_limit_and_the_pipe_that_carries_them() {
        let mib = 1 << 20;
        // Today's default limit: 1 MiB without splicing, 254 pages in a 1 MiB pipe with it.
        assert_eq!(sizes(false, MAX_REQUEST_BYTES, 256, mib), Sizes { request_bytes: mib as u32, pipe_bytes: 0 });
        assert_eq!(
            sizes(true, MAX_REQUEST_BYTES, 256, mib),
            Sizes { request_bytes: MAX_READ_BYTES, pipe_bytes: PIPE_BYTES }
        );
        // A raised limit: requests of up to 16 MiB, less two pages when spliced (root's pipes).
        assert_eq!(sizes(false, MAX_REQUEST_BYTES, 65535, mib).request_bytes, 16 << 20);
        assert_eq!(
            sizes(true, MAX_REQUEST_BYTES, 1024, usize::MAX),
            Sizes { request_bytes: 1022 * 4096, pipe_bytes: 4 * mib }
        );
        assert_eq!(
            sizes(true, MAX_REQUEST_BYTES, 65535, usize::MAX),
            Sizes { request_bytes: 4094 * 4096, pipe_bytes: 16 * mib }
        );
        // Without privilege the pipe stays at pipe-max-size, and so do spliced requests.
        assert_eq!(
            sizes(true, MAX_REQUEST_BYTES, 4096, mib),
            Sizes { request_bytes: MAX_READ_BYTES, pipe_bytes: PIPE_BYTES }
        );
        // An old kernel without max_pages: 32 pages.
        assert_eq!(sizes(false, MAX_REQUEST_BYTES, 32, mib).request_bytes, 32 * 4096);
    }

    #[test]
    fn requests_stay_at_the_size_asked_for_under_a_higher_limit() {
        let mib = 1 << 20;
        // The default ask, 1 MiB, under a raised limit: 1 MiB (254 pages when spliced).
        assert_eq!(sizes(false, mib as u32, 4096, usize::MAX), Sizes { request_bytes: mib as u32, pipe_bytes: 0 });
        assert_eq!(
            sizes(true, mib as u32, 4096, usize::MAX),
            Sizes { request_bytes: MAX_READ_BYTES, pipe_bytes: PIPE_BYTES }
        );
        // A smaller ask than the limit, and a larger one than the limit.
        assert_eq!(sizes(false, 64 << 10, 256, mib).request_bytes, 64 << 10);
        assert_eq!(
            sizes(true, 4 * mib as u32, 1024, usize::MAX),
            Sizes { request_bytes: 1022 * 4096, pipe_bytes: 4 * mib }
        );
        assert_eq!(sizes(false, 16 * mib as u32, 256, usize::MAX).request_bytes, mib as u32);
        // Less than a page asks for one page; more than 16 MiB for 16 MiB.
        assert_eq!(sizes(false, 100, 256, mib).request_bytes, 4096);
        assert_eq!(sizes(false, u32::MAX, 65535, mib).request_bytes, 16 << 20);
    }

    #[test]
    fn a_file_that_ends_early_fails_and_too_large_a_reply_is_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (splicer, mut out) = splicer_into_pipe();
        assert!(matches!(splicer.reply(1, file.as_fd(), 4096, 8192), Spliced::Failed(_)));
        assert!(matches!(splicer.reply(2, file.as_fd(), 0, PIPE_BYTES), Spliced::NotSent));
        // Neither left anything on the device, and the thread's next reply is whole.
        assert!(matches!(splicer.reply(3, file.as_fd(), 0, 100), Spliced::Sent));
        let mut got = vec![0; HEADER_BYTES + 100];
        out.read_exact(&mut got).unwrap();
        assert_eq!(got[8..16], 3u64.to_ne_bytes());
        assert!(got[16..].iter().all(|&b| b == 1));
    }
}

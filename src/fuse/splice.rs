//! Read replies spliced from a local file into the FUSE device. The reply header is written into a
//! pipe, the file's pages are spliced in after it (page references, no copy), and the pipe is
//! spliced into `/dev/fuse`, where the kernel copies the pages once, into the reader's page cache.
//! Against `writev` from the file's mapping, the daemon never faults the mapping's page tables in
//! and never has to drop them again (docs/notes/benchmarks.md has the measurements).
//!
//! The kernel takes a spliced reply only whole: the header and all the data must sit in the pipe
//! at once. Each FUSE thread keeps one pipe of [`PIPE_BYTES`] (256 page slots, which
//! `/proc/sys/fs/pipe-max-size` allows without privilege), and the mount asks the kernel for reads
//! of at most [`MAX_READ_BYTES`]: their data covers at most 255 pages at any file offset, and the
//! header takes the last slot.
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

/// Bytes each FUSE thread's pipe holds: 256 slots of one page.
pub const PIPE_BYTES: usize = 1 << 20;

/// Largest read the mount lets the kernel send when it splices (its `max_write`, from which the
/// kernel takes `max_pages`): 254 pages, whose bytes span at most 255 pages of the file.
pub const MAX_READ_BYTES: u32 = 254 * 4096;

/// The kernel readahead (in KiB) a splicing mount uses for `kb`: rounded down to whole reads of
/// [`MAX_READ_BYTES`], so that a readahead window is not split into full reads and a short one
/// (1024 KiB would be 1016 + 8). Below one read it is left alone.
pub fn readahead_in_whole_reads(kb: u32) -> u32 {
    let read_kb = MAX_READ_BYTES >> 10;
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
    /// A splicer writing to a duplicate of `device`, the session's `/dev/fuse` descriptor.
    pub fn new(device: BorrowedFd<'_>) -> io::Result<Splicer> {
        Ok(Splicer { device: device.try_clone_to_owned()? })
    }

    /// Answers request `unique` with `len` bytes of `file` at `offset`.
    pub fn reply(&self, unique: u64, file: BorrowedFd<'_>, offset: u64, len: usize) -> Spliced {
        let total = HEADER_BYTES + len;
        if total > PIPE_BYTES {
            return Spliced::NotSent;
        }
        PIPE.with(|slot| {
            let mut slot = slot.borrow_mut();
            if matches!(*slot, PipeSlot::Unmade) {
                *slot = match Pipe::new() {
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
    /// A non-blocking pipe of [`PIPE_BYTES`]; an error if the kernel will not make it that large.
    fn new() -> io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills `fds` with two descriptors we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just returned by pipe2 and are owned by nobody else.
        let pipe = unsafe { Pipe { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]) } };
        // SAFETY: plain fcntl on a descriptor we own.
        let size = unsafe { libc::fcntl(pipe.write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        if (size as usize) < PIPE_BYTES {
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

    /// A splicer whose "device" is the write end of a pipe: what it writes can be read back.
    fn splicer_into_pipe() -> (Splicer, std::fs::File) {
        let pipe = Pipe::new().unwrap();
        // Blocking reads of what arrives.
        // SAFETY: plain fcntl on a descriptor we own.
        assert_eq!(unsafe { libc::fcntl(pipe.read.as_raw_fd(), libc::F_SETFL, 0) }, 0);
        (Splicer { device: pipe.write }, std::fs::File::from(pipe.read))
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
        assert_eq!(readahead_in_whole_reads(1024), 1016);
        assert_eq!(readahead_in_whole_reads(4096), 4064);
        assert_eq!(readahead_in_whole_reads(1016), 1016);
        assert_eq!(readahead_in_whole_reads(128), 128);
        assert_eq!(readahead_in_whole_reads(0), 0);
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

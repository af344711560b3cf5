//! Whether chosen pages of a local file are in the page cache ([`pages_resident`]): what a loader
//! asks of a file at a few sampled places before deciding to map it (cached) or read it (cold).

use std::os::fd::{AsRawFd, BorrowedFd};

/// The size of a page as mincore(2) counts them.
fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// Whether the page holding each of `offsets` of the file open as `file` (`size` bytes) is in the
/// page cache; false at the first that is not, or where the kernel cannot tell. mincore(2) reports
/// the page cache of a file only to its owner or to a process that may write it (Linux 5.2 on; of
/// any other file it calls every page resident, so a shared read-only model would always look
/// cached): there each page is asked of a mapping made for the question (a mapping costs no read);
/// elsewhere a one-byte read of each page with RWF_NOWAIT answers (EAGAIN: not cached; such a read
/// may start the kernel's readahead of that page's neighbourhood, a few hundred KiB at most).
/// Offsets at or past `size` are not cached.
pub fn pages_resident(file: BorrowedFd<'_>, size: u64, offsets: &[u64]) -> bool {
    if offsets.iter().any(|&at| at >= size) {
        return false;
    }
    if offsets.is_empty() {
        return true;
    }
    if mincore_tells(file) {
        resident_by_mincore(file, size, offsets)
    } else {
        resident_by_nowait_reads(file, offsets)
    }
}

/// The kernel's rule for mincore on a file mapping (mm/mincore.c `can_do_mincore`): the caller owns
/// the file or may open it for writing.
fn mincore_tells(file: BorrowedFd<'_>) -> bool {
    // SAFETY: a plain C struct, all zeroes a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the struct it is given; the descriptor is borrowed, open.
    if unsafe { libc::fstat(file.as_raw_fd(), &mut stat) } != 0 {
        return false;
    }
    // SAFETY: geteuid cannot fail.
    if stat.st_uid == unsafe { libc::geteuid() } {
        return true;
    }
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL in a number");
    // SAFETY: a NUL-terminated path; faccessat only looks.
    unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0 }
}

fn resident_by_mincore(file: BorrowedFd<'_>, size: u64, offsets: &[u64]) -> bool {
    let Ok(len) = usize::try_from(size) else { return false };
    // SAFETY: a fresh read-only shared mapping of the borrowed descriptor, unmapped below; nothing
    // is read through it (mincore looks at the page cache behind it).
    let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if base == libc::MAP_FAILED {
        return false;
    }
    let page = page_size();
    let mut resident = [0u8; 1];
    let all = offsets.iter().all(|&at| {
        let first = (at - at % page) as usize;
        // SAFETY: one page inside the mapping (at < size); mincore writes one byte for it.
        let rc = unsafe { libc::mincore(base.cast::<u8>().add(first).cast(), page as usize, resident.as_mut_ptr()) };
        rc == 0 && resident[0] & 1 == 1
    });
    // SAFETY: the mapping made above, of `len` bytes, no longer used.
    unsafe { libc::munmap(base, len) };
    all
}

fn resident_by_nowait_reads(file: BorrowedFd<'_>, offsets: &[u64]) -> bool {
    let mut byte = [0u8; 1];
    offsets.iter().all(|&at| {
        let Ok(at) = libc::off_t::try_from(at) else { return false };
        let iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        // SAFETY: one iovec over a live one-byte buffer; EAGAIN (not cached) or any error is "no".
        unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) == 1 }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A file just written is cached; after POSIX_FADV_DONTNEED (written back first) it is not;
    /// the read-without-waiting answer agrees with mincore's; an offset past the end is not cached.
    #[test]
    fn tells_a_cached_file_from_a_dropped_one_both_ways() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 1 << 20]).unwrap();
        let offsets = [0, 4096, (1 << 20) - 1];
        assert!(pages_resident(file.as_fd(), 1 << 20, &offsets));
        assert!(resident_by_nowait_reads(file.as_fd(), &offsets));
        assert!(!pages_resident(file.as_fd(), 1 << 20, &[1 << 20]));
        file.sync_all().unwrap();
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if !resident_by_mincore(file.as_fd(), 1 << 20, &[0]) {
            assert!(!pages_resident(file.as_fd(), 1 << 20, &offsets));
            assert!(!resident_by_nowait_reads(file.as_fd(), &[4096]));
        }
    }
}

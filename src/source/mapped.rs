//! [`Mapping`]: a read-only shared mapping of a whole local file whose bytes only the kernel ever
//! reads, and [`KernelBytes`], the form in which a reply's bytes reach the FUSE adapter. The engine
//! replies to a FUSE read with a range of the mapping, which the adapter either splices from the
//! file into the FUSE device (no mapping touched, no copy in user space) or hands to `writev` as a
//! slice (the kernel copies straight from the file's page cache): no block buffer either way.
//!
//! Why a raw `mmap` and not `memmap2`: `memmap2::Mmap` dereferences to `&[u8]`, which makes it one
//! `.to_vec()` away from reading the mapping in user space, where a truncation of the file turns
//! into SIGBUS. Here the bytes are only reachable through [`Mapping::to_kernel`], whose callers
//! promise to hand them to a system call (the kernel's copy in `writev` turns a truncated file
//! into an error, EIO for the reader, and never a signal), and every use first runs the source's
//! check that the file is still the one pinned at open.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// A reply's bytes on their way to the kernel: a slice (of a cached block, a buffer, or a
/// mapping), and, when they are a range of a mapped local file, that file and the range's offset
/// in it, so the reply can move them with `splice(2)` instead of having the kernel copy them out
/// of the mapping. A slice of a mapping must only be handed to a system call (see [`Mapping`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelBytes<'a> {
    slice: &'a [u8],
    file: Option<(BorrowedFd<'a>, u64)>,
    /// Set when the slice of a mapping is taken: the kernel's copy from it maps its pages into
    /// the daemon, and [`Mapping::to_kernel`] reports that.
    sliced: Option<&'a Cell<bool>>,
}

impl<'a> KernelBytes<'a> {
    /// The bytes as a slice.
    pub fn slice(&self) -> &'a [u8] {
        if let Some(sliced) = self.sliced {
            sliced.set(true);
        }
        self.slice
    }

    /// The file the bytes are a range of, and the range's offset in it (a mapped source only).
    pub fn file_range(&self) -> Option<(BorrowedFd<'a>, u64)> {
        self.file
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }
}

impl<'a> From<&'a [u8]> for KernelBytes<'a> {
    fn from(slice: &'a [u8]) -> KernelBytes<'a> {
        KernelBytes { slice, file: None, sliced: None }
    }
}

/// Bytes [`Mapping::read_ahead`] faults in (and so maps in this process) at a time: one PMD folio
/// on x86-64, which its fault reads whole, and the kernel's readahead on from there.
const READ_AHEAD_STEP: u64 = 2 << 20;

/// The check a mapping runs on its descriptor before handing out bytes: the file is still the
/// pinned one.
type Check = Box<dyn Fn(&File) -> io::Result<()> + Send + Sync>;

/// A read-only mapping of a whole file; see the module doc.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The descriptor mapped (kept for advice and for the pin check).
    file: File,
    check: Check,
}

// SAFETY: the mapping is read-only and never written or read through in user space; the pointer
// is only handed to the kernel (see `to_kernel`), so sharing it between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all `len` bytes of `file` read-only and shared; `check` runs before every use. `None`
    /// for an empty file (nothing to map) or if `mmap` fails (the caller keeps its other path).
    pub(crate) fn new(file: File, len: u64, check: Check) -> Option<Mapping> {
        let len = usize::try_from(len).ok().filter(|&len| len > 0)?;
        // SAFETY: a fresh read-only shared mapping of a descriptor we own; nothing aliases it.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            log::debug!("mmap of {len} bytes failed: {}", io::Error::last_os_error());
            return None;
        }
        // Advice only: faults of a `MADV_HUGEPAGE` file mapping read the file in PMD-sized folios
        // (2 MiB on x86-64), which is what `read_ahead` relies on; refused where transparent huge
        // pages are off, and then the kernel's own folio sizes apply.
        // SAFETY: advice on exactly the mapping just made.
        unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        Some(Mapping { ptr: NonNull::new(ptr.cast())?, len, file, check })
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether the mapping is empty (never: an empty file is not mapped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks the file is still the pinned one, then hands bytes `range` (clipped to the mapping)
    /// to `to_kernel`, as a slice of the mapping and as a range of the file. **`to_kernel` must
    /// only pass the slice to a system call** (`writev` to the FUSE device, `write` to a file) and
    /// never read it itself: if the file shrinks under the mapping, a user-space read of the lost
    /// pages is SIGBUS, while the kernel's copy fails with EFAULT (and the FUSE reader gets EIO).
    /// A splice of the file range that comes up short means the same: the file shrank. Also
    /// returns whether `to_kernel` took the slice (its pages may now be mapped in this process,
    /// until [`Mapping::release`]); a spliced range maps nothing.
    pub fn to_kernel<R>(
        &self,
        range: Range<u64>,
        to_kernel: impl FnOnce(KernelBytes<'_>) -> R,
    ) -> io::Result<(R, bool)> {
        (self.check)(&self.file)?;
        let start = usize::try_from(range.start).unwrap_or(usize::MAX).min(self.len);
        let end = usize::try_from(range.end).unwrap_or(usize::MAX).clamp(start, self.len);
        // SAFETY: `[start, end)` lies inside the live mapping, which is read-only and outlives the
        // borrow; the slice is only passed to the kernel (the contract above), so a page that
        // disappears under it is the kernel's EFAULT, never a user-space fault.
        let slice = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), end - start) };
        let sliced = Cell::new(false);
        let file = Some((self.file.as_fd(), start as u64));
        let reply = to_kernel(KernelBytes { slice, file, sliced: Some(&sliced) });
        Ok((reply, sliced.get()))
    }

    /// Reads bytes `range` of the file (widened to whole pages, clipped to the mapping) into the
    /// page cache and returns once they are there: `MADV_POPULATE_READ` faults the range in
    /// through this `MADV_HUGEPAGE` mapping, so the kernel reads it in PMD-sized folios even when
    /// several threads read neighbouring ranges at once; it goes [`READ_AHEAD_STEP`] at a time,
    /// each step's page-table entries dropped before the next (the pages stay cached). Where that
    /// is not available (before Linux 5.14) the range goes to `POSIX_FADV_WILLNEED` instead, which
    /// only starts the reads.
    ///
    /// Why not the advice alone: `POSIX_FADV_WILLNEED` (and `MADV_WILLNEED`, `readahead(2)`) fill
    /// the page cache with 4 KiB folios, and every later load of the file from the page cache, by
    /// any reader, then runs several times slower than from the large folios a sequential `read`
    /// leaves (docs/notes/benchmarks.md). A page the file no longer has (it shrank) is an error of
    /// the populate, never a signal: nothing in user space reads the mapping.
    pub fn read_ahead(&self, range: Range<u64>) {
        const PAGE: u64 = 4096;
        let start = (range.start / PAGE * PAGE).min(self.len as u64);
        let end = range.end.div_ceil(PAGE).saturating_mul(PAGE).min((self.len as u64).div_ceil(PAGE) * PAGE);
        if start >= end {
            return;
        }
        // From the first page not yet cached: a range already in the page cache costs a lookup
        // per page (as the advice did), not a populate and unmap of every page.
        let Some(start) = self.first_uncached(start, end) else {
            return;
        };
        // In steps of READ_AHEAD_STEP, each unmapped before the next, so at most one step's pages
        // are mapped in this process at a time (its resident set counts them).
        let mut at = start;
        while at < end {
            let step_end = end.min(at + READ_AHEAD_STEP);
            // Within the mapping (clipped above), which is whole pages long as the kernel sees it.
            let (addr, len) = (self.ptr.as_ptr().wrapping_add(at as usize), (step_end - at) as usize);
            // SAFETY: `[addr, addr + len)` lies inside our live read-only mapping; populating it
            // only reads the file in, and dropping its entries only unmaps (the pages stay cached).
            if unsafe { libc::madvise(addr.cast(), len, libc::MADV_POPULATE_READ) } != 0 {
                let error = io::Error::last_os_error();
                if error.raw_os_error() == Some(libc::EINVAL) {
                    self.advise(at..end);
                } else {
                    // EFAULT: the file shrank under the mapping; the reader's own read reports it.
                    log::debug!("read-ahead of bytes {at}..{end} of a mapped file: {error}");
                }
                return;
            }
            // SAFETY: as above.
            unsafe { libc::madvise(addr.cast(), len, libc::MADV_DONTNEED) };
            at = step_end;
        }
    }

    /// Asks the kernel to start reading bytes `range` of the file into its page cache
    /// (`POSIX_FADV_WILLNEED`), without waiting. Advice only, and it leaves 4 KiB folios (see
    /// [`Mapping::read_ahead`]): for where waiting is not an option.
    pub fn advise(&self, range: Range<u64>) {
        let len = range.end.saturating_sub(range.start);
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(range.start), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: plain syscall on a descriptor we own.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED) };
    }

    /// The offset of the first page of `[start, end)` (page-aligned, inside the mapping) that is
    /// not in the page cache (`mincore`, which looks at the page cache of a file mapping, mapped
    /// or not), or `None` if all are; `Some(start)` if `mincore` fails.
    fn first_uncached(&self, start: u64, end: u64) -> Option<u64> {
        const PAGE: u64 = 4096;
        const STEP_PAGES: usize = 512;
        let mut resident = [0u8; STEP_PAGES];
        let mut at = start;
        while at < end {
            let pages = ((end - at) / PAGE).min(STEP_PAGES as u64) as usize;
            let addr = self.ptr.as_ptr().wrapping_add(at as usize);
            // SAFETY: `[addr, addr + pages pages)` lies inside our mapping, and `resident` has a
            // byte for each page; mincore only reads page-cache state.
            if unsafe { libc::mincore(addr.cast(), pages * PAGE as usize, resident.as_mut_ptr()) } != 0 {
                return Some(at);
            }
            if let Some(page) = resident[..pages].iter().position(|r| r & 1 == 0) {
                return Some(at + page as u64 * PAGE);
            }
            at += pages as u64 * PAGE;
        }
        None
    }

    /// Drops this process's page-table entries for the whole mapping (`MADV_DONTNEED`): the file's
    /// pages stay in the page cache, and the next reply faults them back in. Bounds the daemon's
    /// resident set, which counts every mapped page (a write being copied from a page keeps it).
    pub fn release(&self) {
        // SAFETY: the range is exactly our mapping; DONTNEED on a shared file mapping only unmaps.
        unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_DONTNEED) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapping({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_kernels_copy_from_a_truncated_mapping_fails_without_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        // No pin check: this is the race where the file shrinks after the check passed.
        let mapping = Mapping::new(File::open(&path).unwrap(), 1 << 20, Box::new(|_| Ok(()))).unwrap();
        let mut out = tempfile::tempfile().unwrap();
        let (written, sliced) = mapping.to_kernel(0..8192, |b| out.write(b.slice())).unwrap();
        assert_eq!((written.unwrap(), sliced), (8192, true));
        // A reply that does not take the slice (a splice of the file range) is reported as such.
        let (range, sliced) = mapping.to_kernel(100..200, |b| b.file_range().map(|(_, at)| at)).unwrap();
        assert_eq!((range, sliced), (Some(100), false));
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
        mapping.release();
        // The lost pages: the kernel's copy fails (EFAULT) where a user-space read would be SIGBUS.
        let (err, _) = mapping.to_kernel(512 << 10..(512 << 10) + 8192, |b| out.write(b.slice())).unwrap();
        assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        // Clipped to the mapping; the check's error is returned before anything is handed out.
        assert_eq!(mapping.to_kernel(1 << 30..1 << 31, |b| b.len()).unwrap().0, 0);
        let refusing = Mapping::new(File::open(&path).unwrap(), 4096, Box::new(|_| Err(io::Error::other("changed"))));
        assert!(refusing.unwrap().to_kernel(0..10, |_| unreachable!()).is_err());
    }

    /// Pages of `file`'s first `len` bytes that are in the page cache, by index.
    fn cached_pages(file: &File, len: usize) -> Vec<usize> {
        // SAFETY: a fresh read-only mapping, unmapped below; mincore reads nothing through it.
        let base =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        assert_ne!(base, libc::MAP_FAILED);
        let mut resident = vec![0u8; len.div_ceil(4096)];
        // SAFETY: one byte per page of the mapping.
        assert_eq!(unsafe { libc::mincore(base, len, resident.as_mut_ptr()) }, 0);
        // SAFETY: exactly what was mapped.
        unsafe { libc::munmap(base, len) };
        resident.iter().enumerate().filter(|(_, r)| *r & 1 == 1).map(|(i, _)| i).collect()
    }

    #[test]
    fn read_ahead_brings_the_range_into_the_page_cache_and_survives_a_shrunk_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 8 << 20]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // SAFETY: plain syscall on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert!(cached_pages(&file, 8 << 20).is_empty(), "the written pages were dropped");
        let mapping = Mapping::new(File::open(&path).unwrap(), 8 << 20, Box::new(|_| Ok(()))).unwrap();
        // Bytes 1 MiB + 100 to 3 MiB - 100: their pages, at least, are cached once it returns.
        mapping.read_ahead((1 << 20) + 100..(3 << 20) - 100);
        let cached = cached_pages(&file, 8 << 20);
        assert!((256..768).all(|page| cached.contains(&page)), "{} pages cached", cached.len());
        // Past the end and empty ranges are nothing to do; a file shrunk under the mapping is an
        // error of the populate, not a signal.
        mapping.read_ahead(9 << 20..10 << 20);
        mapping.read_ahead(5 << 20..5 << 20);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
        mapping.read_ahead(4 << 20..6 << 20);
    }
}

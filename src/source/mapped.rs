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

    /// Asks the kernel to read bytes `range` of the file into its page cache now
    /// (`POSIX_FADV_WILLNEED`: large reads, submitted at once, not waited for). Advice only.
    pub fn will_need(&self, range: Range<u64>) {
        let len = range.end.saturating_sub(range.start);
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(range.start), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: plain syscall on a descriptor we own.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED) };
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
}

//! What reading through a mount leaves in the page cache of a local checkpoint: the same large
//! folios a plain sequential read of the file leaves, so every later load of the file from the page
//! cache (`load_file`, a mapping, another mount) runs at full speed. The kernel's readahead advice
//! (`POSIX_FADV_WILLNEED`), which the daemon's prefetch used before, leaves 4 KiB folios, and a
//! load of a 2 GiB file from them took 15x as long (docs/notes/benchmarks.md).
//!
//! Folio sizes are read from `/proc/self/pagemap` and `/proc/kpageflags` (root only), for the
//! pages of the file that are in the page cache.

mod common;
use common::tools::not_root;
use common::*;

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;

const PAGE: usize = 4096;
/// `/proc/kpageflags` bits: the first and the other pages of a folio of more than one page.
const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;

/// Drops the file's pages from the page cache (written back first: only clean pages go).
fn drop_cached(path: &Path) {
    let file = File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: plain syscall on an open descriptor.
    assert_eq!(unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

/// Of the file's pages in the page cache, how many there are and the share that lies in folios of
/// more than one page.
fn cached_pages_in_large_folios(path: &Path) -> (usize, f64) {
    let file = File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a fresh read-only shared mapping of an open file, unmapped below; the file is not
    // changed while it is mapped (the test owns it).
    let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    assert_ne!(base, libc::MAP_FAILED);
    let pages = len.div_ceil(PAGE);
    let mut resident = vec![0u8; pages];
    // SAFETY: the vector has one byte per page of the mapping.
    assert_eq!(unsafe { libc::mincore(base, len, resident.as_mut_ptr()) }, 0);
    let mut pagemap = File::open("/proc/self/pagemap").unwrap();
    let mut kpageflags = File::open("/proc/kpageflags").unwrap();
    let (mut cached, mut large) = (0, 0);
    for (page, _) in resident.iter().enumerate().filter(|(_, r)| *r & 1 == 1) {
        let addr = base as usize + page * PAGE;
        // SAFETY: the page is inside the mapping and in the page cache: mapping it reads nothing.
        unsafe { std::ptr::read_volatile(addr as *const u8) };
        let entry = read_u64_at(&mut pagemap, (addr / PAGE * 8) as u64);
        if entry >> 63 == 0 {
            continue;
        }
        let flags = read_u64_at(&mut kpageflags, (entry & ((1 << 55) - 1)) * 8);
        cached += 1;
        if flags & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) != 0 {
            large += 1;
        }
    }
    // SAFETY: unmapping exactly what was mapped above.
    unsafe { libc::munmap(base, len) };
    (cached, large as f64 / cached.max(1) as f64)
}

fn read_u64_at(file: &mut File, offset: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, offset).unwrap();
    u64::from_le_bytes(word)
}

/// Reads `path` from start to end in 128 KiB reads, as `cat` does.
fn read_like_cat(path: &Path) -> u64 {
    let mut file = File::open(path).unwrap();
    let mut buf = vec![0u8; 128 << 10];
    let mut total = 0;
    loop {
        match file.read(&mut buf).unwrap() {
            0 => return total,
            n => total += n as u64,
        }
    }
}

#[test]
fn reading_through_the_mount_leaves_the_checkpoint_in_large_folios_as_a_plain_read_does() {
    if not_root("reading page frame flags from /proc/kpageflags") {
        return;
    }
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors: Vec<T> =
        (0..4).map(|i| T::new(&format!("layer{i}.weight"), stfs::format::Dtype::F32, &[4 << 20])).collect();
    write_checkpoint(&file, &tensors, None);
    let file_pages = std::fs::metadata(&file).unwrap().len().div_ceil(PAGE as u64) as usize;

    drop_cached(&file);
    assert_eq!(cached_pages_in_large_folios(&file).0, 0, "the file's pages were not dropped");
    read_like_cat(&file);
    let (cached, plain) = cached_pages_in_large_folios(&file);
    assert_eq!(cached, file_pages);

    drop_cached(&file);
    let m = Mount::new(&file, &[]);
    for t in &tensors {
        assert_eq!(read_like_cat(&m.file(&t.name)), t.data.len() as u64);
    }
    let (cached, through) = cached_pages_in_large_folios(&file);
    println!("share of cached pages in large folios: plain read {plain:.2}, through the mount {through:.2}");
    assert!(cached >= file_pages - 1, "every tensor byte read: {cached} of {file_pages} pages cached");
    // Where a plain read leaves large folios (a filesystem and kernel that have them), a read through
    // the mount leaves them too; a few of its pages may come from the replies' own reads. The daemon
    // asks for them with MADV_HUGEPAGE, which transparent huge pages set to "never" turns off.
    // How many come in small folios depends on timing: 0.87-0.94 of the pages in large folios on
    // a quiet machine, 0.75-0.94 with two busy CPUs and a writer beside it, 0.69 once in a CI run
    // (a plain read 0.99). On a quiet machine they are the file's first 4 MiB (the header's page,
    // cached when the mount opened the file, keeps a 2 MiB folio from forming there, and the first
    // replies' splices read ahead on their own); under load, also where replies overtook the
    // read-ahead. The advice this guards against (POSIX_FADV_WILLNEED) left almost none.
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[never]") {
        println!("transparent huge pages are off here ({}): not judged", thp.trim());
    } else if plain >= 0.5 {
        assert!(through >= plain / 2.0, "plain read {plain:.2}, through the mount {through:.2}");
    } else {
        println!("the filesystem under {} leaves small folios even for a plain read", dir.path().display());
    }
}

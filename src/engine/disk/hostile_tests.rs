//! The disk tier against files planted in its directory: a block under another block's name, a
//! link or a FIFO in a block's or a record's place, and folders that link out of the directory.

use std::time::Duration;

use super::store::{self, block_path, Miss};
use super::tests::{age, bytes, with_blocks};
use super::{extent, ObjectKey};

/// A block file is taken only as itself: a valid block copied or linked under another block's
/// name, a link, and a FIFO (which would block an open) are each a corrupt miss, at once.
#[test]
fn a_block_file_is_taken_only_under_its_own_name_and_as_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = ObjectKey::new("x", 1000);
    store::write_block(dir.path(), &key, 2, &bytes(2, 1000)).unwrap();
    let (two, one) = (block_path(dir.path(), &key, 2), block_path(dir.path(), &key, 1));
    let mut buf = vec![0; 1000];
    let corrupt = |path: &std::path::Path, buf: &mut [u8]| match store::read_block(path, buf) {
        Err(Miss::Corrupt(why)) => why,
        other => panic!("{other:?}"),
    };
    std::fs::copy(&two, &one).unwrap();
    assert!(corrupt(&one, &mut buf).contains("checksum"));
    std::fs::remove_file(&one).unwrap();
    std::os::unix::fs::symlink(&two, &one).unwrap();
    assert_eq!(corrupt(&one, &mut buf), "a symbolic link");
    std::fs::remove_file(&one).unwrap();
    crate::util::test_support::make_fifo(&one);
    assert_eq!(corrupt(&one, &mut buf), "not a regular file");
    store::read_block(&two, &mut buf).unwrap();
    assert_eq!(buf, bytes(2, 1000));
}

/// A fan-out folder (or `objects/` itself) that is a link to a directory elsewhere is not walked:
/// `info` counts nothing there and `clear` (and the scan at each mount) removes nothing there.
#[test]
fn the_scan_never_follows_a_link_out_of_the_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, victim) = (dir.path().join("cache"), dir.path().join("victim"));
    std::fs::create_dir_all(cache.join(store::OBJECTS)).unwrap();
    std::fs::create_dir(&victim).unwrap();
    let (block, temp) = (victim.join(format!("{}-7", "0".repeat(32))), victim.join(".important.tmp"));
    crate::util::test_support::write_new(&block, b"not the cache's");
    crate::util::test_support::write_new(&temp, b"not the cache's");
    age(&temp, Duration::from_secs(3 * 3600));
    std::os::unix::fs::symlink(&victim, cache.join(store::OBJECTS).join("zz")).unwrap();
    std::os::unix::fs::symlink(&victim, cache.join(extent::EXTENTS)).unwrap();
    let info = super::info(&cache).unwrap();
    assert_eq!((info.blocks, info.bytes, info.temps), (0, 0, 0), "{info:?}");
    assert_eq!(super::clear(&cache).unwrap(), (0, 0));
    assert!(block.exists() && temp.exists(), "files outside the cache were removed");
}

/// A record file that is a link or a FIFO is no valid record: the extent is corrupt at once (never
/// a wait on the FIFO, on the FUSE thread that opens the file), and the link's target is never
/// touched.
#[test]
fn an_extent_record_that_is_a_link_or_a_fifo_is_corrupt_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_writer, _, key, _) = with_blocks(dir.path());
    let range = 0..5500;
    let path = extent::extent_path(dir.path(), &key, &range);
    let record = extent::meta_path(&path);
    let elsewhere = dir.path().join("elsewhere");
    for plant in ["link", "fifo"] {
        let written = extent::assemble(dir.path(), &key, 1000, 5500, &range).unwrap();
        assert!(matches!(written, extent::Assembled::Written(_)), "{written:?}");
        std::fs::copy(&record, &elsewhere).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&elsewhere).unwrap().set_modified(old).unwrap();
        std::fs::remove_file(&record).unwrap();
        if plant == "link" {
            std::os::unix::fs::symlink(&elsewhere, &record).unwrap();
        } else {
            crate::util::test_support::make_fifo(&record);
        }
        let started = std::time::Instant::now();
        let answer = extent::open_checked(dir.path(), &key, &range);
        assert!(matches!(answer, extent::Opened::Corrupt(_)), "{plant}: {answer:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{plant}: waited {:?}", started.elapsed());
        assert!(!path.exists() && !record.exists(), "{plant}: removed");
        let touched = std::fs::metadata(&elsewhere).unwrap().modified().unwrap();
        assert!(touched <= old + Duration::from_secs(1), "{plant}: the link's target was touched");
    }
}

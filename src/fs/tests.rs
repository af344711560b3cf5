//! Unit tests of the filesystem operations, over an in-memory source whose reads can be made to fail.

use std::io;
use std::sync::atomic::Ordering::Relaxed;

use super::*;
use crate::engine::EngineConfig;
use crate::format::Dtype;
use crate::source::{Source, SourceReader};
use crate::tree::namespace::{Layout, Shard, Tensor, Views, METADATA_NAME};

/// An in-memory source whose reads can be made to fail.
struct MemSource {
    bytes: Arc<Vec<u8>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

struct MemStream(Arc<Vec<u8>>, Arc<std::sync::atomic::AtomicBool>);

impl Source for MemSource {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn name(&self) -> &str {
        "mem.safetensors"
    }
    fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
        Ok(Box::new(MemStream(self.bytes.clone(), self.fail.clone())))
    }
}

impl SourceReader for MemStream {
    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.1.load(Relaxed) {
            return Err(io::Error::other("injected"));
        }
        let start = offset as usize;
        buf.copy_from_slice(self.0.get(start..start + buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?);
        Ok(())
    }
}

type Tensors = Vec<(String, Dtype, Vec<u64>, Vec<u8>)>;

fn fixture(views: Views) -> (Fs, Tensors, Arc<std::sync::atomic::AtomicBool>) {
    let tensors: Tensors = vec![
        ("a/b".into(), Dtype::U8, vec![300], (0..300u32).map(|i| i as u8).collect()),
        ("w".into(), Dtype::BF16, vec![2, 3], vec![0x80, 0x3f, 0, 0x40, 0, 0xc0, 0, 0, 0x80, 0x7f, 1, 0x3f]),
    ];
    let bytes = Arc::new(crate::format::writer::serialize(&tensors, None).unwrap());
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let engine = Engine::new(
        EngineConfig {
            block_size: 64,
            cache_size: 256,
            io_threads: 1,
            map_files: true,
            source_timeout: std::time::Duration::from_secs(30),
        },
        Arc::new(Stats::default()),
    );
    let source = engine.add_source(Arc::new(MemSource { bytes: bytes.clone(), fail: fail.clone() }));
    let mut stream = MemStream(bytes.clone(), fail.clone());
    let header =
        crate::format::read_header(|buf, offset| stream.read_exact_at(buf, offset), bytes.len() as u64).unwrap();
    let ns = Namespace::build(
        vec![Shard { source, name: "mem.safetensors".into(), header, file: None }],
        Vec::new(),
        Layout::Flat,
        views,
    )
    .unwrap();
    let base =
        AttrBase { uid: 7, gid: 8, mtime: SystemTime::UNIX_EPOCH, file_perm: 0o444, dir_perm: 0o555, blksize: 64 };
    (Fs::new(ns, engine, base), tensors, fail)
}

fn ino(fs: &Fs, name: &str) -> Ino {
    fs.lookup(ROOT_INO, OsStr::new(name)).unwrap().ino
}

#[test]
fn lookup_getattr_and_errors() {
    let (fs, tensors, _) = fixture(Views::default());
    let a = fs.lookup(ROOT_INO, OsStr::new("a%2Fb")).unwrap();
    assert_eq!((a.kind, a.size, a.perm, a.uid, a.gid, a.nlink), (Kind::File, 300, 0o444, 7, 8, 1));
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(fs.lookup(ROOT_INO, OsStr::new(".")).unwrap().ino, ROOT_INO);
    assert!(matches!(fs.lookup(ROOT_INO, OsStr::new("a/b")), Err(FsError::NotFound)));
    assert!(matches!(fs.lookup(a.ino, OsStr::new("x")), Err(FsError::NotDir)));
    assert!(matches!(fs.getattr(9999), Err(FsError::NotFound)));
    assert!(matches!(fs.getattr(0), Err(FsError::NotFound)));
    assert!(matches!(fs.open(ROOT_INO, false), Err(FsError::IsDir)));
    assert!(matches!(fs.open(a.ino, true), Err(FsError::ReadOnly)));
    assert!(matches!(fs.read(ROOT_INO, 0, 10), Err(FsError::IsDir)));
    assert!(matches!(fs.readdir(a.ino, 0, |_| false), Err(FsError::NotDir)));
    assert!(fs.opendir(ROOT_INO).is_ok());
    assert!(matches!(fs.opendir(a.ino), Err(FsError::NotDir)));
    assert!(matches!(fs.opendir(9999), Err(FsError::NotFound)));
    assert_eq!(tensors.len(), 2);
    // Every errno is the documented one.
    let expected = [
        (FsError::NotFound, libc::ENOENT),
        (FsError::NotDir, libc::ENOTDIR),
        (FsError::IsDir, libc::EISDIR),
        (FsError::ReadOnly, libc::EROFS),
        (FsError::NoXattr, libc::ENODATA),
        (FsError::XattrNamespace, libc::EOPNOTSUPP),
        (FsError::XattrTooLarge { needed: 2, offered: 1 }, libc::ERANGE),
        (FsError::Convert { tensor: "w".into(), dtype: Dtype::BF16, offset: 0 }, libc::EIO),
    ];
    for (e, errno) in expected {
        assert_eq!(e.errno(), errno, "{e}");
    }
}

#[test]
fn reads_clip_at_any_offset_and_size() {
    let (fs, tensors, _) = fixture(Views::default());
    let a = ino(&fs, "a%2Fb");
    let data = &tensors[0].3;
    for (off, size) in
        [(0u64, 300u32), (1, 63), (63, 2), (64, 64), (299, 10), (300, 1), (10_000, 5), (u64::MAX, u32::MAX)]
    {
        let got = fs.read(a, off, size).unwrap();
        let lo = (off.min(300)) as usize;
        let hi = (off.saturating_add(u64::from(size))).min(300) as usize;
        assert_eq!(got, &data[lo..hi], "{off} {size}");
    }
    let meta = fs.read(ino(&fs, METADATA_NAME), 0, u32::MAX).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    assert_eq!(doc["tensors"]["a/b"]["path"], "a%2Fb");
    assert!(fs.stats().fuse_reads.load(Relaxed) >= 9);
}

#[test]
fn backing_failures_are_eio_and_retry_succeeds() {
    let (fs, tensors, fail) = fixture(Views::default());
    let a = ino(&fs, "a%2Fb");
    fail.store(true, Relaxed);
    let err = fs.read(a, 0, 300).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(fs.stats().read_errors.load(Relaxed) >= 1);
    fail.store(false, Relaxed);
    assert_eq!(fs.read(a, 0, 300).unwrap(), tensors[0].3);
}

#[test]
fn readdir_pages_resume_at_offsets() {
    let (fs, _, _) = fixture(Views { npy: true, as_f32: false });
    let mut all = Vec::new();
    fs.readdir(ROOT_INO, 0, |e| {
        all.push(e);
        false
    })
    .unwrap();
    let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [".", "..", ".stfs", "a%2Fb", "a%2Fb.npy", "metadata.json", "w", "w.npy"]);
    // Stop after two entries, then resume from the offset the second one gave.
    let mut first = Vec::new();
    fs.readdir(ROOT_INO, 0, |e| {
        first.push(e);
        first.len() == 2
    })
    .unwrap();
    let mut rest = Vec::new();
    fs.readdir(ROOT_INO, first[1].next_offset, |e| {
        rest.push(e.name);
        false
    })
    .unwrap();
    assert_eq!(rest, names[2..]);
}

#[test]
fn xattrs_and_views() {
    let (fs, tensors, _) = fixture(Views { npy: true, as_f32: true });
    let w = ino(&fs, "w");
    let value = |name: &str, size: u32| fs.getxattr(w, OsStr::new(name), size);
    assert_eq!(value("user.safetensors.dtype", 64).unwrap(), Xattr::Data(b"BF16".to_vec()));
    assert_eq!(value("user.safetensors.shape", 5).unwrap(), Xattr::Data(b"[2,3]".to_vec()));
    // Size 0 asks for the size; a buffer too small is ERANGE.
    assert_eq!(value("user.safetensors.shape", 0).unwrap(), Xattr::Size(5));
    let short = value("user.safetensors.shape", 4).unwrap_err();
    assert!(matches!(short, FsError::XattrTooLarge { needed: 5, offered: 4 }), "{short:?}");
    assert_eq!(short.errno(), libc::ERANGE);
    assert!(matches!(value("user.other", 64), Err(FsError::NoXattr)));
    assert!(matches!(value("security.selinux", 64), Err(FsError::XattrNamespace)));
    let list: Vec<u8> = XATTRS.iter().flat_map(|n| n.bytes().chain([0])).collect();
    assert_eq!(fs.listxattr(w, 0).unwrap(), Xattr::Size(list.len() as u32));
    assert_eq!(fs.listxattr(w, 4096).unwrap(), Xattr::Data(list));
    assert!(matches!(fs.listxattr(w, 8), Err(FsError::XattrTooLarge { .. })));
    assert_eq!(fs.listxattr(ROOT_INO, 0).unwrap(), Xattr::Size(0));
    // The F32 view: BF16 bits shifted into the high half.
    let f32_bytes = fs.read(w, 0, 100).unwrap();
    let want: Vec<u8> = tensors[1]
        .3
        .chunks(2)
        .flat_map(|c| (u32::from(u16::from_le_bytes([c[0], c[1]])) << 16).to_le_bytes())
        .collect();
    assert_eq!(f32_bytes, want);
    assert_eq!(fs.read(w, 5, 6).unwrap(), &want[5..11]);
    // The .npy view shows what the file beside it serves: a '<f4' header, then the same F32 bytes,
    // whole and at an offset that straddles the header's end.
    let npy = fs.read(ino(&fs, "w.npy"), 0, 10_000).unwrap();
    let header = crate::views::npy::npy_header(Dtype::F32, &[2, 3]).unwrap();
    assert!(npy.starts_with(b"\x93NUMPY") && npy.windows(5).any(|w| w == b"'<f4'"));
    assert_eq!((&npy[..header.len()], &npy[header.len()..]), (&header[..], &want[..]));
    let straddling = fs.read(ino(&fs, "w.npy"), header.len() as u64 - 3, 9).unwrap();
    assert_eq!(&straddling[3..], &want[..6]);
    // Without the conversion, the .npy view is the header then the raw bytes.
    let (fs, tensors, _) = fixture(Views { npy: true, as_f32: false });
    let npy = fs.read(ino(&fs, "w.npy"), 0, 10_000).unwrap();
    assert!(npy.starts_with(b"\x93NUMPY"));
    assert_eq!(&npy[npy.len() - 12..], &tensors[1].3[..]);
}

#[test]
fn stats_snapshot_is_renewed_by_lookup_only() {
    let (fs, tensors, _) = fixture(Views::default());
    let control = ino(&fs, crate::tree::namespace::CONTROL_DIR);
    let name = OsStr::new(crate::tree::namespace::STATS_NAME);
    let first = fs.lookup(control, name).unwrap();
    assert!(first.renew_on_lookup);
    assert!(!fs.getattr(ino(&fs, "a%2Fb")).unwrap().renew_on_lookup);
    let doc = fs.read(first.ino, 0, 1 << 20).unwrap();
    assert_eq!(doc.len() as u64, first.size);
    let parsed: serde_json::Value = serde_json::from_slice(&doc).unwrap();
    assert_eq!(parsed["fuse_reads"], 0);
    // Reads and getattr serve the same snapshot, whatever happened since the lookup.
    fs.read(ino(&fs, "a%2Fb"), 0, 300).unwrap();
    assert_eq!(fs.getattr(first.ino).unwrap(), first);
    assert_eq!(fs.read(first.ino, 5, 1 << 20).unwrap(), &doc[5..]);
    // The next lookup renders a new document, with a later mtime so cached pages are dropped.
    let second = fs.lookup(control, name).unwrap();
    assert!(second.mtime > first.mtime);
    let parsed: serde_json::Value = serde_json::from_slice(&fs.read(second.ino, 0, 1 << 20).unwrap()).unwrap();
    assert_eq!(parsed["fuse_reads"], 3);
    assert_eq!(tensors.len(), 2);
}

/// Each lookup after a read is one opener's document, under an inode of its own: a reader that
/// opened before another still reads its whole document, at its size, until the kernel forgets the
/// inode (before, one shared document was renewed under the first reader, who could get a torn one).
#[test]
fn every_lookup_of_stats_is_a_document_of_its_own_until_forgotten() {
    let (fs, _, _) = fixture(Views::default());
    let control = ino(&fs, crate::tree::namespace::CONTROL_DIR);
    let name = OsStr::new(crate::tree::namespace::STATS_NAME);
    let first = fs.lookup(control, name).unwrap();
    let head = fs.read(first.ino, 0, 10).unwrap();
    fs.read(ino(&fs, "a%2Fb"), 0, 300).unwrap();
    let second = fs.lookup(control, name).unwrap();
    assert_ne!(first.ino, second.ino);
    let (a, b) = (fs.read(first.ino, 0, 1 << 20).unwrap(), fs.read(second.ino, 0, 1 << 20).unwrap());
    assert_ne!(a, b);
    assert_eq!(a[..10], head[..]);
    assert_eq!((a.len() as u64, b.len() as u64), (first.size, second.size));
    let reads = |doc: &[u8]| serde_json::from_slice::<serde_json::Value>(doc).unwrap()["fuse_reads"].clone();
    assert_eq!((reads(&a), reads(&b)), (0.into(), 2.into()));
    assert_eq!(fs.getattr(first.ino).unwrap(), first);
    // The snapshot is an ordinary read-only file: no xattrs, no execute, no write.
    assert_eq!(fs.listxattr(first.ino, 100).unwrap(), Xattr::Data(Vec::new()));
    assert!(matches!(fs.getxattr(first.ino, OsStr::new("user.x"), 100), Err(FsError::NoXattr)));
    assert!(matches!(fs.getxattr(first.ino, OsStr::new("security.x"), 100), Err(FsError::XattrNamespace)));
    assert!(fs.access(first.ino, false, false).is_ok());
    assert!(matches!(fs.access(first.ino, false, true), Err(FsError::AccessDenied)));
    assert!(matches!(fs.open(first.ino, true), Err(FsError::ReadOnly)));
    assert!(fs.open(first.ino, false).is_ok());
    fs.forget(first.ino, 1);
    assert!(matches!(fs.getattr(first.ino), Err(FsError::NotFound)));
    assert!(matches!(fs.read(first.ino, 0, 10), Err(FsError::NotFound)));
    assert_eq!(fs.read(second.ino, 0, 1 << 20).unwrap(), b, "forgetting one leaves the others");
    // Forgetting a tree inode changes nothing.
    fs.forget(control, 1);
    assert!(fs.getattr(control).is_ok());
}

#[test]
fn access_refuses_write_everywhere_and_execute_on_files() {
    let (fs, _, _) = fixture(Views::default());
    let (file, dir) = (ino(&fs, "a%2Fb"), crate::tree::namespace::ROOT_INO);
    assert!(fs.access(file, false, false).is_ok());
    assert!(matches!(fs.access(file, false, true), Err(FsError::AccessDenied)));
    assert_eq!(FsError::AccessDenied.errno(), libc::EACCES);
    assert!(fs.access(dir, false, true).is_ok());
    assert!(matches!(fs.access(dir, true, false), Err(FsError::ReadOnly)));
    assert!(matches!(fs.access(1 << 40, false, false), Err(FsError::NotFound)));
}

/// A tensor whose F32 view cannot be computed is a file that exists: its reads fail with EIO, not
/// ENOENT (the answer before issue 13), and not with an empty file.
#[test]
fn conversion_failures_are_eio_not_enoent() {
    let (fs, _, _) = fixture(Views { npy: false, as_f32: true });
    let template = fs.namespace().tensors()[1].clone();
    // The element range of a huge F64 tensor overflows when mapped back to source bytes.
    let overflowing = Tensor { dtype: Dtype::F64, shape: vec![1 << 61], ..template.clone() };
    // A dtype with no F32 view (Namespace::build never offers one; a bug elsewhere might).
    let unconvertible = Tensor { dtype: Dtype::C64, ..template };
    for (t, offset) in [(&overflowing, 1u64 << 62), (&unconvertible, 0)] {
        let err = super::read::read_converted(&fs.engine, t, offset, 16).unwrap_err();
        assert!(matches!(err, FsError::Convert { .. }), "{err:?}");
        assert_eq!(err.errno(), libc::EIO, "{err}");
        assert!(err.to_string().contains("cannot be converted to F32"), "{err}");
    }
}

/// A header claiming one U8 tensor `name` of `len` bytes, for a source that claims to hold them.
fn huge_shard(engine: &Engine, name: &str, len: u64) -> Shard {
    let json = format!("{{\"{name}\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[0,{len}]}}}}");
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    let total = bytes.len() as u64 + len;
    let bytes = Arc::new(bytes);
    let read = |buf: &mut [u8], offset: u64| MemStream(bytes.clone(), Arc::default()).read_exact_at(buf, offset);
    let header = crate::format::read_header(read, total).unwrap();
    let source = engine.add_source(Arc::new(MemSource { bytes, fail: Arc::default() }));
    Shard { source, name: format!("{name}.safetensors"), header, file: None }
}

/// Shards that claim (say, from a server) more bytes together than a u64 holds: statfs reports
/// the most it can, and does not overflow (a panic in a debug build, a wrapped total otherwise).
#[test]
fn statfs_of_shards_claiming_more_than_a_u64_saturates() {
    let config = EngineConfig {
        block_size: 64,
        cache_size: 256,
        io_threads: 1,
        map_files: false,
        source_timeout: std::time::Duration::from_secs(30),
    };
    let engine = Engine::new(config, Arc::new(Stats::default()));
    // A tensor's size in bits must fit a u64, so at most 2^61 bytes: sixteen of 2^60 make 2^64.
    let shards = (0..16).map(|i| huge_shard(&engine, &format!("t{i}"), 1 << 60)).collect();
    let ns = Namespace::build(shards, Vec::new(), Layout::Flat, Views::default()).unwrap();
    let base =
        AttrBase { uid: 0, gid: 0, mtime: SystemTime::UNIX_EPOCH, file_perm: 0o444, dir_perm: 0o555, blksize: 64 };
    let fs = Fs::new(ns, engine, base);
    assert_eq!(fs.statfs().blocks, u64::MAX.div_ceil(64));
}

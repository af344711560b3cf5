//! The slowfs filesystem: passthrough of a flat directory with per-handle object-store stream costs.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, Request,
};

/// Inode of the hidden stats file; source files start right after it.
const STATS_INO: u64 = 2;
const FIRST_FILE_INO: u64 = 3;
const STATS_NAME: &str = ".slowfs_stats";
/// Files never change while mounted, so attributes may be cached for a long time.
const ATTR_TTL: Duration = Duration::from_secs(60);

/// Costs of one stream, independent of FUSE so it can be tested.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CostModel {
    pub(crate) bytes_per_sec: f64,
    pub(crate) latency: Duration,
}

impl CostModel {
    /// Time a read of `len` bytes costs, and whether it opened a new range request.
    fn charge(&self, next_offset: Option<u64>, offset: u64, len: u64) -> (Duration, bool) {
        let transfer = Duration::from_secs_f64(len as f64 / self.bytes_per_sec);
        let is_new_range = next_offset != Some(offset);
        if is_new_range {
            (self.latency + transfer, true)
        } else {
            (transfer, false)
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    range_requests: AtomicU64,
    bytes: AtomicU64,
    opens: AtomicU64,
}

impl Counters {
    pub(crate) fn to_json(&self) -> String {
        format!(
            "{{\"requests\": {}, \"range_requests\": {}, \"bytes\": {}, \"opens\": {}}}\n",
            self.requests.load(Relaxed),
            self.range_requests.load(Relaxed),
            self.bytes.load(Relaxed),
            self.opens.load(Relaxed)
        )
    }
}

struct SourceFile {
    name: Vec<u8>,
    path: PathBuf,
    attr: FileAttr,
}

#[derive(Default)]
struct StreamState {
    /// Where the previous read on this handle ended; None before the first read.
    next_offset: Option<u64>,
    /// FUSE request ids waiting for (or holding) this stream; the smallest one is served.
    queued: BTreeSet<u64>,
}

struct Handle {
    file: File,
    stream: Mutex<StreamState>,
    turn: Condvar,
}

pub(crate) struct SlowFs {
    files: Vec<SourceFile>,
    root_attr: FileAttr,
    model: CostModel,
    counters: Arc<Counters>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
}

fn attr_from(ino: u64, meta: &std::fs::Metadata, kind: FileType) -> FileAttr {
    let mtime = UNIX_EPOCH + Duration::from_secs(u64::try_from(meta.mtime()).unwrap_or(0));
    FileAttr {
        ino: INodeNo(ino),
        size: if kind == FileType::Directory { 0 } else { meta.len() },
        blocks: meta.len().div_ceil(512),
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind,
        perm: if kind == FileType::Directory { 0o555 } else { 0o444 },
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn stats_attr(root: &FileAttr) -> FileAttr {
    FileAttr { ino: INodeNo(STATS_INO), size: 0, kind: FileType::RegularFile, perm: 0o444, nlink: 1, ..*root }
}

impl SlowFs {
    pub(crate) fn new(src_dir: &Path, model: CostModel, counters: Arc<Counters>) -> io::Result<Self> {
        let root_attr = attr_from(1, &std::fs::metadata(src_dir)?, FileType::Directory);
        let mut entries: Vec<(Vec<u8>, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(src_dir)? {
            let entry = entry?;
            let path = entry.path();
            if std::fs::metadata(&path)?.is_file() {
                entries.push((entry.file_name().as_bytes().to_vec(), path));
            }
        }
        entries.sort();
        let mut files = Vec::with_capacity(entries.len());
        for (index, (name, path)) in entries.into_iter().enumerate() {
            let attr = attr_from(FIRST_FILE_INO + index as u64, &std::fs::metadata(&path)?, FileType::RegularFile);
            files.push(SourceFile { name, path, attr });
        }
        Ok(SlowFs {
            files,
            root_attr,
            model,
            counters,
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        })
    }

    fn file(&self, ino: INodeNo) -> Option<&SourceFile> {
        let index = u64::from(ino).checked_sub(FIRST_FILE_INO)?;
        self.files.get(usize::try_from(index).ok()?)
    }

    fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles.lock().ok()?.get(&u64::from(fh)).cloned()
    }

    /// Serves one READ on `handle` in queue order, sleeping for the modelled cost.
    fn read_stream(&self, handle: &Handle, request_id: u64, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        let poisoned = |_| io::Error::other("stream lock poisoned");
        let mut state = handle.stream.lock().map_err(poisoned)?;
        state.queued.insert(request_id);
        while state.queued.first() != Some(&request_id) {
            state = handle.turn.wait(state).map_err(poisoned)?;
        }
        let previous_end = state.next_offset;
        drop(state);

        // Hold the turn (our id stays first in `queued`) while reading and sleeping.
        let started = Instant::now();
        let mut buf = vec![0u8; size as usize];
        let result = read_full(&handle.file, &mut buf, offset);
        let mut state = handle.stream.lock().map_err(poisoned)?;
        if let Ok(len) = result {
            buf.truncate(len);
            let (cost, is_new_range) = self.model.charge(previous_end, offset, len as u64);
            self.counters.requests.fetch_add(1, Relaxed);
            self.counters.bytes.fetch_add(len as u64, Relaxed);
            if is_new_range {
                self.counters.range_requests.fetch_add(1, Relaxed);
            }
            state.next_offset = Some(offset + len as u64);
            drop(state);
            sleep_until(started + cost);
            state = handle.stream.lock().map_err(poisoned)?;
        }
        state.queued.remove(&request_id);
        handle.turn.notify_all();
        drop(state);
        result.map(|_| buf)
    }
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn sleep_until(deadline: Instant) {
    // The default 50 us timer slack would add up over thousands of short sleeps.
    thread_local!(static SLACK_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if !SLACK_SET.with(|set| set.replace(true)) {
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    }
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

fn errno_of(err: &io::Error) -> Errno {
    err.raw_os_error().map(Errno::from_i32).unwrap_or(Errno::EIO)
}

impl Filesystem for SlowFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        if name.as_bytes() == STATS_NAME.as_bytes() {
            return reply.entry(&Duration::ZERO, &stats_attr(&self.root_attr), fuser::Generation(0));
        }
        match self.files.binary_search_by(|f| f.name.as_slice().cmp(name.as_bytes())) {
            Ok(index) => reply.entry(&ATTR_TTL, &self.files[index].attr, fuser::Generation(0)),
            Err(_) => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match u64::from(ino) {
            1 => reply.attr(&ATTR_TTL, &self.root_attr),
            STATS_INO => reply.attr(&Duration::ZERO, &stats_attr(&self.root_attr)),
            _ => match self.file(ino) {
                Some(file) => reply.attr(&ATTR_TTL, &file.attr),
                None => reply.error(Errno::ENOENT),
            },
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        if u64::from(ino) == STATS_INO {
            // Direct I/O: the size in the attributes is 0 and the content changes all the time.
            return reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
        let Some(source) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let file = match File::open(&source.path) {
            Ok(file) => file,
            Err(err) => return reply.error(errno_of(&err)),
        };
        let id = self.next_handle.fetch_add(1, Relaxed);
        let handle = Arc::new(Handle { file, stream: Mutex::new(StreamState::default()), turn: Condvar::new() });
        match self.handles.lock() {
            Ok(mut handles) => handles.insert(id, handle),
            Err(_) => return reply.error(Errno::EIO),
        };
        self.counters.opens.fetch_add(1, Relaxed);
        // No FOPEN_KEEP_CACHE: like a network filesystem, every open starts with a cold page cache.
        reply.opened(FileHandle(id), FopenFlags::empty());
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if u64::from(ino) == STATS_INO {
            let json = self.counters.to_json().into_bytes();
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(json.len());
            let end = start.saturating_add(size as usize).min(json.len());
            return reply.data(&json[start..end]);
        }
        let Some(handle) = self.handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        match self.read_stream(&handle, u64::from(req.unique()), offset, size) {
            Ok(data) => reply.data(&data),
            Err(err) => reply.error(errno_of(&err)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Ok(mut handles) = self.handles.lock() {
            handles.remove(&u64::from(fh));
        }
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let dots = [(1u64, &b"."[..]), (1, &b".."[..])];
        let entries = dots
            .iter()
            .map(|&(ino, name)| (ino, FileType::Directory, name))
            .chain(self.files.iter().map(|f| (u64::from(f.attr.ino), FileType::RegularFile, f.name.as_slice())));
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (index, (ino, kind, name)) in entries.enumerate().skip(skip) {
            if reply.add(INodeNo(ino), index as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        CostModel { bytes_per_sec: 100e6, latency: Duration::from_millis(10) }
    }

    #[test]
    fn first_read_pays_latency_and_transfer() {
        let (cost, new_range) = model().charge(None, 0, 1_000_000);
        assert!(new_range);
        assert_eq!(cost, Duration::from_millis(20));
    }

    #[test]
    fn continuing_read_pays_transfer_only() {
        let (cost, new_range) = model().charge(Some(4096), 4096, 500_000);
        assert!(!new_range);
        assert_eq!(cost, Duration::from_millis(5));
    }

    #[test]
    fn backward_and_forward_jumps_are_new_ranges() {
        assert!(model().charge(Some(8192), 4096, 10).1);
        assert!(model().charge(Some(8192), 12288, 10).1);
    }

    #[test]
    fn stream_counts_requests_ranges_and_bytes_and_serves_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..64u8).collect();
        std::fs::write(dir.path().join("f"), &content).unwrap();
        let counters = Arc::new(Counters::default());
        let fast = CostModel { bytes_per_sec: 1e12, latency: Duration::ZERO };
        let fs = SlowFs::new(dir.path(), fast, Arc::clone(&counters)).unwrap();
        let handle = Handle {
            file: File::open(dir.path().join("f")).unwrap(),
            stream: Mutex::new(StreamState::default()),
            turn: Condvar::new(),
        };
        assert_eq!(fs.read_stream(&handle, 1, 0, 10).unwrap(), content[0..10]);
        assert_eq!(fs.read_stream(&handle, 2, 10, 10).unwrap(), content[10..20]);
        assert_eq!(fs.read_stream(&handle, 3, 5, 10).unwrap(), content[5..15]);
        // Past the end: a short read that still counts as a request.
        assert_eq!(fs.read_stream(&handle, 4, 60, 10).unwrap(), content[60..64]);
        assert_eq!(counters.requests.load(Relaxed), 4);
        assert_eq!(counters.range_requests.load(Relaxed), 3);
        assert_eq!(counters.bytes.load(Relaxed), 34);
        assert!(handle.stream.lock().unwrap().queued.is_empty());
    }
}

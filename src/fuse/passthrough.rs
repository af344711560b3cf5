//! FUSE passthrough: whether the kernel is asked for it at INIT (root, a kernel with it, and
//! something to pass through), and how an OPEN is answered once it is on: through to a verified
//! extent file of the disk cache, through to the pinned local file a re-served checkpoint file
//! is (checked unchanged at every open), or the ordinary way. Counted in stats.json.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use fuser::{BackingId, Errno, FileHandle, FopenFlags, InitFlags, KernelConfig, ReplyEmpty, ReplyOpen};
use log::{debug, warn};

use crate::fs::Fs;
use crate::stats::Stats;
use crate::util::lock;

/// The adapter's passthrough state: whether it may be asked for, whether the kernel agreed, and
/// the files open while it is on.
pub(crate) struct Passthrough {
    /// Passthrough may be asked for (not `--no-passthrough`).
    pub(crate) allowed: bool,
    /// The kernel agreed to FUSE passthrough (root, a kernel with it, and a disk cache or a
    /// re-served local file): OPEN is answered, with passthrough to a verified extent file where
    /// the disk cache has one, or to the local file a re-served checkpoint file is.
    pub(crate) on: bool,
    /// While on, the files open now, by inode: the kernel needs every open of an inode in one
    /// mode (all passed through, to one backing file, or none).
    opens: Mutex<HashMap<u64, Open>>,
    /// The kernel refused a backing file once (logged once).
    refused: AtomicBool,
}

/// One inode's opens while passthrough is on.
struct Open {
    count: u64,
    /// The backing file its opens pass through to; kept until the last one is released (the
    /// kernel looks the id up after the reply is sent). Shared so that a reply is sent after the
    /// lock is let go: the count taken under it keeps the id alive until then.
    backing: Option<Arc<BackingId>>,
    /// The backing file is the local file a re-served checkpoint file is (not an extent file):
    /// its pin is checked again at every open.
    whole: bool,
}

impl Passthrough {
    /// Off until [`Passthrough::negotiate`]; `allowed`: it may be asked for.
    pub(crate) fn new(allowed: bool) -> Passthrough {
        Passthrough { allowed, on: false, opens: Mutex::default(), refused: AtomicBool::new(false) }
    }

    /// Asks the kernel for passthrough at INIT where it can be had for `fs`, and says so in
    /// stats.json (`passthrough_enabled`) and in one debug line either way.
    pub(crate) fn negotiate(&mut self, fs: &Fs, config: &mut KernelConfig) {
        // Passthrough needs root (the kernel opens backing files only for CAP_SYS_ADMIN) and
        // something to pass through: a disk cache to hold whole tensor files, or a re-served
        // checkpoint file of a local file. Depth 1: the backing files are on an ordinary
        // filesystem, and the mount may still sit under one stacking filesystem.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let kernel = config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH);
        let why_not = if !self.allowed {
            "--no-passthrough"
        } else if !root {
            "not root"
        } else if !kernel {
            "the kernel lacks it"
        } else {
            // Both asked: extent files are turned on only here.
            let extents = fs.enable_passthrough();
            if !(extents | fs.reserves_local_files()) {
                "no disk cache and no re-served local file"
            } else if config.set_max_stack_depth(1).is_err()
                || config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_err()
            {
                "the kernel refused it"
            } else {
                ""
            }
        };
        self.on = why_not.is_empty();
        fs.stats().passthrough_enabled.store(u64::from(self.on), Relaxed);
        match why_not {
            "" => debug!("FUSE passthrough on: re-served local files and cached tensor files are read by the kernel"),
            why => debug!("FUSE passthrough off ({why}): every read goes through the daemon"),
        }
    }

    /// Answers an OPEN with passthrough on: through to the extent file when the disk cache has a
    /// verified one for this tensor ready and the kernel takes it, through to the local file a
    /// re-served checkpoint file is when that file is still the pinned one, else the ordinary way
    /// (the page cache kept, as when OPEN is not answered). An inode already open keeps its mode
    /// (the kernel passes every open of an inode through to one backing file, or none). The disk
    /// cache decides the rest (`engine::disk::extents`): it never verifies or assembles an
    /// extent on this thread.
    pub(crate) fn open_file(&self, fs: &Fs, ino: u64, reply: ReplyOpen) {
        // No system call under the lock: every open of every file of the mount comes here.
        let known = lock(&self.opens).get(&ino).map(|open| open.whole);
        // A re-served file's pin is checked at every open, as at the first: once the file
        // changed, its new opens fail as its reads would without passthrough.
        let checked = match known {
            Some(false) => None,
            Some(true) | None => Some(fs.checkpoint_opened(ino)),
        };
        if known == Some(true) && matches!(checked, Some(None)) {
            return reply.error(Errno::EIO);
        }
        if let Some((backing, whole)) = self.join_open(ino) {
            return self.reply_open(fs, ino, backing.as_deref(), whole, reply);
        }
        // The first open (or the last one was released meanwhile): register a backing file.
        let whole_file = checked.unwrap_or_else(|| fs.checkpoint_opened(ino));
        let is_whole = whole_file.is_some();
        let backing =
            whole_file.or_else(|| fs.tensor_opened(ino)).and_then(|file| self.open_backing(fs, &file, &reply));
        let whole = is_whole && backing.is_some();
        let mut opens = lock(&self.opens);
        // Another open of this inode may have been answered meanwhile: its mode wins (ours drops).
        let open = opens.entry(ino).or_insert(Open { count: 0, backing: backing.map(Arc::new), whole });
        open.count += 1;
        let (backing, whole) = (open.backing.clone(), open.whole);
        drop(opens);
        self.reply_open(fs, ino, backing.as_deref(), whole, reply);
    }

    /// Counts one more open of `ino` when it is open already; its backing file and mode.
    fn join_open(&self, ino: u64) -> Option<(Option<Arc<BackingId>>, bool)> {
        let mut opens = lock(&self.opens);
        let open = opens.get_mut(&ino)?;
        open.count += 1;
        Some((open.backing.clone(), open.whole))
    }

    /// Asks the kernel for a backing id for `file`; a refusal is counted and logged once.
    fn open_backing(&self, fs: &Fs, file: &File, reply: &ReplyOpen) -> Option<BackingId> {
        match reply.open_backing(file) {
            Ok(id) => Some(id),
            Err(e) => {
                Stats::add(&fs.stats().passthrough_refused, 1);
                if !self.refused.swap(true, Relaxed) {
                    warn!("the kernel refused a backing file for passthrough ({e}); serving reads instead");
                }
                None
            }
        }
    }

    /// Replies to an OPEN of `ino`: passed through to `backing` (`whole`: a re-served local
    /// file), or the ordinary way.
    fn reply_open(&self, fs: &Fs, ino: u64, backing: Option<&BackingId>, whole: bool, reply: ReplyOpen) {
        match backing {
            Some(id) => {
                count_passthrough(fs, ino, whole);
                reply.opened_passthrough(FileHandle(0), FopenFlags::empty(), id);
            }
            None => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
        }
    }

    /// Whether the opens of `ino` are passed through to a backing file now (false when it is not
    /// open, or passthrough is off).
    pub(crate) fn passed_through(&self, ino: u64) -> bool {
        self.on && lock(&self.opens).get(&ino).is_some_and(|open| open.backing.is_some())
    }

    /// Answers a RELEASE (sent only when OPEN was answered): the last release of an inode drops
    /// its backing file, or tells the disk cache it was closed (it may assemble its extent file).
    pub(crate) fn release_file(&self, fs: &Fs, ino: u64, reply: ReplyEmpty) {
        let mut opens = lock(&self.opens);
        let last = opens.get_mut(&ino).is_some_and(|open| {
            open.count = open.count.saturating_sub(1);
            open.count == 0
        });
        let closed = if last { opens.remove(&ino) } else { None };
        drop(opens);
        reply.ok();
        if closed.is_some_and(|open| open.backing.is_none()) {
            fs.tensor_closed(ino);
        }
    }
}

/// Counts one open passed through (`whole`: a re-served local file).
fn count_passthrough(fs: &Fs, ino: u64, whole: bool) {
    let stats = fs.stats();
    Stats::add(&stats.passthrough_opens, 1);
    Stats::add(&stats.passthrough_open_bytes, fs.getattr(ino).map_or(0, |a| a.size));
    if whole || fs.is_checkpoint_file(ino) {
        Stats::add(&stats.passthrough_checkpoint_opens, 1);
    }
}

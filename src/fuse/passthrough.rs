//! FUSE passthrough: whether the kernel is asked for it at INIT (root, a kernel with it, and
//! something to pass through), and how an OPEN is answered once it is on: through to a verified
//! extent file of the disk cache, through to the pinned local file a re-served checkpoint file
//! is (checked unchanged at every open, and watched: `watch`), or the ordinary way. Counted in
//! stats.json. Without a disk cache, once tensor files are opened one by one, OPEN is declined for
//! the rest of the mount ([`KERNEL_OPENS_AFTER`]): the kernel then opens every file itself, with no
//! round trip, as it does without passthrough.

mod watch;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use fuser::{BackingId, Errno, FileHandle, FopenFlags, InitFlags, KernelConfig, ReplyEmpty, ReplyOpen};
use log::{debug, warn};

use crate::fs::Fs;
use crate::stats::Stats;
use crate::util::lock;
use watch::PinnedWatch;

/// How an open served by the daemon is answered: the page cache kept across opens (as when OPEN
/// is not answered at all: files never change), and no FLUSH at close (nothing to flush).
const SERVED: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// Opens of tensor files after which a mount without a disk cache (where no tensor file can be
/// handed over) declines OPEN with ENOSYS while no file is handed over: from then on the kernel
/// opens every file itself and sends no OPEN or RELEASE (a round trip each, 20-40 us together on
/// a loaded 2-core VM, against 5 us for the whole open and close without them), and the re-served
/// files are served by the daemon. Enough that a loader's few looks at tensor files before it maps
/// the re-served file keep it handed over; few against the thousands a reader of tensor files
/// one by one opens.
pub(crate) const KERNEL_OPENS_AFTER: u64 = 64;

/// The adapter's passthrough state: whether it may be asked for, whether the kernel agreed, and
/// the files open while it is on.
pub(crate) struct Passthrough {
    /// Passthrough may be asked for (not `--no-passthrough`).
    pub(crate) allowed: bool,
    /// The kernel agreed to FUSE passthrough (root, a kernel with it, and a disk cache or a
    /// re-served local file): OPEN is answered, with passthrough to a verified extent file where
    /// the disk cache has one, or to the local file a re-served checkpoint file is.
    pub(crate) on: bool,
    /// The disk cache makes extent files: a tensor file (or a remote shard's re-served file)
    /// may be handed over.
    extents: bool,
    /// The watch on the local files re-served checkpoint files hand over (none without one, or
    /// if inotify could not be had: every open's own check still holds).
    watch: Option<PinnedWatch>,
    /// While on, the files that may be handed over that are open now, by inode: the kernel
    /// needs every open of an inode in one mode (all passed through, to one backing file, or
    /// none).
    opens: Mutex<HashMap<u64, Held>>,
    /// The kernel refused a backing file once (logged once).
    refused: AtomicBool,
    /// Tensor files opened (counted only without a disk cache), towards [`KERNEL_OPENS_AFTER`].
    tensor_opens: AtomicU64,
    /// OPEN was declined: the kernel opens files itself, nothing more is handed over.
    declined: AtomicBool,
}

/// What a file can be handed over as, known from the tree alone (no system call).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Never: served by the daemon (small files, stats.json, and tensor files without a disk
    /// cache). Its opens are answered at once and need no bookkeeping.
    Served,
    /// An extent file of the disk cache, once it holds a verified one (a tensor file, or the
    /// re-served file of a remote shard); asked for at the inode's first open.
    Extent,
    /// The pinned local file a re-served checkpoint file is; checked at every open.
    Pinned,
}

/// One inode's opens while passthrough is on.
struct Held {
    count: u64,
    mode: Mode,
}

/// How every open of one inode is answered while it is open.
#[derive(Clone)]
enum Mode {
    /// By the daemon (no backing file).
    Served,
    /// Passed through to this backing file, kept until the last open is released (the kernel
    /// looks the id up after the reply is sent). Shared so that a reply is sent after the lock is
    /// let go: the count taken under it keeps the id alive until then.
    Passed(Arc<BackingId>),
}

/// What the opens of an inode say to one more open of it.
enum Join {
    /// It is open: this open is counted and answered in the same mode.
    Joined(Mode),
    /// It is open passed through to its pinned file, which this open found changed: the kernel
    /// would pass this open through to that file too, so it fails instead.
    Refused,
    /// It is not open: this open chooses the mode.
    First,
}

impl Passthrough {
    /// Off until [`Passthrough::negotiate`]; `allowed`: it may be asked for.
    pub(crate) fn new(allowed: bool) -> Passthrough {
        Passthrough {
            allowed,
            on: false,
            extents: false,
            watch: None,
            opens: Mutex::default(),
            refused: AtomicBool::new(false),
            tensor_opens: AtomicU64::new(0),
            declined: AtomicBool::new(false),
        }
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
        let local_files = fs.reserves_local_files();
        let why_not = if !self.allowed {
            "--no-passthrough"
        } else if !root {
            "not root"
        } else if !kernel {
            "the kernel lacks it"
        } else {
            // Both asked: extent files are turned on only here.
            self.extents = fs.enable_passthrough();
            if !(self.extents | local_files) {
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
        if self.on && local_files {
            self.watch = PinnedWatch::start(Arc::clone(fs.stats()))
                .map_err(|e| debug!("no watch on the local files handed over ({e}): each open's check only"))
                .ok();
        }
    }

    /// What file `ino` can be handed over as.
    fn kind(&self, fs: &Fs, ino: u64) -> Kind {
        if fs.is_local_checkpoint_file(ino) {
            Kind::Pinned
        } else if self.extents && fs.may_have_extent(ino) {
            Kind::Extent
        } else {
            Kind::Served
        }
    }

    /// Answers an OPEN with passthrough on. A file that can never be handed over is answered at
    /// once, as the kernel would open it itself. Otherwise: through to the extent file when the
    /// disk cache has a verified one for it ready and the kernel takes it, through to the local
    /// file a re-served checkpoint file is while that file is the pinned one and unchanged, else
    /// the ordinary way (the page cache kept). An inode already open keeps its mode (the kernel
    /// passes every open of an inode through to one backing file, or none). The disk cache decides
    /// the rest (`engine::disk::extents`): it never verifies or assembles an extent on this
    /// thread. No system call is made under the lock every open of these files takes.
    pub(crate) fn open_file(&self, fs: &Fs, ino: u64, reply: ReplyOpen) {
        if self.declined.load(Relaxed) {
            return reply.error(Errno::ENOSYS); // an OPEN sent before the kernel heard it
        }
        let kind = self.kind(fs, ino);
        // A pinned file is checked at every open, as at the first: once it changed, an open fails
        // as its reads would without passthrough.
        let checked = match kind {
            Kind::Served if self.declines(fs, ino) => return reply.error(Errno::ENOSYS),
            Kind::Served => return reply.opened(FileHandle(0), SERVED),
            Kind::Extent => None,
            Kind::Pinned => Some(self.pinned_file(fs, ino)),
        };
        let unchanged = !matches!(checked, Some(None));
        match self.join(ino, unchanged) {
            Join::Joined(mode) => return self.answer(fs, ino, &mode, reply),
            Join::Refused => return reply.error(Errno::EIO),
            Join::First => {}
        }
        // The first open (or the last one was released meanwhile): a backing file, if any.
        let file = match checked {
            Some(pinned) => pinned,
            None => fs.tensor_opened(ino),
        };
        let mode = match file.and_then(|file| self.open_backing(fs, &file, &reply)) {
            Some(id) => Mode::Passed(Arc::new(id)),
            None => Mode::Served,
        };
        let (mode, unused) = self.register(ino, mode, unchanged);
        // An unused backing id is closed here, after the lock (closing it is a system call).
        drop(unused);
        match mode {
            Ok(mode) => self.answer(fs, ino, &mode, reply),
            Err(errno) => reply.error(errno),
        }
    }

    /// Whether this open of `ino`, a file never handed over, is the one that declines OPEN for the
    /// rest of the mount ([`KERNEL_OPENS_AFTER`]): a tensor file, no disk cache, the count
    /// reached, and no file handed over now (a loader holding one may open it again; the count
    /// starts over).
    fn declines(&self, fs: &Fs, ino: u64) -> bool {
        if self.extents || !fs.is_tensor_file(ino) {
            return false;
        }
        if self.tensor_opens.fetch_add(1, Relaxed) + 1 < KERNEL_OPENS_AFTER {
            return false;
        }
        self.tensor_opens.store(0, Relaxed);
        // Decided under the lock registering takes: no inode is handed over after this.
        let opens = lock(&self.opens);
        if opens.values().any(|held| matches!(held.mode, Mode::Passed(_))) {
            return false;
        }
        let first = !self.declined.swap(true, Relaxed);
        drop(opens);
        if first {
            debug!(
                "{KERNEL_OPENS_AFTER} tensor files opened one by one: the kernel opens files itself from now on, \
                 the re-served files are read through the daemon"
            );
        }
        true
    }

    /// Re-served checkpoint file `ino`'s local file, opened now and checked against its pin;
    /// `None` once it changed. Its watch is set at its first open, before the check that counts:
    /// a change before the watch is the check's to see, one after it the watch's.
    fn pinned_file(&self, fs: &Fs, ino: u64) -> Option<File> {
        let Some(watch) = &self.watch else { return fs.checkpoint_opened(ino) };
        if watch.changed(ino) {
            return None;
        }
        if !watch.is_watched(ino) {
            let first = fs.checkpoint_opened(ino)?;
            if let Err(e) = watch.watch(ino, &first) {
                debug!("inode {ino}: its local file is not watched ({e}): each open's check only");
            }
        }
        fs.checkpoint_opened(ino)
    }

    /// Counts one more open of `ino` when it is open already, in its mode; `unchanged`: this
    /// open's check of a pinned file passed (or there was none to make).
    fn join(&self, ino: u64, unchanged: bool) -> Join {
        let mut opens = lock(&self.opens);
        let Some(held) = opens.get_mut(&ino) else { return Join::First };
        if !unchanged && matches!(held.mode, Mode::Passed(_)) {
            return Join::Refused;
        }
        held.count += 1;
        Join::Joined(held.mode.clone())
    }

    /// Registers the first open of `ino` in `mode`, unless another open registered it meanwhile:
    /// then its mode wins (as in [`Passthrough::join`]: EIO if refused) and ours is handed back
    /// to be dropped after the lock. Once OPEN is declined nothing is registered (ENOSYS: the
    /// kernel opens the file itself), so no inode is handed over after that.
    fn register(&self, ino: u64, mode: Mode, unchanged: bool) -> (Result<Mode, Errno>, Option<Mode>) {
        let mut opens = lock(&self.opens);
        if self.declined.load(Relaxed) {
            return (Err(Errno::ENOSYS), Some(mode));
        }
        match opens.entry(ino) {
            Entry::Vacant(slot) => {
                slot.insert(Held { count: 1, mode: mode.clone() });
                (Ok(mode), None)
            }
            Entry::Occupied(mut slot) => {
                let held = slot.get_mut();
                if !unchanged && matches!(held.mode, Mode::Passed(_)) {
                    return (Err(Errno::EIO), Some(mode));
                }
                held.count += 1;
                (Ok(held.mode.clone()), Some(mode))
            }
        }
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

    /// Replies to an OPEN of `ino` in `mode`.
    fn answer(&self, fs: &Fs, ino: u64, mode: &Mode, reply: ReplyOpen) {
        match mode {
            Mode::Passed(id) => {
                count_passthrough(fs, ino);
                reply.opened_passthrough(FileHandle(0), FopenFlags::FOPEN_NOFLUSH, id);
            }
            Mode::Served => reply.opened(FileHandle(0), SERVED),
        }
    }

    /// Whether the opens of `ino` are passed through to a backing file now (false when it is not
    /// open, passthrough is off, or OPEN was declined).
    pub(crate) fn passed_through(&self, ino: u64) -> bool {
        // Once OPEN is declined no open is handed over (the kernel may send no RELEASE for those
        // that were, so their entries can stay).
        self.on
            && !self.declined.load(Relaxed)
            && lock(&self.opens).get(&ino).is_some_and(|held| matches!(held.mode, Mode::Passed(_)))
    }

    /// Answers a RELEASE (sent only when OPEN was answered): the last release of an inode drops
    /// its backing file, or tells the disk cache it was closed (it may assemble its extent file).
    pub(crate) fn release_file(&self, fs: &Fs, ino: u64, reply: ReplyEmpty) {
        let kind = self.kind(fs, ino);
        if kind == Kind::Served {
            return reply.ok();
        }
        let mut opens = lock(&self.opens);
        let last = opens.get_mut(&ino).is_some_and(|held| {
            held.count = held.count.saturating_sub(1);
            held.count == 0
        });
        let closed = if last { opens.remove(&ino) } else { None };
        drop(opens);
        reply.ok();
        // Its backing id (if any) is closed here, after the lock.
        if kind == Kind::Extent && closed.is_some_and(|held| matches!(held.mode, Mode::Served)) {
            fs.tensor_closed(ino);
        }
    }
}

/// Counts one open passed through.
fn count_passthrough(fs: &Fs, ino: u64) {
    let stats = fs.stats();
    Stats::add(&stats.passthrough_opens, 1);
    Stats::add(&stats.passthrough_open_bytes, fs.getattr(ino).map_or(0, |a| a.size));
    if fs.is_checkpoint_file(ino) {
        Stats::add(&stats.passthrough_checkpoint_opens, 1);
    }
}

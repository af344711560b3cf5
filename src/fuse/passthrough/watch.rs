//! The watch (inotify) on the local files whose re-served checkpoint files are handed to the
//! kernel: a file written, truncated, renamed, deleted or with its attributes changed while
//! mounted is marked changed (no later open hands it over), counted in stats.json
//! (`passthrough_files_changed`) and named in one log line. An open already handed over is read
//! by the kernel from the file itself and sees the change: the watch cannot undo that, only say it.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use log::{debug, warn};

use crate::format::PrintablePath;
use crate::stats::Stats;
use crate::util::lock;

/// The events that count as a change of a pinned file. IN_ATTRIB also comes when the file loses
/// a link (deleted, or another file renamed over it) and when its mode, owner or times are set:
/// the pin counts those as changes too (its ctime moves). A write through a shared mapping raises
/// no event until its writer closes the file (IN_CLOSE_WRITE).
const CHANGES: u32 =
    libc::IN_MODIFY | libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_CLOSE_WRITE;

/// How long the watch thread waits for events before it looks whether the mount has ended: the
/// bound on how long dropping the watch takes.
const POLL_MS: i32 = 200;

/// Room for many events per read (each is 16 bytes: the watched files' events carry no name).
const EVENT_BUFFER_BYTES: usize = 4096;

/// The watch on the pinned local files handed to the kernel, and the thread reading its events.
pub(crate) struct PinnedWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    inotify: OwnedFd,
    files: Mutex<Files>,
    stopping: AtomicBool,
    stats: Arc<Stats>,
}

/// What the watch knows, by inode of the mount and by inotify watch descriptor.
#[derive(Default)]
struct Files {
    /// Inodes of the mount whose local file is watched (false) or was seen to change (true).
    changed: HashMap<u64, bool>,
    /// The local files watched now: the path (for the log line) and the inodes they back.
    watched: HashMap<i32, Watched>,
    /// Watch descriptors an event came for before the open that set the watch recorded it: that
    /// open finds its file changed.
    unclaimed: HashSet<i32>,
    /// Watch descriptors removed after their file changed (their queued events say nothing new).
    removed: HashSet<i32>,
}

struct Watched {
    path: String,
    inos: Vec<u64>,
}

impl PinnedWatch {
    /// An inotify instance and the thread reading it; counts into `stats`.
    pub(crate) fn start(stats: Arc<Stats>) -> io::Result<PinnedWatch> {
        // SAFETY: inotify_init1 has no preconditions; a descriptor it returns is ours to own.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor no one else owns.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared { inotify, files: Mutex::default(), stopping: AtomicBool::new(false), stats });
        let reader = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("stfs-pinwatch".into()).spawn(move || reader.run())?;
        Ok(PinnedWatch { shared, thread: Some(thread) })
    }

    /// Whether inode `ino`'s local file is watched already (or was seen to change).
    pub(crate) fn is_watched(&self, ino: u64) -> bool {
        lock(&self.shared.files).changed.contains_key(&ino)
    }

    /// Whether inode `ino`'s local file was seen to change since its watch was set.
    pub(crate) fn changed(&self, ino: u64) -> bool {
        lock(&self.shared.files).changed.get(&ino) == Some(&true)
    }

    /// Watches `file`, the local file inode `ino` re-serves (just checked against its pin), from
    /// now on. The caller checks the pin again afterwards: a change before the watch was set is
    /// the check's to see, one after it the watch's.
    pub(crate) fn watch(&self, ino: u64, file: &File) -> io::Result<()> {
        let link = format!("/proc/self/fd/{}", file.as_raw_fd());
        let path = std::fs::read_link(&link)?;
        let shown = PrintablePath(&path.to_string_lossy()).to_string();
        // The link names the descriptor's own inode, whatever its path names by now.
        let c_link = CString::new(link.as_bytes()).map_err(io::Error::other)?;
        // SAFETY: a valid C string and our own inotify descriptor.
        let wd = unsafe { libc::inotify_add_watch(self.shared.inotify.as_raw_fd(), c_link.as_ptr(), CHANGES) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut files = lock(&self.shared.files);
        let seen_already = files.unclaimed.remove(&wd);
        files.changed.entry(ino).or_insert(false);
        let entry = files.watched.entry(wd).or_insert_with(|| Watched { path: shown, inos: Vec::new() });
        if !entry.inos.contains(&ino) {
            entry.inos.push(ino);
        }
        drop(files);
        if seen_already {
            self.shared.saw(wd, libc::IN_MODIFY);
        }
        Ok(())
    }
}

impl Drop for PinnedWatch {
    /// Stops the thread (within [`POLL_MS`]) and closes the inotify instance.
    fn drop(&mut self) {
        self.shared.stopping.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    /// Reads events until the watch is dropped, waiting at most [`POLL_MS`] at a time.
    fn run(&self) {
        let fd = self.inotify.as_raw_fd();
        // u32 words: an inotify_event's fields are 4-byte aligned.
        let mut buf = [0u32; EVENT_BUFFER_BYTES / 4];
        while !self.stopping.load(Relaxed) {
            let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd, ours.
            let ready = unsafe { libc::poll(&mut poll, 1, POLL_MS) };
            if ready <= 0 {
                continue; // the time passed, or a signal
            }
            if poll.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                debug!("the watch of the files handed to the kernel stopped: its descriptor failed");
                return;
            }
            // SAFETY: the buffer is ours and its length in bytes is passed.
            let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), EVENT_BUFFER_BYTES) };
            let Ok(got) = usize::try_from(got) else { continue }; // EAGAIN or EINTR
            let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).take(got).collect();
            for (wd, mask) in events(&bytes) {
                self.saw(wd, mask);
            }
        }
    }

    /// Acts on one event: the file(s) it names are marked changed, counted and logged once, and
    /// their watch is removed (its later events would say nothing new). A lost event queue counts
    /// as a change of every watched file.
    fn saw(&self, wd: i32, mask: u32) {
        let mut files = lock(&self.files);
        let gone: Vec<(i32, Watched)> = if mask & libc::IN_Q_OVERFLOW != 0 {
            files.watched.drain().collect()
        } else if let Some(watched) = files.watched.remove(&wd) {
            vec![(wd, watched)]
        } else {
            // Not recorded yet (its open is between setting the watch and recording it), unless
            // removed here already (events queued before the removal, and IN_IGNORED after it).
            if !files.removed.contains(&wd) && mask & libc::IN_IGNORED == 0 {
                files.unclaimed.insert(wd);
            }
            Vec::new()
        };
        files.removed.extend(gone.iter().map(|(wd, _)| *wd));
        for (_, watched) in &gone {
            for ino in &watched.inos {
                files.changed.insert(*ino, true);
            }
        }
        drop(files);
        for (wd, watched) in gone {
            Stats::add(&self.stats.passthrough_files_changed, 1);
            warn!(
                "{}: changed while mounted ({}): no longer handed to the kernel; a reader that opened it \
                 before reads the file as it is now, later opens fail with EIO",
                watched.path,
                what_changed(mask)
            );
            // SAFETY: our own inotify descriptor; a watch already gone is an error we ignore.
            unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), wd) };
        }
    }
}

/// The (watch descriptor, mask) of each event in `bytes`, as read from an inotify descriptor.
fn events(bytes: &[u8]) -> Vec<(i32, u32)> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let word = |i: usize| [header[i], header[i + 1], header[i + 2], header[i + 3]];
        let (wd, mask, name_len) =
            (i32::from_ne_bytes(word(0)), u32::from_ne_bytes(word(4)), u32::from_ne_bytes(word(12)));
        out.push((wd, mask));
        at += HEADER + name_len as usize;
    }
    out
}

/// The change an event's mask stands for, in words.
fn what_changed(mask: u32) -> &'static str {
    if mask & libc::IN_Q_OVERFLOW != 0 {
        "the watch lost events"
    } else if mask & libc::IN_MODIFY != 0 {
        "written or truncated"
    } else if mask & libc::IN_DELETE_SELF != 0 {
        "deleted"
    } else if mask & libc::IN_MOVE_SELF != 0 {
        "renamed"
    } else if mask & libc::IN_CLOSE_WRITE != 0 {
        "opened for writing"
    } else {
        "its attributes or links changed: chmod, touch, a delete or a rename over it"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events are read as the kernel lays them out: a 16-byte header, then the name's bytes.
    #[test]
    fn events_are_split_at_their_names() {
        let mut bytes = Vec::new();
        for (wd, mask, name) in [(3i32, libc::IN_MODIFY, &b""[..]), (5, libc::IN_ATTRIB, &b"name\0\0\0\0"[..])] {
            bytes.extend_from_slice(&wd.to_ne_bytes());
            bytes.extend_from_slice(&mask.to_ne_bytes());
            bytes.extend_from_slice(&0u32.to_ne_bytes());
            bytes.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            bytes.extend_from_slice(name);
        }
        bytes.extend_from_slice(&[1, 2, 3]); // a cut header is left out
        assert_eq!(events(&bytes), vec![(3, libc::IN_MODIFY), (5, libc::IN_ATTRIB)]);
    }

    /// A file written while watched is marked changed, counted once and no longer watched; a
    /// second change of it says nothing more, and leaves nothing behind.
    #[test]
    fn a_write_marks_the_file_changed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"pinned").unwrap();
        let stats = Arc::new(Stats::default());
        let watch = PinnedWatch::start(Arc::clone(&stats)).unwrap();
        assert!(!watch.is_watched(7));
        watch.watch(7, &File::open(&path).unwrap()).unwrap();
        assert!(watch.is_watched(7) && !watch.changed(7));
        std::fs::write(&path, b"other!").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !watch.changed(7) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(watch.changed(7), "the write was not seen");
        std::fs::write(&path, b"third.").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3 * POLL_MS as u64));
        assert_eq!(stats.passthrough_files_changed.load(Relaxed), 1);
        // The events queued before its watch was removed are not kept as unclaimed.
        assert!(lock(&watch.shared.files).unclaimed.is_empty());
    }
}

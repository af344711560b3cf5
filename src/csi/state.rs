//! The plugin's state directory: what survives the plugin process, so that a restarted plugin (or
//! its successor) knows every shared mount and who uses it. One lock serialises the plugins'
//! changes to it; every file in it is created exclusively, never through a link.
//!
//! ```text
//! STATE/lock                       flock(2)ed while target records are read or changed
//! STATE/locks/VOLUME               flock(2)ed while that volume is mounted, served or ended
//! STATE/targets/HASH               a published target: "VOLUME\nTARGET\n" (HASH: of the target path)
//! STATE/volumes/VOLUME/mount/      the shared stfs mount (VOLUME: digest of source, flags, secrets)
//! STATE/volumes/VOLUME/users/HASH  one per target bound to it: the reference count
//! STATE/volumes/VOLUME/daemon      its daemon process: "PID START_TIME"
//! STATE/private/VOLUME/            the daemon user's own folder: its log, a Google key
//! ```
//!
//! Only root may enter `volumes/` (0700): the shared mounts are `allow_other` (every pod's user
//! reads them through its bind), so a way to them from the host would let any host user read a
//! private model. The daemons, which run as an unprivileged user, need their own folders alone:
//! `private/` (0711) lets them through to theirs (0700, theirs), and lists nothing.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The plugin's state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

/// A lock on a [`StateDir`] or on one of its volumes, held until dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

/// Hex digest (128 bits of SHA-256) of `parts`, each ended by a NUL.
pub fn digest_of(parts: &[&[u8]]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part);
        context.update(b"\0");
    }
    hex(&context.finish().as_ref()[..16])
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates `path` as a directory with `mode` (an existing directory is kept as it is).
fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && fs::symlink_metadata(path)?.is_dir() => Ok(()),
        result => result,
    }
}

/// Writes `text` to a new file at `path`: created exclusively (an existing one is replaced by
/// removing it first), never through a link, mode 0600.
pub fn write_record(path: &Path, text: &str) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// Opens the lock file at `path` and flocks it: created exclusively (mode 0600) when missing, else
/// the existing one (lock files are never removed: a waiter may hold it), never through a link,
/// and only a regular file this process owns.
fn lock_file(path: &Path) -> io::Result<StateLock> {
    let open = |create: bool| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    let file = match open(true) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open(false)?,
        opened => opened?,
    };
    let meta = file.metadata()?;
    // SAFETY: geteuid has no preconditions.
    if !meta.is_file() || meta.uid() != unsafe { libc::geteuid() } {
        return Err(io::Error::other(format!("{}: not a lock file this plugin made", path.display())));
    }
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(StateLock { _file: file })
}

/// Removes the file at `path`; a missing one is not an error.
pub fn remove_record(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl StateDir {
    /// Opens (creating, mode 0711) the state directory at `root` and its folders, each given its
    /// mode (also where an earlier version made it otherwise).
    pub fn open(root: &Path) -> io::Result<StateDir> {
        fs::create_dir_all(root)?;
        make_dir(root, 0o711)?;
        let state = StateDir { root: root.to_path_buf() };
        for (folder, mode) in [("targets", 0o700), ("volumes", 0o700), ("locks", 0o700), ("private", 0o711)] {
            let path = state.root.join(folder);
            make_dir(&path, mode)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        }
        Ok(state)
    }

    /// Takes the state lock, which guards the target records (waiting for another plugin process
    /// that holds it). Held only while records are read or written, never while mounting.
    pub fn lock(&self) -> io::Result<StateLock> {
        lock_file(&self.root.join("lock"))
    }

    /// Takes volume `volume`'s own lock, held while it is mounted, served or ended (a slow source
    /// blocks only its own volume). Taken before the state lock, never after. Its file is kept
    /// when the volume ends (removing a file others may wait on would let two holders in).
    pub fn lock_volume(&self, volume: &str) -> io::Result<StateLock> {
        lock_file(&self.root.join("locks").join(volume))
    }

    /// The record of a published target.
    pub fn target_record(&self, target: &Path) -> PathBuf {
        self.root.join("targets").join(target_hash(target))
    }

    /// The volume a target was published from, by its record (None: no record).
    pub fn volume_of_target(&self, target: &Path) -> io::Result<Option<String>> {
        match fs::read_to_string(self.target_record(target)) {
            Ok(text) => Ok(text.lines().next().map(str::to_string).filter(|v| is_volume_name(v))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The folder of a shared volume.
    pub fn volume(&self, volume: &str) -> VolumeDir {
        VolumeDir { root: self.root.join("volumes").join(volume), private: self.root.join("private").join(volume) }
    }

    /// Every shared volume's name.
    pub fn volumes(&self) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(self.root.join("volumes"))?
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| is_volume_name(n))
            .collect();
        names.sort();
        Ok(names)
    }
}

/// A volume name is a digest: 32 lower-case hex digits (nothing a record could smuggle in).
fn is_volume_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The name of a target's records.
fn target_hash(target: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    digest_of(&[target.as_os_str().as_bytes()])
}

/// The folder of one shared volume in the state directory.
#[derive(Debug, Clone)]
pub struct VolumeDir {
    root: PathBuf,
    /// The daemon user's folder, outside `volumes/`.
    private: PathBuf,
}

impl VolumeDir {
    /// Creates its folders: itself, `mount/` and `users/` (0700, root's), and the daemon's
    /// private folder (0700, owned by `owner`, the daemon's user).
    pub fn create(&self, owner: (u32, u32)) -> io::Result<()> {
        make_dir(&self.root, 0o700)?;
        // Not looked at if it is there: a dead daemon's mount may be on it.
        match fs::DirBuilder::new().mode(0o700).create(self.mount_point()) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        make_dir(&self.root.join("users"), 0o700)?;
        let private = self.private();
        make_dir(&private, 0o700)?;
        std::os::unix::fs::lchown(&private, Some(owner.0), Some(owner.1))
    }

    /// Where the shared mount is.
    pub fn mount_point(&self) -> PathBuf {
        self.root.join("mount")
    }

    /// The daemon user's folder (its log, a Google key).
    pub fn private(&self) -> PathBuf {
        self.private.clone()
    }

    /// The record of the daemon process.
    pub fn daemon_record(&self) -> PathBuf {
        self.root.join("daemon")
    }

    /// The record saying that `target` uses this volume.
    pub fn user_record(&self, target: &Path) -> PathBuf {
        self.root.join("users").join(target_hash(target))
    }

    /// How many targets use this volume (its user records).
    pub fn user_count(&self) -> io::Result<usize> {
        match fs::read_dir(self.root.join("users")) {
            Ok(entries) => Ok(entries.flatten().count()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Every target recorded as a user.
    pub fn users(&self) -> io::Result<Vec<PathBuf>> {
        let Ok(entries) = fs::read_dir(self.root.join("users")) else { return Ok(Vec::new()) };
        Ok(entries.flatten().filter_map(|e| fs::read_to_string(e.path()).ok()).map(PathBuf::from).collect())
    }

    /// Removes the folder: the files it made (records, the daemon's log and key) and its empty
    /// folders, each by name; a mount point still mounted is refused by rmdir (EBUSY), never
    /// entered.
    pub fn remove(&self) -> io::Result<()> {
        // The daemon's user may have made anything in its folder: removed whole (links not followed).
        match fs::remove_dir_all(self.private()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let users = self.root.join("users");
        if let Ok(entries) = fs::read_dir(&users) {
            for entry in entries.flatten() {
                remove_record(&entry.path())?;
            }
        }
        remove_empty_dir(&users)?;
        remove_record(&self.daemon_record())?;
        remove_empty_dir(&self.mount_point())?;
        remove_empty_dir(&self.root)
    }
}

/// Removes the empty directory `path`; a missing one is not an error.
fn remove_empty_dir(path: &Path) -> io::Result<()> {
    match fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner of `path` (this test's user, for a folder it made).
    fn owner_of(path: &Path) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).unwrap();
        (meta.uid(), meta.gid())
    }

    #[test]
    fn records_are_created_anew_and_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("state")).unwrap();
        let target = Path::new("/var/lib/kubelet/pods/p/volumes/v/mount");
        let record = state.target_record(target);
        write_record(&record, "0123456789abcdef0123456789abcdef\n/t\n").unwrap();
        assert_eq!(state.volume_of_target(target).unwrap().as_deref(), Some("0123456789abcdef0123456789abcdef"));
        // A link planted at a record's place is replaced, its target left alone.
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        fs::remove_file(&record).unwrap();
        std::os::unix::fs::symlink(&victim, &record).unwrap();
        write_record(&record, "x\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(state.volume_of_target(target).unwrap(), None, "not a volume name");
        remove_record(&record).unwrap();
        remove_record(&record).unwrap();
    }

    #[test]
    fn users_are_counted_from_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let volume = state.volume(&digest_of(&[b"v"]));
        let owner = owner_of(dir.path());
        volume.create(owner).unwrap();
        assert_eq!(volume.user_count().unwrap(), 0);
        for t in ["/a", "/b"] {
            write_record(&volume.user_record(Path::new(t)), t).unwrap();
        }
        assert_eq!(volume.user_count().unwrap(), 2);
        let _lock = state.lock().unwrap();
        assert_eq!(state.volumes().unwrap().len(), 1);
        volume.remove().unwrap();
        assert_eq!(volume.user_count().unwrap(), 0);
    }
}

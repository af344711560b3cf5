//! The link rule of a local model folder, in one place: a file of the folder (a shard, an index,
//! a small file beside them) is read only if it resolves inside the mounted folder or, when that
//! folder is a Hugging Face cache snapshot, inside its repository's `blobs/`; and the one reader of
//! the small files a mount serves.
//!
//! A folder's entries may be symbolic links (a cache snapshot is a folder of them), and whoever can
//! write the folder chooses where they point: `config.json -> /etc/shadow` in a folder root mounts
//! with `allow_other` must not hand the shadow file to every user. So a path is resolved one
//! component at a time from the folder (`lstat`, `readlink`; a loop is "too many levels of
//! symbolic links"), a step onto anything outside refused before it is taken (nothing outside
//! is looked at: a link to a hung network path cannot hold the mount), the resolved path must
//! lie inside, and it is opened without following a link again (`openat2` with
//! `RESOLVE_NO_SYMLINKS`, or `O_NOFOLLOW` where that call is refused; without waiting, only a
//! regular file, checked on the descriptor); last, the file the descriptor holds is checked to lie
//! inside by its own path (`/proc/self/fd/N`), so a folder swapped for a link between the
//! resolution and the open is caught too.
//!
//! A Hugging Face cache snapshot (`hub/models--ORG--NAME/snapshots/REV/config.json ->
//! ../../blobs/HASH`) is recognised strictly, on the canonical path of the mounted folder: it is
//! `snapshots/REV` or a folder inside it, `REV` is a commit hash (40 or 64 lower-case hex
//! digits, as the cache names every snapshot), the folder above `snapshots/` is named
//! `models--`, `datasets--` or `spaces--` something, and it holds a real `blobs/` folder (not a
//! link). Its `blobs/` is then allowed as well, and nothing else of the cache: not another
//! snapshot, not `refs/`. (`refs/` is not required: a snapshot fetched by commit has none.)

use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io;
use std::path::{Path, PathBuf};

use crate::source::{open_regular_nofollow, read_at_most};

/// Where the files of one mounted local folder may really be.
#[derive(Debug, Clone)]
pub(super) struct Confinement {
    /// The mounted folder as it was named (made absolute): the paths of its files start with it.
    named: PathBuf,
    /// The mounted folder, canonical (no link, `.` or `..` in it).
    folder: PathBuf,
    /// The `blobs/` folder of the Hugging Face cache repository the folder is a snapshot of (or
    /// a folder of one), canonical.
    blobs: Option<PathBuf>,
}

/// A small file of the folder as it was read.
#[derive(Debug)]
pub(super) struct SmallFile {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The mode of the file they were read from (`st_mode`, from the descriptor): a mount serves
    /// it no wider.
    pub mode: u32,
}

/// The repository kinds of the Hugging Face cache (`models--ORG--NAME`).
const CACHE_REPO_PREFIXES: [&str; 3] = ["models--", "datasets--", "spaces--"];

impl Confinement {
    /// The rule for the folder `dir` (resolved here: a folder named through a link is the folder
    /// it names).
    pub fn of(dir: &Path) -> io::Result<Confinement> {
        let named = std::path::absolute(dir)?;
        let folder = std::fs::canonicalize(dir)?;
        let blobs = cache_blobs(&folder);
        Ok(Confinement { named, folder, blobs })
    }

    /// The mounted folder, canonical.
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// Whether the canonical path `real` lies inside the folder, or inside the cache's `blobs/`.
    fn contains(&self, real: &Path) -> bool {
        real.starts_with(&self.folder) || self.blobs.as_ref().is_some_and(|b| real.starts_with(b) && real != b)
    }

    /// Whether the canonical path `real` may be looked at (`lstat`, a link read) while resolving:
    /// inside, or on the way to the folder or to `blobs/` (their ancestors, already looked at
    /// when they were resolved). Nothing else outside is ever touched.
    fn may_look_at(&self, real: &Path) -> bool {
        let on_the_way = |to: &Path| to.starts_with(real);
        self.contains(real) || on_the_way(&self.folder) || self.blobs.as_deref().is_some_and(on_the_way)
    }

    /// `path` resolved, if it lies inside; an error saying so (or why it cannot be resolved: a
    /// dangling link, a loop) otherwise. A path of the folder (as it was named) is resolved one
    /// component at a time from the canonical folder, by `lstat` and `readlink`, and a step onto
    /// anything outside (but the way back to the folder or to `blobs/`) is refused before it is
    /// taken: a link to a hung network path, or to a FUSE mount that never answers, is refused
    /// without touching it. Another path is resolved by `canonicalize`, then checked.
    pub fn resolve(&self, path: &Path) -> io::Result<PathBuf> {
        let absolute = std::path::absolute(path)?;
        let real = match absolute.strip_prefix(&self.named).or_else(|_| absolute.strip_prefix(&self.folder)) {
            Ok(rest) => self.walk(rest)?,
            Err(_) => std::fs::canonicalize(path)?,
        };
        if !self.contains(&real) {
            return Err(outside());
        }
        Ok(real)
    }

    /// The canonical path `rest` (relative to the folder) names, resolved link by link from the
    /// folder without looking at anything [`Confinement::may_look_at`] refuses.
    fn walk(&self, rest: &Path) -> io::Result<PathBuf> {
        use std::path::Component;
        /// Links followed at most, as the kernel's path walk allows.
        const MAX_LINKS: usize = 40;
        let mut current = self.folder.clone();
        let mut left: Vec<PathBuf> = rest.components().rev().map(|c| PathBuf::from(c.as_os_str())).collect();
        let mut links = 0;
        while let Some(step) = left.pop() {
            match step.components().next() {
                Some(Component::RootDir) => current = PathBuf::from("/"),
                Some(Component::ParentDir) => {
                    current.pop();
                }
                Some(Component::Normal(name)) => {
                    let next = current.join(name);
                    if !self.may_look_at(&next) {
                        return Err(outside());
                    }
                    if !std::fs::symlink_metadata(&next)?.file_type().is_symlink() {
                        current = next;
                        continue;
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(io::Error::from_raw_os_error(libc::ELOOP));
                    }
                    let target = std::fs::read_link(&next)?;
                    left.extend(target.components().rev().map(|c| PathBuf::from(c.as_os_str())));
                }
                _ => {}
            }
        }
        Ok(current)
    }

    /// The regular file `path` names, opened for reading, if it lies inside: resolved, opened
    /// without following a link again and without waiting, its type and its place checked on the
    /// descriptor. The one way stfs opens a file of a mounted folder.
    pub fn open(&self, path: &Path) -> io::Result<(File, Metadata)> {
        self.open_resolved(path).map(|(_, file, meta)| (file, meta))
    }

    /// [`Confinement::open`], with the canonical path the file was opened by: the path a shard is
    /// reopened by, never following a link, so every later open is of the file the rule allowed.
    pub fn open_resolved(&self, path: &Path) -> io::Result<(PathBuf, File, Metadata)> {
        let real = self.resolve(path)?;
        let (file, meta) = open_regular_nofollow(&real)?;
        self.check_opened(&file)?;
        Ok((real, file, meta))
    }

    /// Refuses a descriptor whose file does not lie inside, by the path the kernel holds for it.
    fn check_opened(&self, file: &File) -> io::Result<()> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(file);
        let held = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|e| {
            let why = crate::util::describe_io(&e);
            io::Error::new(
                e.kind(),
                format!("cannot tell where it lies (/proc/self/fd/{fd}: {why}): is /proc mounted?"),
            )
        })?;
        if !self.contains(&held) {
            return Err(outside());
        }
        Ok(())
    }

    /// The small file `path` names, read whole if it lies inside and holds at most `limit` bytes
    /// ([`Confinement::open`], then [`read_at_most`]): a FIFO, a device, a folder, a dangling or
    /// looping link, a file the mounting user cannot read, one outside or one too large is an
    /// error, returned at once. The one reader of the small files of a local folder.
    pub fn read_small(&self, path: &Path, limit: u64) -> io::Result<SmallFile> {
        let (file, meta) = self.open(path)?;
        let bytes = read_at_most(&file, &meta, limit)?;
        Ok(SmallFile { bytes, mode: std::os::unix::fs::MetadataExt::mode(&meta) })
    }
}

/// The error of a path that resolves outside (the target is not named: only that it is outside).
fn outside() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "resolves outside the model's folder")
}

/// The `blobs/` folder of the Hugging Face cache repository whose snapshot `folder` (canonical) is
/// in, by the rule of the module's doc.
fn cache_blobs(folder: &Path) -> Option<PathBuf> {
    let snapshot = folder.ancestors().find(|a| {
        a.parent().and_then(Path::file_name) == Some(OsStr::new("snapshots"))
            && a.file_name().and_then(OsStr::to_str).is_some_and(is_commit)
    })?;
    let repo = snapshot.parent()?.parent()?;
    let name = repo.file_name()?.to_str()?;
    if !CACHE_REPO_PREFIXES.iter().any(|p| name.len() > p.len() && name.starts_with(p)) {
        return None;
    }
    let blobs = repo.join("blobs");
    std::fs::symlink_metadata(&blobs).ok().filter(Metadata::is_dir)?;
    Some(blobs)
}

/// Whether `name` is a commit hash as the cache names its snapshots (SHA-1 or SHA-256, hex).
fn is_commit(name: &str) -> bool {
    matches!(name.len(), 40 | 64) && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    const REV: &str = "0123456789abcdef0123456789abcdef01234567";

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        crate::util::test_support::write_new(path, bytes);
    }

    /// A link to a file outside, a loop, a dangling link and a link to a folder are refused with
    /// their reason; links inside are read, and so is a file the folder holds itself.
    #[test]
    fn only_files_that_resolve_inside_are_read() {
        let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let root = dir.path().join("model");
        write(&root.join("config.json"), b"{}");
        write(&root.join("sub/vocab.txt"), b"v");
        write(&elsewhere.path().join("secret"), b"s");
        symlink("config.json", root.join("generation_config.json")).unwrap();
        symlink("sub/vocab.txt", root.join("vocab.txt")).unwrap();
        symlink(elsewhere.path().join("secret"), root.join("outside.json")).unwrap();
        symlink("/proc/self/environ", root.join("environ.json")).unwrap();
        symlink("loop.json", root.join("loop.json")).unwrap();
        symlink("gone", root.join("dangling.json")).unwrap();
        symlink("sub", root.join("folder.json")).unwrap();
        let rule = Confinement::of(&root).unwrap();
        let read = |name: &str| rule.read_small(&root.join(name), 100).map(|f| f.bytes);
        assert_eq!(read("config.json").unwrap(), b"{}");
        assert_eq!(read("generation_config.json").unwrap(), b"{}");
        assert_eq!(read("vocab.txt").unwrap(), b"v");
        let refused = |name: &str| read(name).unwrap_err().to_string();
        for name in ["outside.json", "environ.json"] {
            assert_eq!(refused(name), "resolves outside the model's folder", "{name}");
        }
        assert!(refused("loop.json").starts_with("Too many levels of symbolic links"), "{}", refused("loop.json"));
        assert!(refused("dangling.json").starts_with("No such file"));
        assert_eq!(refused("folder.json"), "is a directory");
    }

    /// A link outside is refused before anything outside is looked at: a link into a folder
    /// outside that loops, or that is not there, is "outside", not the loop or the missing file
    /// that following it would find (a target on a hung network mount would hold the opening).
    /// The way to the folder and to a cache's `blobs/` stays open (`../model/x`).
    #[test]
    fn nothing_outside_is_looked_at() {
        let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let root = dir.path().join("model");
        write(&root.join("config.json"), b"{}");
        symlink("loop", elsewhere.path().join("loop")).unwrap();
        symlink(elsewhere.path().join("loop/x"), root.join("looping.json")).unwrap();
        symlink(elsewhere.path().join("gone/x"), root.join("missing.json")).unwrap();
        symlink("../model/config.json", root.join("back.json")).unwrap();
        symlink(root.join("config.json"), root.join("absolute.json")).unwrap();
        let rule = Confinement::of(&root).unwrap();
        for name in ["looping.json", "missing.json"] {
            let err = rule.read_small(&root.join(name), 100).unwrap_err();
            assert_eq!(err.to_string(), "resolves outside the model's folder", "{name}");
        }
        for name in ["back.json", "absolute.json"] {
            assert_eq!(rule.read_small(&root.join(name), 100).unwrap().bytes, b"{}", "{name}");
        }
    }

    /// A FIFO (put in place after the folder was listed) is refused at once, never waited on: the
    /// read runs on a thread given 5 s, and one that waits longer is released by a writer (so the
    /// test ends either way) and fails the test.
    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.json");
        crate::util::test_support::make_fifo(&fifo);
        let rule = Confinement::of(dir.path()).unwrap();
        let (done, result) = std::sync::mpsc::channel();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || done.send(rule.read_small(&fifo, 100).map(|f| f.bytes)).unwrap())
        };
        let outcome = result.recv_timeout(Duration::from_secs(5));
        if outcome.is_err() {
            // Still blocked in open: a writer releases it.
            let _writer = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        reader.join().unwrap();
        let err = outcome.expect("the read of a FIFO waited over 5 s").unwrap_err();
        assert_eq!(err.to_string(), "is not a regular file");
    }

    /// The mode of the file read comes along (the mount serves it no wider), and a file too large
    /// is refused by its length.
    #[test]
    fn a_small_file_brings_its_mode_and_a_large_one_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        write(&path, b"12345");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let rule = Confinement::of(dir.path()).unwrap();
        assert_eq!(rule.read_small(&path, 5).unwrap().mode & 0o777, 0o640);
        assert_eq!(rule.read_small(&path, 4).unwrap_err().to_string(), "is larger than 4 bytes");
    }

    /// A Hugging Face cache snapshot (or a folder of one) may read its repository's `blobs/`, and
    /// nothing else of the cache; a folder that only looks like one in part may not.
    #[test]
    fn a_cache_snapshot_reads_its_blobs_and_only_them() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--name");
        let snapshot = repo.join("snapshots").join(REV);
        write(&repo.join("blobs/abc"), b"config");
        write(&repo.join("refs/main"), REV.as_bytes());
        std::fs::create_dir_all(&snapshot).unwrap();
        symlink("../../blobs/abc", snapshot.join("config.json")).unwrap();
        std::fs::create_dir_all(snapshot.join("unet")).unwrap();
        symlink("../../../blobs/abc", snapshot.join("unet/config.json")).unwrap();
        symlink("../../refs/main", snapshot.join("refs.json")).unwrap();
        let rule = Confinement::of(&snapshot).unwrap();
        assert_eq!(rule.read_small(&snapshot.join("config.json"), 100).unwrap().bytes, b"config");
        assert_eq!(rule.read_small(&snapshot.join("unet/config.json"), 100).unwrap().bytes, b"config");
        let err = rule.read_small(&snapshot.join("refs.json"), 100).unwrap_err();
        assert_eq!(err.to_string(), "resolves outside the model's folder");
        let component = Confinement::of(&snapshot.join("unet")).unwrap();
        assert_eq!(component.read_small(&snapshot.join("unet/config.json"), 100).unwrap().bytes, b"config");
        assert_eq!(cache_blobs(&std::fs::canonicalize(&snapshot).unwrap()), Some(rule.blobs.clone().unwrap()));

        // Not a snapshot: a revision that is no commit, a repository not named as the cache names
        // them, or one whose blobs/ is a link.
        for (repo, rev) in [("models--org--name", "main"), ("mine", REV), ("models--", REV)] {
            let folder = cache.path().join(repo).join("snapshots").join(rev);
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::create_dir_all(cache.path().join(repo).join("blobs")).unwrap();
            assert_eq!(cache_blobs(&std::fs::canonicalize(&folder).unwrap()), None, "{repo} {rev}");
        }
        let linked = cache.path().join("datasets--a--b");
        std::fs::create_dir_all(linked.join("snapshots").join(REV)).unwrap();
        symlink("/", linked.join("blobs")).unwrap();
        assert_eq!(cache_blobs(&std::fs::canonicalize(linked.join("snapshots").join(REV)).unwrap()), None);
    }
}

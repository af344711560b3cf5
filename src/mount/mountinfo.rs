//! /proc/self/mountinfo: what is mounted where, found without touching any mount. A stat, statfs or
//! realpath of a FUSE mount point asks its daemon, and one that is stopped or wedged never answers;
//! [`locate`] resolves every component of a path but the last, which it only looks up in the table.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The filesystem type stfs mounts as: what mount(8), findmnt, df -T and fstab's type field show.
pub const FS_TYPE: &str = "fuse.stfs";

/// Symbolic links followed at most while locating a path (the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

/// One mount, as /proc/self/mountinfo lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount ID (unique while mounted; a new mount at the same place gets a new one).
    pub id: u64,
    /// The mount ID of the mount it is on: of one stacked over another at the same place, that one.
    pub parent: u64,
    /// Where it is mounted (absolute, escapes decoded).
    pub mount_point: PathBuf,
    /// The filesystem type: `fuse.stfs`, `tmpfs`, `fuse.sshfs`.
    pub fs_type: String,
    /// The source: for stfs, the checkpoint.
    pub source: String,
    /// The superblock options; for FUSE, `user_id=N` is the user who mounted it.
    pub super_options: String,
}

impl MountEntry {
    /// Whether stfs made this mount: its type is `fuse.stfs`, or, from a fusermount that could not
    /// set a subtype, `fuse` with the source `stfs#...` that it records instead.
    pub fn is_stfs(&self) -> bool {
        self.fs_type == FS_TYPE
            || (matches!(self.fs_type.as_str(), "fuse" | "fuseblk") && self.source.starts_with("stfs#"))
    }

    /// The user who mounted it, for a FUSE mount (`user_id=N`).
    pub fn user_id(&self) -> Option<u32> {
        self.super_options.split(',').find_map(|o| o.strip_prefix("user_id=")?.parse().ok())
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: impl AsRef<[u8]>) -> Vec<u8> {
    let b = field.as_ref();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal =
            b.get(i + 1..i + 4).and_then(|o| std::str::from_utf8(o).ok()).and_then(|o| u8::from_str_radix(o, 8).ok());
        match (b[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Parses mountinfo into entries in mount order: of two at one place, the later is on top. It is
/// bytes, not text: a mount point, type or source may be any bytes but NUL (a user's FUSE mount
/// named in Latin-1), and one such line must not hide the others.
pub fn parse(text: impl AsRef<[u8]>) -> Vec<MountEntry> {
    text.as_ref().split(|&b| b == b'\n').filter_map(parse_line).collect()
}

/// One line of mountinfo, or None if it is not one.
fn parse_line(line: &[u8]) -> Option<MountEntry> {
    // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS
    let split = line.windows(3).position(|w| w == b" - ")?;
    let (fields, rest) = (&line[..split], &line[split + 3..]);
    let mut fields = fields.split(|&b| b == b' ');
    let mut number = || std::str::from_utf8(fields.next()?).ok()?.parse().ok();
    let (id, parent) = (number()?, number()?);
    let mount_point = fields.nth(2)?;
    let mut rest = rest.split(|&b| b == b' ');
    let (fs_type, source, super_options) = (rest.next()?, rest.next()?, rest.next().unwrap_or_default());
    let text = |field: &[u8]| String::from_utf8_lossy(&unescape(field)).into_owned();
    Some(MountEntry {
        id,
        parent,
        mount_point: PathBuf::from(OsStr::from_bytes(&unescape(mount_point))),
        fs_type: text(fs_type),
        source: text(source),
        super_options: text(super_options),
    })
}

/// This process's mounts (none if /proc is not there).
pub fn mounts() -> Vec<MountEntry> {
    fs::read("/proc/self/mountinfo").map(parse).unwrap_or_default()
}

/// The topmost of `mounts` at exactly `path`.
fn top_at(mounts: &[MountEntry], path: &Path) -> Option<MountEntry> {
    mounts.iter().rev().find(|m| m.mount_point == path).cloned()
}

/// Where `path` is, as mountinfo spells mount points, and the topmost mount there if any, found
/// without asking any filesystem about the last component when a mount is there: its parent is
/// resolved with realpath(3), and the last component is looked up in the table before anything
/// else; only a component that is not a mount point is read, as a symbolic link to follow.
pub fn locate(path: &Path) -> io::Result<(PathBuf, Option<MountEntry>)> {
    let mounts = mounts();
    let mut path = std::path::absolute(path)?;
    for _ in 0..MAX_SYMLINKS {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            // `/`, or a path ending in `..`: it names a directory above its last component.
            let resolved = fs::canonicalize(&path)?;
            let top = top_at(&mounts, &resolved);
            return Ok((resolved, top));
        };
        let here = fs::canonicalize(parent)?.join(name);
        if let Some(top) = top_at(&mounts, &here) {
            return Ok((here, Some(top)));
        }
        match fs::read_link(&here) {
            Ok(target) => path = here.parent().unwrap_or(Path::new("/")).join(target),
            Err(_) => return Ok((here, None)),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_escapes_are_decoded() {
        assert_eq!(unescape(r"/mnt/a\040b\134c"), b"/mnt/a b\\c");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/trailing\04"), b"/trailing\\04");
    }

    #[test]
    fn entries_are_parsed_with_optional_fields() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - fuse.stfs /m/x.safetensors ro,user_id=1000,group_id=1000\n\
                    40 27 0:21 / /tmp/t rw,relatime - tmpfs tmpfs rw,size=1024k\n\
                    bogus line\n";
        let entries = parse(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            (entries[0].id, entries[0].parent, entries[0].mount_point.as_path()),
            (36, 35, Path::new("/mnt/a b"))
        );
        assert!(entries[0].is_stfs());
        assert_eq!(entries[0].user_id(), Some(1000));
        assert_eq!((entries[1].fs_type.as_str(), entries[1].source.as_str()), ("tmpfs", "tmpfs"));
        assert!(!entries[1].is_stfs());
        assert_eq!(entries[1].user_id(), None);
        let old = parse("1 2 0:50 / /m rw - fuse stfs#/m.safetensors ro,user_id=0\n");
        assert!(old[0].is_stfs());
        let other = parse("1 2 0:50 / /m rw - fuse sshfs#host:/ ro,user_id=0\n");
        assert!(!other[0].is_stfs());
    }

    /// A mount point that is not UTF-8 (a user's FUSE mount named in Latin-1) is parsed as bytes,
    /// and the lines around it still are. Read as text, the whole table was lost: `stfs mount`
    /// saw nothing mounted anywhere and `stfs umount` no stfs mount.
    #[test]
    fn a_mount_point_that_is_not_utf8_hides_no_line() {
        let mut table = b"40 27 0:21 / /tmp/caf\xe9 rw,relatime - tmpfs t\xe9mp rw\n".to_vec();
        table.extend_from_slice(b"41 27 0:22 / /mnt/m rw - fuse.stfs /m.safetensors ro,user_id=0\n");
        let entries = parse(&table);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].mount_point.as_os_str().as_bytes(), b"/tmp/caf\xe9");
        assert_eq!(entries[0].source, "t\u{fffd}mp");
        assert!(entries[1].is_stfs() && entries[1].mount_point == Path::new("/mnt/m"));
    }

    #[test]
    fn locate_finds_mounts_through_symbolic_links_and_relative_spellings() {
        let (at, top) = locate(Path::new("/proc")).unwrap();
        assert_eq!((at.as_path(), top.map(|m| m.fs_type)), (Path::new("/proc"), Some("proc".to_string())));
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        assert_eq!(locate(&link).unwrap().0, Path::new("/proc"));
        assert_eq!(locate(&dir.path().join("link/")).unwrap().0, Path::new("/proc"));
        let plain = dir.path().join("plain");
        fs::create_dir(&plain).unwrap();
        let (at, top) = locate(&plain.join("../plain/.")).unwrap();
        assert_eq!((at, top), (fs::canonicalize(&plain).unwrap(), None));
        let looped = dir.path().join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        assert_eq!(locate(&looped).unwrap_err().raw_os_error(), Some(libc::ELOOP));
        assert_eq!(locate(&dir.path().join("missing/x")).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}

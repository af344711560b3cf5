//! Tests as an unprivileged user: `nobody` (uid and gid 65534) through setpriv, /dev/fuse opened to
//! every user while a test needs it, and private mount namespaces in which /dev/fuse or fusermount3
//! is taken away from that user without changing anything outside.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

use super::{force_unmount, output_within, tool_missing, wait_output, workdir, write_checkpoint, STFS, T, TIMEOUT};

/// The uid and gid of `nobody`.
pub const NOBODY: u32 = 65534;

/// Whether a program is found on PATH.
fn installed(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// Whether the tools of the non-root tests are here (setpriv, fusermount3, unshare); when one is
/// missing, [`tool_missing`] fails the test under CI or says why it is skipped.
pub fn nonroot_tools() -> bool {
    for (tool, install) in [
        ("setpriv", "apt-get install util-linux"),
        ("unshare", "apt-get install util-linux"),
        ("fusermount3", "apt-get install fuse3"),
    ] {
        if !installed(tool) {
            tool_missing(tool, install);
            return false;
        }
    }
    true
}

/// A command that runs `program` as nobody, with no supplementary groups.
pub fn as_nobody(program: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", program]);
    cmd
}

/// `stfs ARGS` run as nobody to completion (with [`TIMEOUT`]).
pub fn stfs_as_nobody(args: &[&str]) -> Output {
    output_within(as_nobody(STFS).args(args), TIMEOUT)
}

/// How many [`DevFuseOpen`] guards live, and the mode /dev/fuse had before the first.
static DEV_FUSE: Mutex<(usize, u32)> = Mutex::new((0, 0));

/// /dev/fuse opened to every user (mode 0666, as udev sets it on desktop distributions) while any
/// guard lives: the first guard sets the mode, the last puts the old one back.
pub struct DevFuseOpen(());

impl DevFuseOpen {
    pub fn new() -> DevFuseOpen {
        let mut state = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 == 0 {
            let mode = std::fs::metadata("/dev/fuse").expect("/dev/fuse").permissions().mode() & 0o7777;
            std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).expect("chmod /dev/fuse");
            state.1 = mode;
        }
        state.0 += 1;
        DevFuseOpen(())
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        let mut state = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(state.1));
        }
    }
}

/// A checkpoint and an empty mount point that nobody can use: the directory is 0755, the file 0644
/// and the mount point belongs to nobody (fusermount3 wants write access to it).
pub struct NobodyFixture {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    pub mount_point: PathBuf,
}

impl NobodyFixture {
    pub fn new(tensors: &[T]) -> NobodyFixture {
        let dir = workdir();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.path().join("model.safetensors");
        write_checkpoint(&file, tensors, None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mount_point = dir.path().join("m");
        std::fs::create_dir(&mount_point).unwrap();
        std::os::unix::fs::chown(&mount_point, Some(NOBODY), Some(NOBODY)).unwrap();
        NobodyFixture { dir, file, mount_point }
    }
}

/// A mount made by nobody with `stfs mount`; unmounted (by root, with umount2) when dropped.
pub struct NobodyMount {
    pub path: PathBuf,
}

impl NobodyMount {
    /// Mounts `fixture`'s checkpoint as nobody; the command must exit 0 and the mount be listed.
    pub fn new(fixture: &NobodyFixture) -> NobodyMount {
        let out = stfs_as_nobody(&["mount", fixture.file.to_str().unwrap(), fixture.mount_point.to_str().unwrap()]);
        let guard = NobodyMount { path: fixture.mount_point.clone() };
        assert!(out.status.success(), "stfs mount as nobody: {}", String::from_utf8_lossy(&out.stderr));
        let entry = super::wedge::mount_entry(&guard.path).expect("stfs mount returned 0 but nothing is mounted");
        assert_eq!(entry.fs_type, "fuse.stfs", "{entry:?}");
        assert!(entry.options.split(',').any(|o| o == "user_id=65534"), "{entry:?}");
        guard
    }
}

impl Drop for NobodyMount {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

/// What a private mount namespace takes away from nobody.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// /dev/fuse is mode 0600, owned by root: nobody cannot open it.
    DevFuseAccess,
    /// /dev/fuse is open to all, but every fusermount3 and fusermount is covered by /dev/null.
    Fusermount,
}

/// Sets up the namespace and drops to nobody; `$1` is a scratch directory, `$2` the mode of the
/// new /dev/fuse node, `$3` 1 to hide fusermount, `$4` and `$5` /dev/fuse's major and minor.
const NAMESPACE_SCRIPT: &str = r#"
scratch=$1 mode=$2 hide=$3 major=$4 minor=$5
shift 5
mount -t tmpfs -o mode=0755 stfs-test "$scratch" || exit 99
mknod -m "$mode" "$scratch/fuse" c "$major" "$minor" || exit 99
mount --bind "$scratch/fuse" /dev/fuse || exit 99
if [ "$hide" = 1 ]; then
  for f in $(command -v fusermount3 fusermount) /bin/fusermount3 /bin/fusermount /sbin/fusermount3 \
           /sbin/fusermount /usr/bin/fusermount3 /usr/bin/fusermount /usr/sbin/fusermount3 \
           /usr/sbin/fusermount /usr/local/bin/fusermount3 /usr/local/bin/fusermount; do
    if [ -e "$f" ]; then mount --bind /dev/null "$f" || exit 99; fi
  done
fi
exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
"#;

/// Runs `stfs ARGS` as nobody in a private mount namespace where `missing` is taken away. The
/// namespace starts as a copy of this one (so mounts made before are there) and nothing done in
/// it is seen outside; it ends with the command.
pub fn stfs_as_nobody_without(missing: Missing, args: &[&str]) -> Output {
    let scratch = workdir();
    let rdev = std::fs::metadata("/dev/fuse").expect("/dev/fuse").rdev();
    assert!(std::fs::metadata("/dev/fuse").unwrap().file_type().is_char_device());
    let (major, minor) = (libc::major(rdev).to_string(), libc::minor(rdev).to_string());
    let (mode, hide) = match missing {
        Missing::DevFuseAccess => ("0600", "0"),
        Missing::Fusermount => ("0666", "1"),
    };
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c", NAMESPACE_SCRIPT, "sh"])
        .args([scratch.path().to_str().unwrap(), mode, hide, &major, &minor, STFS])
        .args(args);
    let out = output_within(&mut command, TIMEOUT);
    assert_ne!(
        out.status.code(),
        Some(99),
        "setting up the namespace failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

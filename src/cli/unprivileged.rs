//! `stfs mount --drop-privileges USER` (`-o drop_privileges[=USER]`): root mounts with
//! [`crate::mount::premount::premount`], the daemon becomes USER (no capability, `no_new_privs`)
//! and serves the descriptor as `/dev/fd/N` would be served; and the limits of a premounted mount
//! that the command line enforces.

use std::fmt;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use log::{info, warn};

use crate::checkpoint;
use crate::cli::options::MountConfig;
use crate::cli::report::Failure;
use crate::mount::access::is_root;
use crate::mount::mountinfo;
use crate::mount::mountpoint::{check_not_hiding, set_kernel_readahead};
use crate::mount::own_mount::{OwnMount, Whereabouts};
use crate::mount::premount::{premount, PremountOptions};
use crate::mount::privileges::Identity;

/// The most `stfs mount SOURCE /dev/fd/N` waits for the kernel's INIT request on descriptor N.
pub const PREMOUNTED_WAIT: Duration = Duration::from_secs(10);

/// What the command line refuses about serving without privilege.
#[derive(Debug)]
pub enum UnprivilegedError {
    /// `--auto-unmount` with `/dev/fd/N`, or with `--drop-privileges`: no mount point to watch, or
    /// no privilege left to unmount it.
    NoMountPointToWatch,
    /// `--drop-privileges` by a user who is not root.
    NotRoot,
    /// `--drop-privileges` with `-f`.
    Foreground,
    /// `--drop-privileges` with a mount point `/dev/fd/N`.
    AlreadyMounted,
}

impl fmt::Display for UnprivilegedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnprivilegedError::NoMountPointToWatch => f.write_str(
                "--auto-unmount does not apply to a premounted descriptor or --drop-privileges: whoever mounted \
                 unmounts",
            ),
            UnprivilegedError::NotRoot => {
                f.write_str("--drop-privileges needs root: it mounts as root, then serves as the user")
            }
            UnprivilegedError::Foreground => {
                f.write_str("--drop-privileges serves in the background; it does not go with -f or -d")
            }
            UnprivilegedError::AlreadyMounted => {
                f.write_str("--drop-privileges mounts itself; with /dev/fd/N the caller mounted already")
            }
        }
    }
}

impl std::error::Error for UnprivilegedError {}

/// The user `--drop-privileges` names (root's uid for `-o drop_privileges` alone), once the
/// command line is checked to allow it; `None` without the option.
pub fn dropping_to(config: &MountConfig) -> Result<Option<Identity>, Failure> {
    let Some(user) = config.drop_privileges.as_deref() else { return Ok(None) };
    if config.foreground {
        return Err(Failure::usage(UnprivilegedError::Foreground));
    }
    if config.auto_unmount {
        return Err(Failure::usage(UnprivilegedError::NoMountPointToWatch));
    }
    if crate::mount::premounted::premounted_descriptor(&config.mountpoint).is_some() {
        return Err(Failure::usage(UnprivilegedError::AlreadyMounted));
    }
    if !is_root() {
        return Err(Failure::new(UnprivilegedError::NotRoot));
    }
    let identity = if user.is_empty() { Identity::root() } else { Identity::of_user(user).map_err(Failure::new)? };
    Ok(Some(identity))
}

/// A mount made by root for the daemon to serve as another user.
pub struct Premount {
    /// Its `/dev/fuse` descriptor.
    pub device: OwnedFd,
    /// Where.
    mount_point: PathBuf,
    /// Its mount ID, if mountinfo listed it.
    own: Option<OwnMount>,
}

/// Mounts for `config` (its mount point checked already) as [`premount`] does, owned by
/// `identity`, after checking that a local source is not under the mount point (the daemon cannot
/// look once mounted: its files would be behind the mount it is about to serve).
pub fn premount_for(config: &MountConfig, fsname: &str, identity: &Identity) -> Result<Premount, Failure> {
    let at = |e| Failure::at(config.mountpoint.display(), e);
    if !checkpoint::is_url(&config.source) {
        check_not_hiding(&config.mountpoint, [std::path::Path::new(&config.source)]).map_err(at)?;
    }
    let welcomes_others = config.allow_other || config.allow_root;
    let options = PremountOptions {
        fsname: fsname.to_string(),
        uid: identity.uid,
        gid: identity.gid,
        allow_other: welcomes_others,
        default_permissions: welcomes_others,
    };
    let device = premount(&config.mountpoint, &options)
        .map_err(|e| Failure::at(config.mountpoint.display(), crate::util::describe_io(&e)))?;
    let own = mountinfo::locate(&config.mountpoint).ok().and_then(|(_, top)| top).map(|top| OwnMount::new(top.id));
    Ok(Premount { device, mount_point: config.mountpoint.clone(), own })
}

impl Premount {
    /// The daemon serves it: root sets the kernel readahead (`kb` KiB; 0 leaves it), which the
    /// daemon, unprivileged, cannot.
    pub fn served(self, kb: u32) {
        if kb > 0 {
            if let Err(e) = set_kernel_readahead(&self.mount_point, kb) {
                info!("kernel readahead left at its default: {e}");
            }
        }
    }

    /// The daemon failed before serving: the mount is detached, if it is still the topmost at its
    /// mount point.
    pub fn withdraw(self) {
        drop(self.device);
        match self.own.map(|own| own.unmount(true)) {
            Some(Ok(Whereabouts::Top(_) | Whereabouts::Gone)) => {}
            Some(Ok(Whereabouts::Covered(at))) => warn!("{} is covered by another mount: left as it is", at.display()),
            Some(Err(e)) => warn!("{}: withdrawing the mount failed: {e}", self.mount_point.display()),
            None => warn!("{} is not known in mountinfo: left as it is", self.mount_point.display()),
        }
    }
}

//! The daemon's own mount, known by its mount ID ([`crate::mount::mountpoint::PendingMount`] reads
//! it before the mount is attached). It is found again in /proc/self/mountinfo by that ID,
//! wherever it is now (renaming a parent directory moves it), and unmounted only while it is the
//! topmost mount at its mount point: what was mounted over it (a tmpfs, a newer stfs mount after
//! `stfs umount -l`) is never touched, and a mount detached already is not looked for at its old
//! path. The same rule as the `auto_unmount` watcher's ([`crate::mount::watcher`]).
//!
//! Two `stfs mount` runs on one mount point can both pass the check made before forking; each
//! daemon then looks, right after attaching its mount, at what the mount sits on: one stacked on
//! another mount at the same mount point withdraws (through its own descriptor:
//! [`crate::mount::mountpoint::PendingMount::withdraw`]), so of racing mounts exactly the lowest
//! stays.

use std::path::PathBuf;

use crate::mount::mountinfo::{self, MountEntry};
use crate::mount::mountpoint::{unmount_own, MountPointError};

/// The daemon's own mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnMount {
    id: u64,
}

/// Where the daemon's mount is now, by mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whereabouts {
    /// The topmost mount at this mount point.
    Top(PathBuf),
    /// At this mount point, with another mount over it.
    Covered(PathBuf),
    /// Not listed: unmounted, or detached lazily while files on it are still open.
    Gone,
}

impl OwnMount {
    /// The mount with this mount ID.
    pub fn new(id: u64) -> OwnMount {
        OwnMount { id }
    }

    /// Its mount ID.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where it is now.
    pub fn whereabouts(&self) -> Whereabouts {
        whereabouts_in(&mountinfo::mounts(), self.id)
    }

    /// Unmounts it if it is the topmost mount at its mount point (`lazy`: MNT_DETACH), and says
    /// where it was; a mount covered by another, or gone, is left alone and its whereabouts
    /// returned. Between reading mountinfo and umount2(2) something could still be mounted over
    /// it: the same window as the watcher's.
    pub fn unmount(&self, lazy: bool) -> Result<Whereabouts, MountPointError> {
        let whereabouts = self.whereabouts();
        if let Whereabouts::Top(path) = &whereabouts {
            unmount_own(path, lazy)?;
        }
        Ok(whereabouts)
    }

    /// Whether it lost a race to another `stfs mount` at its mount point: it sits on another
    /// mount there (one that was not there when `stfs mount` checked the mount point), or is gone
    /// already (taken along when a mount under it withdrew).
    pub fn lost_race(&self) -> bool {
        let mounts = mountinfo::mounts();
        if mounts.iter().any(|m| m.id == self.id) {
            return stacked_in(&mounts, self.id);
        }
        // mountinfo read while mounts come and go may miss one: a second look confirms it.
        let mounts = mountinfo::mounts();
        !mounts.iter().any(|m| m.id == self.id) || stacked_in(&mounts, self.id)
    }
}

/// Whether the mount `id` is stacked on another mount at the same mount point, among `mounts`.
fn stacked_in(mounts: &[MountEntry], id: u64) -> bool {
    let Some(own) = mounts.iter().find(|m| m.id == id) else { return false };
    mounts.iter().any(|m| m.id == own.parent && m.mount_point == own.mount_point)
}

/// Where the mount `id` is among `mounts` (mountinfo's entries, in its order: of two at one
/// place, the later is on top).
fn whereabouts_in(mounts: &[MountEntry], id: u64) -> Whereabouts {
    let Some(own) = mounts.iter().find(|m| m.id == id) else { return Whereabouts::Gone };
    let top = mounts.iter().rev().find(|m| m.mount_point == own.mount_point);
    if top.is_some_and(|top| top.id == id) {
        Whereabouts::Top(own.mount_point.clone())
    } else {
        Whereabouts::Covered(own.mount_point.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "27 1 254:0 / / rw - ext4 /dev/vda rw\n\
                         40 27 0:50 / /mnt/a ro - fuse.stfs /m.safetensors ro,user_id=0\n\
                         41 40 0:51 / /mnt/a rw - tmpfs tmpfs rw\n\
                         42 27 0:52 / /mnt/b ro - fuse.stfs /m.safetensors ro,user_id=0\n";

    #[test]
    fn a_mount_is_on_top_covered_or_gone() {
        let mounts = mountinfo::parse(TABLE);
        assert_eq!(whereabouts_in(&mounts, 42), Whereabouts::Top("/mnt/b".into()));
        assert_eq!(whereabouts_in(&mounts, 41), Whereabouts::Top("/mnt/a".into()));
        assert_eq!(whereabouts_in(&mounts, 40), Whereabouts::Covered("/mnt/a".into()));
        assert_eq!(whereabouts_in(&mounts, 43), Whereabouts::Gone);
    }

    #[test]
    fn only_a_mount_on_another_at_its_own_mount_point_is_stacked() {
        let mounts = mountinfo::parse(TABLE);
        assert!(stacked_in(&mounts, 41));
        assert!(!stacked_in(&mounts, 40));
        assert!(!stacked_in(&mounts, 42));
        assert!(!stacked_in(&mounts, 43));
    }

    #[test]
    fn a_mount_not_listed_is_not_unmounted() {
        let gone = OwnMount::new(u64::MAX);
        assert_eq!(gone.unmount(false).unwrap(), Whereabouts::Gone);
        assert!(gone.lost_race());
    }
}

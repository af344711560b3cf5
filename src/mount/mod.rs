//! A mount's lifetime: building the filesystem, the FUSE session, signals, the background daemon and
//! the mount point itself.

pub mod daemon;
pub mod mountpoint;
pub mod session;

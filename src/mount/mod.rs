//! A mount's lifetime: building the filesystem ([`build`]), the FUSE session and its readiness
//! ([`session`]), the signals that end it ([`signals`]), going to the background ([`daemon`]), the
//! mount point itself ([`mountpoint`]), where the log goes ([`logging`], [`syslog`]) and the
//! `auto_unmount` watcher ([`watcher`]).
//!
//! Nothing here prints: every failure is a typed error that `cli` reports as one line.

pub mod build;
pub mod daemon;
pub mod logging;
pub mod mountpoint;
pub mod session;
pub mod signals;
pub mod syslog;
pub mod watcher;

//! A mount's lifetime: building the filesystem ([`build`]), the FUSE session and its readiness
//! ([`session`]), the signals that end it ([`signals`]), going to the background ([`daemon`]), the
//! mount point itself ([`mountpoint`]) and the daemon's own mount there ([`own_mount`]), where the
//! log goes ([`logging`], [`syslog`]) and the `auto_unmount` watcher ([`watcher`]), its counters
//! for Prometheus ([`metrics`], [`metrics_http`]); what a user needs to mount ([`access`]), what is mounted
//! where ([`mountinfo`]), and `stfs umount` ([`unmount`]), whose system calls have deadlines
//! ([`bounded`]). Serving without privilege: a descriptor mounted by someone else
//! ([`premounted`]), mounting for such a daemon and starting it ([`premount`]), and becoming an
//! unprivileged user ([`privileges`]), and a cgroup such servers join to outlive their starter's
//! container ([`cgroup`]). The soft limit on open descriptors is raised at start ([`limits`]).
//!
//! Nothing here prints: every failure is a typed error that `cli` reports as one line.

pub mod access;
pub mod bounded;
pub mod build;
pub mod cgroup;
pub mod daemon;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod metrics_http;
pub mod mountinfo;
pub mod mountpoint;
pub mod own_mount;
pub mod premount;
pub mod premounted;
pub mod privileges;
pub mod session;
pub mod signals;
pub mod syslog;
pub mod unmount;
pub mod watcher;

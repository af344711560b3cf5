//! `stfs csi`: a CSI v1 node plugin that mounts checkpoints for Kubernetes pods. The plugin runs as
//! root; for each shared volume it mounts `/dev/fuse` and hands it to an unprivileged daemon
//! (`crate::mount::premount`), then bind-mounts that one mount read-only into every pod's target.
//!
//! [`attributes`] and [`secrets`] check what a volume asks for; [`volumes`] publishes and
//! unpublishes, sharing and recovering mounts, with its facts in the state directory ([`state`]),
//! the daemons' processes ([`daemon_process`]) and the pods' binds ([`binds`]); [`identity`] and
//! [`node`] are the CSI services, [`server`] their gRPC endpoint. See docs/kubernetes.md.

pub mod attributes;
pub mod binds;
pub mod daemon_process;
pub mod identity;
pub mod node;
pub mod secrets;
pub mod server;
pub mod state;
pub mod volumes;

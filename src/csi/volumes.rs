//! Publishing and unpublishing, with sharing and recovery: a target is a read-only bind of its
//! volume's shared mount, one per node for a source, flags and secret; the mount is made (as root)
//! and handed to an unprivileged daemon when its first target is published, made again when its
//! daemon is found dead, and ended with its last target. Every fact is read from the state
//! directory and mountinfo under the locks (a volume's own lock for its mount and daemon, the
//! state lock for the target records), none kept in memory, so a plugin restarted at any point
//! carries on.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::csi::attributes::VolumeSpec;
use crate::csi::binds;
use crate::csi::daemon_process::{DaemonProcess, MARKER};
use crate::csi::secrets::PublishSecrets;
use crate::csi::state::{digest_of, remove_record, write_record, StateDir, StateLock, VolumeDir};
use crate::mount::cgroup::ServerCgroup;
use crate::mount::premount::{premount, spawn_server, PremountOptions, ServerSpawn, SpawnError};
use crate::mount::privileges::Identity;

/// Variables of the plugin's own environment its daemons are given too (never a credential: the
/// secrets of a volume are its only credentials).
const PASSED_ENVIRONMENT: &[&str] = &[
    "PATH",
    "RUST_LOG",
    "HF_ENDPOINT",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_EC2_METADATA_DISABLED",
    "STORAGE_EMULATOR_HOST",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
];

/// How long a daemon has to open its checkpoint and answer.
const SERVE_TIMEOUT: Duration = Duration::from_secs(90);

/// How often an unpublish reads its target's record again when a publish changed it meanwhile.
const UNPUBLISH_TRIES: usize = 3;

/// How long a daemon is given to exit on SIGTERM (then SIGKILL) once its mount is gone.
const STOP_PATIENCE: Duration = Duration::from_secs(2);

/// What the plugin publishes with.
#[derive(Debug, Clone)]
pub struct Volumes {
    /// The state directory.
    pub state: StateDir,
    /// The stfs binary the daemons run.
    pub program: PathBuf,
    /// The node's disk cache folder (`--cache-dir`), owned by the daemon user.
    pub cache_dir: Option<PathBuf>,
    /// Who the daemons run as.
    pub daemon_user: Identity,
    /// Whether a volume with no secret may use the node's own cloud identity
    /// (`--allow-node-credentials`); off, its daemon is told to ask no metadata server.
    pub node_credentials: bool,
    /// The cgroup the daemons join (`--daemon-cgroup`), so that they outlive the plugin's
    /// container; None: they stay in the plugin's.
    pub daemon_cgroup: Option<Arc<ServerCgroup>>,
}

/// Why a publish or an unpublish failed; no variant holds a secret.
#[derive(Debug)]
pub enum VolumeError {
    /// Something other than this volume is mounted at the target.
    Incompatible {
        /// The target.
        target: PathBuf,
    },
    /// The target path is a symbolic link (never followed: it could point anywhere on the node).
    LinkedTarget {
        /// The target.
        target: PathBuf,
    },
    /// A step on the node failed.
    Io {
        /// What was being done, and where.
        doing: String,
        /// Why.
        error: io::Error,
    },
    /// The daemon did not start serving.
    Serve {
        /// The volume's source.
        source: String,
        /// Why.
        error: SpawnError,
    },
}

impl fmt::Display for VolumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VolumeError::Incompatible { target } => {
                write!(f, "{}: another volume (or another source) is published there", target.display())
            }
            VolumeError::LinkedTarget { target } => {
                write!(f, "{}: is a symbolic link; a target must be a folder or missing", target.display())
            }
            VolumeError::Io { doing, error } => write!(f, "{doing}: {}", crate::util::describe_io(error)),
            VolumeError::Serve { source, error } => write!(f, "{source}: {error}"),
        }
    }
}

impl std::error::Error for VolumeError {}

/// `map_err` for an I/O step: says what was being done.
fn doing(what: impl fmt::Display) -> impl FnOnce(io::Error) -> VolumeError {
    let doing = what.to_string();
    move |error| VolumeError::Io { doing, error }
}

impl Volumes {
    /// The shared volume `spec` and `secrets` give: a digest of all that makes mounts differ.
    pub fn volume_name(spec: &VolumeSpec, secrets: &PublishSecrets) -> String {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(digest_of(&[spec.source.as_bytes()]).as_bytes());
        for flag in &spec.flags {
            context.update(flag.as_bytes());
            context.update(b"\0");
        }
        context.update(if spec.node_cache { b"cache" } else { b"nocache" });
        secrets.digest_into(&mut context);
        crate::csi::state::hex(&context.finish().as_ref()[..16])
    }

    /// Publishes `spec` at `target` (created if missing): the volume's shared mount made or
    /// recovered, then bound read-only there. Publishing the same again is a success; another
    /// volume at the target is [`VolumeError::Incompatible`]. The volume's own lock is held while
    /// it is mounted and its daemon starts; the state lock only while records are read or written,
    /// so a slow source holds up no other volume.
    pub fn publish(&self, target: &Path, spec: &VolumeSpec, secrets: &PublishSecrets) -> Result<(), VolumeError> {
        refuse_link(target)?;
        let name = Self::volume_name(spec, secrets);
        let recorded = {
            let _state = self.lock_state()?;
            match self.target_state(target, &name)? {
                TargetState::Published => return Ok(()),
                TargetState::Recorded(v) => Some(v),
                TargetState::Free => None,
            }
        };
        // A record without a mount: a publish cut short, or a bind someone took away.
        if let Some(stale) = recorded.filter(|v| *v != name) {
            let _volume = self.lock_volume(&stale)?;
            self.forget_target(&stale, target)?;
        }
        let _volume_lock = self.lock_volume(&name)?;
        let volume = self.state.volume(&name);
        if let Err(e) = self.serve(&name, &volume, spec, secrets) {
            // A volume that never served anyone leaves nothing behind (its key file included).
            let _ = self.end_if_unused(&name, &volume);
            return Err(e);
        }
        let bound = self.bind_target(&name, &volume, target);
        if bound.is_err() {
            let _ = self.end_if_unused(&name, &volume);
        }
        bound
    }

    /// Records and binds `target` to volume `name` (served), under the state lock: what another
    /// publish did to the target meanwhile is looked at again first.
    fn bind_target(&self, name: &str, volume: &VolumeDir, target: &Path) -> Result<(), VolumeError> {
        let _state = self.lock_state()?;
        refuse_link(target)?;
        match self.target_state(target, name)? {
            TargetState::Published => return Ok(()),
            TargetState::Recorded(v) => self.forget_records(&v, target)?,
            TargetState::Free => {}
        }
        match std::fs::create_dir(target) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(doing(target.display())(e)),
            _ => {}
        }
        // The records first: a plugin killed after the bind leaves a target its successor knows.
        let text = format!("{name}\n{}\n", target.display());
        // The target's record before the volume's user record: a plugin killed between the two
        // leaves a record an unpublish clears, never a reference that keeps the volume for ever.
        write_record(&self.state.target_record(target), &text)
            .and_then(|()| write_record(&volume.user_record(target), &target.display().to_string()))
            .map_err(doing("recording the target"))?;
        if let Err(error) = binds::bind_read_only(&volume.mount_point(), target) {
            self.forget_records(name, target)?;
            return Err(VolumeError::Io { doing: format!("binding {}", target.display()), error });
        }
        log::info!("published volume {name} at {}", target.display());
        Ok(())
    }

    /// What is at `target` for a publish of volume `name` (under the state lock): published
    /// already, recorded without a mount, or free; a mount of anything else is
    /// [`VolumeError::Incompatible`].
    fn target_state(&self, target: &Path, name: &str) -> Result<TargetState, VolumeError> {
        let recorded = self.state.volume_of_target(target).map_err(doing("reading the target's record"))?;
        let mounted = binds::is_mounted(target).map_err(doing(target.display()))?;
        match recorded {
            Some(v) if v == name && mounted => Ok(TargetState::Published),
            Some(_) | None if mounted => Err(VolumeError::Incompatible { target: target.to_path_buf() }),
            Some(v) => Ok(TargetState::Recorded(v)),
            None => Ok(TargetState::Free),
        }
    }

    /// Unpublishes `target`: its bind detached (never asking the daemon anything), the folder
    /// removed, and its volume's mount ended if no other target uses it. A target that is not
    /// published is a success.
    pub fn unpublish(&self, target: &Path) -> Result<(), VolumeError> {
        let mut recorded = {
            let _state = self.lock_state()?;
            self.state.volume_of_target(target).map_err(doing("reading the target's record"))?
        };
        // The volume's lock comes before the state lock: the record is read again under both.
        for _ in 0..UNPUBLISH_TRIES {
            let _volume_lock = recorded.as_deref().map(|name| self.lock_volume(name)).transpose()?;
            let state = self.lock_state()?;
            let now = self.state.volume_of_target(target).map_err(doing("reading the target's record"))?;
            if now != recorded {
                recorded = now;
                continue;
            }
            if is_link(target) {
                // Removed, never followed (nothing of ours is mounted on a link).
                remove_record(target).map_err(doing(format!("removing the link {}", target.display())))?;
            } else if recorded.is_some() || is_stfs_mount(target) {
                binds::detach(target).map_err(doing(format!("detaching {}", target.display())))?;
            }
            binds::remove_target(target).map_err(doing(format!("removing {}", target.display())))?;
            let Some(name) = recorded else { return Ok(()) };
            self.forget_records(&name, target)?;
            drop(state);
            self.end_if_unused(&name, &self.state.volume(&name))?;
            log::info!("unpublished volume {name} at {}", target.display());
            return Ok(());
        }
        Err(doing(format!("unpublishing {}", target.display()))(io::Error::other(
            "its record kept changing (publishes racing on the target); try again",
        )))
    }

    /// Ends every shared mount that no target uses (left by a plugin killed between mounting and
    /// recording its first target); called at start.
    pub fn sweep(&self) -> Result<(), VolumeError> {
        // One volume that cannot be ended is logged and left: the plugin still starts.
        for name in self.state.volumes().map_err(doing("listing the state directory"))? {
            let ended = self.lock_volume(&name).and_then(|_lock| self.end_if_unused(&name, &self.state.volume(&name)));
            if let Err(e) = ended {
                log::error!("volume {name}: not ended at start: {e}");
            }
        }
        Ok(())
    }

    /// Takes the state lock (target records).
    fn lock_state(&self) -> Result<StateLock, VolumeError> {
        self.state.lock().map_err(doing("locking the state directory"))
    }

    /// Takes volume `name`'s lock (its mount and daemon).
    fn lock_volume(&self, name: &str) -> Result<StateLock, VolumeError> {
        self.state.lock_volume(name).map_err(doing(format!("locking volume {name}")))
    }

    /// Drops `target`'s records and, with its last user, the volume's mount (the volume's lock
    /// held).
    fn forget_target(&self, name: &str, target: &Path) -> Result<(), VolumeError> {
        {
            let _state = self.lock_state()?;
            if self.state.volume_of_target(target).map_err(doing("reading the target's record"))?.as_deref()
                == Some(name)
                && !binds::is_mounted(target).map_err(doing(target.display()))?
            {
                self.forget_records(name, target)?;
            }
        }
        self.end_if_unused(name, &self.state.volume(name))
    }

    /// Drops `target`'s records of volume `name` (the state lock held): its user record first, so
    /// that a plugin killed between the two leaves no reference behind.
    fn forget_records(&self, name: &str, target: &Path) -> Result<(), VolumeError> {
        remove_record(&self.state.volume(name).user_record(target))
            .and_then(|()| remove_record(&self.state.target_record(target)))
            .map_err(doing("removing the target's records"))
    }

    /// Ends volume `name`'s mount if no target uses it (the volume's lock held).
    fn end_if_unused(&self, name: &str, volume: &VolumeDir) -> Result<(), VolumeError> {
        if volume.user_count().map_err(doing("counting a volume's users"))? == 0 {
            self.tear_down(name, volume)?;
        }
        Ok(())
    }

    /// Ends a shared mount: detached, its daemon stopped (it exits by itself once the mount is
    /// gone), its folder removed.
    fn tear_down(&self, name: &str, volume: &VolumeDir) -> Result<(), VolumeError> {
        binds::detach(&volume.mount_point()).map_err(doing(format!("detaching volume {name}")))?;
        if let Ok(Some(process)) = DaemonProcess::read_record(&volume.daemon_record()) {
            process.stop(STOP_PATIENCE);
        }
        volume.remove().map_err(doing(format!("removing volume {name}'s folder")))?;
        log::info!("volume {name}: last user gone, unmounted");
        Ok(())
    }

    /// Makes sure volume `name` is mounted with a live daemon: kept as it is if so; otherwise a
    /// dead daemon's mount is detached (without a look at it) and the volume mounted anew.
    fn serve(
        &self,
        name: &str,
        volume: &VolumeDir,
        spec: &VolumeSpec,
        secrets: &PublishSecrets,
    ) -> Result<(), VolumeError> {
        let owner = (self.daemon_user.uid, self.daemon_user.gid);
        volume.create(owner).map_err(doing(format!("creating volume {name}'s folder")))?;
        let process =
            DaemonProcess::read_record(&volume.daemon_record()).map_err(doing("reading the daemon's record"))?;
        let mount_point = volume.mount_point();
        let mounted = binds::is_mounted(&mount_point).map_err(doing(mount_point.display()))?;
        if mounted && process.is_some_and(|p| p.is_alive()) {
            return Ok(());
        }
        if mounted {
            log::warn!("volume {name}: its daemon is gone; mounting it again");
            binds::detach(&mount_point).map_err(doing(format!("detaching volume {name}")))?;
        }
        if let Some(process) = process {
            process.stop(STOP_PATIENCE);
        }
        remove_record(&volume.daemon_record()).map_err(doing("removing the daemon's record"))?;
        let fsname = if crate::checkpoint::is_url(&spec.source) {
            crate::source::http::display_name(&spec.source)
        } else {
            spec.source.clone()
        };
        let options = PremountOptions {
            fsname,
            uid: self.daemon_user.uid,
            gid: self.daemon_user.gid,
            allow_other: true,
            default_permissions: true,
        };
        let device = premount(&mount_point, &options).map_err(doing(format!("mounting volume {name}")))?;
        let environment = self.environment(name, volume, secrets)?;
        let spawn = ServerSpawn {
            program: self.program.clone(),
            source: OsString::from(&spec.source),
            args: self.daemon_args(volume, spec),
            device: &device,
            identity: self.daemon_user.clone(),
            env: environment,
            timeout: SERVE_TIMEOUT,
            cgroup: self.daemon_cgroup.as_deref().map(ServerCgroup::joiner),
        };
        let served = spawn_server(&spawn);
        drop(device);
        if let Err(error) = served {
            let _ = binds::detach(&mount_point);
            return Err(VolumeError::Serve { source: display_source(&spec.source), error });
        }
        let Some(process) = DaemonProcess::find(name) else {
            let _ = binds::detach(&mount_point);
            return Err(doing(format!("volume {name}"))(io::Error::other("its daemon exited right after starting")));
        };
        write_record(&volume.daemon_record(), &process.to_record()).map_err(doing("recording the daemon"))?;
        log::info!("volume {name}: {} served by daemon {}", display_source(&spec.source), process.pid);
        Ok(())
    }

    /// The daemon's whole environment: the plugin's [`PASSED_ENVIRONMENT`], the volume's secrets,
    /// the switches that keep it off the node's own cloud identity (unless
    /// `--allow-node-credentials`), and the marker that finds it.
    fn environment(
        &self,
        name: &str,
        volume: &VolumeDir,
        secrets: &PublishSecrets,
    ) -> Result<Vec<(OsString, OsString)>, VolumeError> {
        let mut environment: Vec<(OsString, OsString)> =
            PASSED_ENVIRONMENT.iter().filter_map(|&k| std::env::var_os(k).map(|v| (OsString::from(k), v))).collect();
        let owner = (self.daemon_user.uid, self.daemon_user.gid);
        let private = secrets
            .environment(&volume.private(), owner)
            .map_err(doing(format!("writing volume {name}'s key file")))?;
        environment.extend(private.into_iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
        if !self.node_credentials {
            // Only the volume's own secrets: never the node's identity (a confused deputy).
            environment.retain(|(k, _)| k != "AWS_EC2_METADATA_DISABLED");
            environment.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
            environment.push((crate::source::object::NO_AMBIENT_CREDENTIALS.into(), "1".into()));
        }
        environment.push((OsString::from(MARKER), OsString::from(name)));
        Ok(environment)
    }

    /// `stfs mount` arguments before the source: `allow_other` (the mount was made with it), the
    /// volume's flags, the log file in the daemon's folder, the node cache.
    fn daemon_args(&self, volume: &VolumeDir, spec: &VolumeSpec) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["-o".into(), "allow_other".into()];
        args.extend(spec.flags.iter().map(OsString::from));
        args.push("--log-file".into());
        args.push(volume.private().join("daemon.log").into());
        if let (true, Some(dir)) = (spec.node_cache, &self.cache_dir) {
            args.push("--cache-dir".into());
            args.push(dir.into());
        }
        args
    }
}

/// What a publish finds at its target.
enum TargetState {
    /// The volume is bound there already.
    Published,
    /// A record of this volume, or of another, without a mount.
    Recorded(String),
    /// Nothing.
    Free,
}

/// The source as logs and errors show it: a URL without its query (a signed URL's signature).
fn display_source(source: &str) -> String {
    if crate::checkpoint::is_url(source) {
        crate::source::http::display_name(source)
    } else {
        source.to_string()
    }
}

/// Whether `path` is a symbolic link (not followed).
fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// [`VolumeError::LinkedTarget`] if `target` is a symbolic link.
fn refuse_link(target: &Path) -> Result<(), VolumeError> {
    if is_link(target) {
        return Err(VolumeError::LinkedTarget { target: target.to_path_buf() });
    }
    Ok(())
}

/// Whether the topmost mount at `target` is an stfs mount (a bind of one shows its type too).
fn is_stfs_mount(target: &Path) -> bool {
    crate::mount::mountinfo::locate(target).is_ok_and(|(_, top)| top.is_some_and(|m| m.is_stfs()))
}

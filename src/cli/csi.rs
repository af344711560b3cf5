//! `stfs csi`: the node plugin's flags checked, its node cache folder made the daemon user's, the
//! state directory opened (shared mounts no pod uses any more ended), then the gRPC server.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::cli::args::CsiArgs;
use crate::cli::report::Failure;
use crate::csi::server::{serve, socket_path};
use crate::csi::state::StateDir;
use crate::csi::volumes::Volumes;
use crate::mount::cgroup::ServerCgroup;
use crate::mount::privileges::Identity;

/// Runs `stfs csi` until killed.
pub fn run(args: CsiArgs) -> Result<ExitCode, Failure> {
    let socket = socket_path(&args.endpoint).map_err(Failure::usage)?;
    if args.node_id.is_empty() {
        return Err(Failure::usage("--node-id: empty (give this node's name)"));
    }
    if !crate::mount::access::is_root() {
        return Err(Failure::new("stfs csi mounts for pods and must run as root (the daemons it starts do not)"));
    }
    let mut identity = Identity::of_user(&args.daemon_user).map_err(Failure::usage)?;
    // The daemons need no supplementary group; the files they serve are readable by others.
    identity.groups.clear();
    if identity.uid == 0 {
        return Err(Failure::usage("--daemon-user: the mount daemons must not run as root"));
    }
    if std::env::var_os("RUST_LOG").is_none() {
        // Before any thread starts: the plugin's publish lines are its record.
        std::env::set_var("RUST_LOG", "stfs=info,warn");
    }
    crate::mount::logging::init_logging(None);
    if let Some(dir) = &args.cache_dir {
        prepare_cache_dir(dir, &identity)?;
    }
    let state = StateDir::open(&args.state_dir).map_err(|e| Failure::at(args.state_dir.display(), e))?;
    let program = std::env::current_exe().map_err(|e| Failure::io("the stfs binary's path", e))?;
    let cache_dir = match &args.cache_dir {
        Some(dir) => Some(std::path::absolute(dir).map_err(|e| Failure::at(dir.display(), e))?),
        None => None,
    };
    let daemon_cgroup = match &args.daemon_cgroup {
        Some(dir) => Some(Arc::new(ServerCgroup::open(dir).map_err(|e| Failure::new(format!("--daemon-cgroup {e}")))?)),
        None => None,
    };
    let volumes = Volumes {
        state,
        program,
        cache_dir,
        daemon_user: identity,
        node_credentials: args.allow_node_credentials,
        daemon_cgroup,
    };
    volumes.sweep().map_err(Failure::new)?;
    serve(&socket, args.node_id, volumes).map_err(Failure::new)?;
    Ok(ExitCode::SUCCESS)
}

/// Makes `dir` (created if missing; never a link) the daemon user's, mode 0700, as `--cache-dir`
/// requires of the user who mounts.
fn prepare_cache_dir(dir: &Path, user: &Identity) -> Result<(), Failure> {
    let at = |e| Failure::at(dir.display(), e);
    std::fs::create_dir_all(dir).map_err(at)?;
    let meta = std::fs::symlink_metadata(dir).map_err(at)?;
    if !meta.is_dir() {
        return Err(Failure::at(dir.display(), "not a directory (a link is not followed)"));
    }
    if (meta.uid(), meta.gid()) != (user.uid, user.gid) {
        std::os::unix::fs::lchown(dir, Some(user.uid), Some(user.gid)).map_err(at)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(at)
}

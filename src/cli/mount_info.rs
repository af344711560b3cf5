//! `stfs mount-info PATH`: what is mounted at a path, read from /proc/self/mountinfo without
//! touching the mount, as one JSON line. The Python package asks this instead of parsing mountinfo
//! with rules of its own.

use std::process::ExitCode;

use crate::cli::args::MountInfoArgs;
use crate::cli::report::Failure;
use crate::mount::mountinfo;

/// Runs `stfs mount-info`: `{"path", "mounted", "stfs", "fs_type", "source"}`, where `path` is the
/// mount point the path resolves to, `stfs` whether the topmost mount there is stfs's, and the
/// last two null when nothing is mounted (as at a path that does not exist). Paths and sources that
/// are not UTF-8 are shown lossily.
pub fn run(args: MountInfoArgs) -> Result<ExitCode, Failure> {
    let (at, top) = match mountinfo::locate(&args.path) {
        Ok(found) => found,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (args.path.clone(), None),
        Err(e) => return Err(Failure::at(args.path.display(), e)),
    };
    let info = serde_json::json!({
        "path": at.to_string_lossy(),
        "mounted": top.is_some(),
        "stfs": top.as_ref().is_some_and(|m| m.is_stfs()),
        "fs_type": top.as_ref().map(|m| m.fs_type.clone()),
        "source": top.as_ref().map(|m| m.source.clone()),
    });
    println!("{info}");
    Ok(ExitCode::SUCCESS)
}

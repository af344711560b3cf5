//! A source opened as `stfs mount` opens it, for a reader in this process instead of a mount (the
//! Python module, `src/python/`): the same flags and `-o` options (those of `STFS_OPTIONS_*`
//! included), credential chains, limits and disk cache, and the same one-line failures.

use std::ffi::OsString;
use std::sync::Arc;

use clap::Parser;

use crate::checkpoint;
use crate::cli::args::{Cli, Command, MountArgs};
use crate::cli::options::{ConfigError, MountConfig};
use crate::cli::report::{self, Failure};
use crate::fs::Fs;
use crate::stats::Stats;

/// Stands for the mount point `stfs mount` needs on its command line: nothing is mounted, so it is
/// never looked at.
const NO_MOUNT_POINT: &str = "/";

/// The filesystem a mount of `source` with `flags` (`stfs mount`'s, `-o` lists included) would
/// serve, built in this process: nothing is mounted, no `/dev/fuse` is needed. A flag that only
/// concerns a mount (`--threads`, `--allow-other`) is accepted and has no effect. The error is the
/// line `stfs mount` prints for the same source and flags: `stfs: PATH: problem`, or clap's
/// `error: ...` line for a bad flag. Without `prefetch` the engine reads only the blocks asked for
/// (no I/O threads read ahead): what a reader of slices that runs its own reads in parallel wants.
pub fn open_unmounted(source: &str, flags: &[String], prefetch: bool) -> Result<Arc<Fs>, String> {
    let mut line: Vec<OsString> = ["stfs", "mount"].iter().map(OsString::from).collect();
    line.extend(flags.iter().map(OsString::from));
    line.extend(["--", source, NO_MOUNT_POINT].iter().map(OsString::from));
    let args = match Cli::try_parse_from(line) {
        Ok(Cli { command: Command::Mount(args), .. }) => args,
        // The command parsed is the `mount` put in front of the flags; a flag cannot change it.
        Ok(_) => return Err("stfs: error: the flags given name another command".into()),
        // clap's first line names the flag ("error: unexpected argument '--nope' found").
        Err(e) => return Err(e.to_string().lines().next().unwrap_or_default().to_string()),
    };
    opened(*args, prefetch).map_err(|failure| report::line(&failure))
}

fn opened(args: MountArgs, prefetch: bool) -> Result<Arc<Fs>, Failure> {
    let args = crate::cli::option_list::with_env_lists(args, std::env::vars_os())
        .map_err(|name| Failure::from(ConfigError::EnvOptionsNotUtf8(name)))?;
    let mut config = MountConfig::from_args(args)?;
    if !prefetch {
        config.engine.io_threads = 0;
    }
    let stats = Arc::new(Stats::default());
    let open_options = config.open_options(stats.clone())?;
    let opened = checkpoint::open(&config.source, &open_options)?;
    let mut fs_options = config.fs_options();
    crate::cli::mount::build_opened(&config, opened, &mut fs_options, &stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file opens with a mount's flags, and its bytes are read with no mount anywhere; a bad
    /// flag and a missing file are the CLI's one lines.
    #[test]
    fn opens_with_a_mounts_flags_and_fails_in_its_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let tensors = [("w".to_string(), crate::format::Dtype::U8, vec![3], vec![7u8, 8, 9])];
        crate::util::test_support::write_new(&path, crate::format::writer::serialize(&tensors, None).unwrap());
        let fs = open_unmounted(path.to_str().unwrap(), &["--cache-size".into(), "1M".into()], true).unwrap();
        let tensor = &fs.namespace().tensors()[0];
        assert_eq!((tensor.name.as_str(), tensor.len), ("w", 3));
        let err = open_unmounted(path.to_str().unwrap(), &["--nope".into()], true).err().unwrap();
        assert_eq!(err, "error: unexpected argument '--nope' found");
        let missing = dir.path().join("gone.safetensors");
        let err = open_unmounted(missing.to_str().unwrap(), &[], true).err().unwrap();
        assert_eq!(err, format!("stfs: {}: no such file or directory", missing.display()));
    }
}

//! `stfs cache info|clear DIR`: what a disk cache directory (`--cache-dir`) holds, and emptying it.

use std::process::ExitCode;
use std::time::SystemTime;

use crate::cli::args::{CacheAction, CacheArgs};
use crate::cli::report::{print_out, Failure};
use crate::engine::disk;
use crate::util::size::format_size;

/// Runs `stfs cache`.
pub fn run(args: CacheArgs) -> Result<ExitCode, Failure> {
    match args.action {
        CacheAction::Info { dir } => {
            if !dir.is_dir() {
                return Err(Failure::io(dir.display(), std::io::Error::from(std::io::ErrorKind::NotFound)));
            }
            let info = disk::info(&dir).map_err(|e| Failure::io(dir.display(), e))?;
            let mut text = format!(
                "directory: {}\nblocks: {}\nextent files: {}\nbytes: {} ({})\nsources: {}\ntemporary files: {}\n",
                dir.display(),
                info.blocks,
                info.extents,
                info.bytes,
                format_size(info.bytes),
                info.objects,
                info.temps
            );
            if let Some((oldest, newest)) = info.used {
                text.push_str(&format!("least recently used: {} ago\n", ago(oldest)));
                text.push_str(&format!("most recently used: {} ago\n", ago(newest)));
            }
            print_out(&text)
        }
        CacheAction::Clear { dir } => {
            let (files, bytes) = disk::clear(&dir).map_err(|e| Failure::io(dir.display(), e))?;
            print_out(&format!("removed {files} files ({}) from {}\n", format_size(bytes), dir.display()))
        }
    }
}

/// How long ago `when` was, in whole seconds, minutes, hours or days.
fn ago(when: SystemTime) -> String {
    let secs = SystemTime::now().duration_since(when).map_or(0, |d| d.as_secs());
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

//! `stfs cache info|clear DIR`: what a disk cache directory (`--cache-dir`) holds, and emptying it.

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use crate::cli::args::{CacheAction, CacheArgs};
use crate::cli::progress::human;
use crate::cli::report::{print_out, Failure};
use crate::engine::disk;
use crate::format::PrintablePath;

/// Runs `stfs cache`.
pub fn run(args: CacheArgs) -> Result<ExitCode, Failure> {
    match args.action {
        CacheAction::Info { dir } => {
            require_dir(&dir)?;
            let info = disk::info(&dir).map_err(|e| Failure::io(dir.display(), e))?;
            print_out(&info_text(&dir.display().to_string(), &info))
        }
        CacheAction::Clear { dir } => {
            require_dir(&dir)?;
            let (files, bytes) = disk::clear(&dir).map_err(|e| Failure::io(dir.display(), e))?;
            print_out(&format!("removed {files} files ({}) from {}\n", human(bytes as f64), dir.display()))
        }
    }
}

/// What `stfs cache info` prints for `dir`: counts, and the bytes with a readable size beside them.
fn info_text(dir: &str, info: &disk::CacheInfo) -> String {
    let mut text = format!(
        "directory: {dir}\nblocks: {}\nextent files: {}\nbytes: {} ({})\nsources: {}\ntemporary files: {}\n",
        info.blocks,
        info.extents,
        info.bytes,
        human(info.bytes as f64),
        info.objects,
        info.temps
    );
    if let Some((oldest, newest)) = info.used {
        text.push_str(&format!("least recently used: {} ago\n", ago(oldest)));
        text.push_str(&format!("most recently used: {} ago\n", ago(newest)));
    }
    text
}

/// Fails unless `dir` is a directory (a link to one is followed), with the reason as the system
/// words it: a mistyped DIR is an error for `clear` as for `info`, never "removed 0 files".
fn require_dir(dir: &Path) -> Result<(), Failure> {
    let meta = std::fs::metadata(dir).map_err(|e| Failure::io(PrintablePath(&dir.to_string_lossy()), e))?;
    if !meta.is_dir() {
        let e = std::io::Error::from_raw_os_error(libc::ENOTDIR);
        return Err(Failure::io(PrintablePath(&dir.to_string_lossy()), e));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::cli::args::{CacheAction, CacheArgs};
    use crate::cli::cache::{info_text, run};
    use crate::engine::disk::CacheInfo;

    /// The size beside the byte count is readable: it used to be the exact-unit form, which for
    /// block files (never a round number of bytes) repeated the count (`bytes: 800272 (800272)`).
    #[test]
    fn info_shows_a_readable_size_beside_the_bytes() {
        let info = CacheInfo { blocks: 7, extents: 1, bytes: 800_272, objects: 1, temps: 0, used: None };
        let text = info_text("/c", &info);
        assert!(text.contains("\nbytes: 800272 (781.5 KiB)\n"), "{text}");
        let empty = CacheInfo { blocks: 0, extents: 0, bytes: 0, objects: 0, temps: 0, used: None };
        assert!(info_text("/c", &empty).contains("\nbytes: 0 (0.0 B)\n"));
    }

    fn error_of(action: CacheAction) -> String {
        run(CacheArgs { action }).expect_err("a DIR that is not a directory is refused").to_string()
    }

    /// A missing DIR, or a file given as DIR, is one line naming it and why, for `info` and `clear`
    /// alike: `clear` of a mistyped DIR used to report "removed 0 files" and succeed, and `info`
    /// called a regular file "entity not found".
    #[test]
    fn a_dir_that_is_not_a_directory_is_refused_by_info_and_clear() {
        let work = tempfile::tempdir().unwrap();
        let missing = work.path().join("missing");
        let file = work.path().join("file");
        crate::util::test_support::write_new(&file, b"x");
        let actions: [fn(PathBuf) -> CacheAction; 2] =
            [|dir| CacheAction::Info { dir }, |dir| CacheAction::Clear { dir }];
        for make in actions {
            let shown = missing.display();
            assert_eq!(error_of(make(missing.clone())), format!("{shown}: no such file or directory"));
            assert_eq!(error_of(make(file.clone())), format!("{}: not a directory", file.display()));
        }
        let odd = PathBuf::from(format!("{}/a\u{1b}[2Jb", work.path().display()));
        let shown = error_of(CacheAction::Clear { dir: odd });
        assert!(shown.ends_with("a\\u{1b}[2Jb: no such file or directory"), "{shown}");
    }
}

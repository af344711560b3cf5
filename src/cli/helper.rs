//! Answering as mount(8)'s helper, so `mount -t fuse.stfs` and fstab lines work.
//!
//! util-linux runs `/sbin/mount.fuse.stfs SOURCE MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTS]` (the binary,
//! linked under that name by `stfs install-helper`). Without that link, fuse3's `mount.fuse` runs
//! `stfs SOURCE MOUNTPOINT -o OPTS` from PATH instead. Both are translated into `stfs mount`, which
//! returns only once the mount answers, as mount(8) expects of a helper.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::cli::args::{InstallHelperArgs, MountArgs};
use crate::cli::option_list;
use crate::cli::options::MountConfig;
use crate::cli::report::Failure;

/// The name mount(8) looks for in /sbin (and /usr/sbin) for the type `fuse.stfs`.
pub const HELPER_NAME: &str = "mount.fuse.stfs";

/// Options mount(8) adds on its own that mean nothing to a filesystem that is always read-only:
/// `rw` is what it passes when the fstab line or command line does not say `ro`.
const DROPPED_OPTIONS: &[&str] = &["rw"];

const HELPER_USAGE: &str = "\
usage: mount.fuse.stfs SOURCE MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPT[,OPT...]]
  the mount(8) helper of stfs: `mount -t fuse.stfs SOURCE MOUNTPOINT -o OPTS` runs it.
  -f only checks SOURCE, MOUNTPOINT and OPTS; -v says what is mounted; -s and -n are accepted.
  Options are those of `stfs mount --help`; `rw`, which mount(8) adds by default, is ignored.
  -o drop_privileges (mount.fuse3's): mount as root, serve with no capability and no_new_privs;
  -o drop_privileges=USER serves as USER.";

/// A helper call that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperError {
    /// An argument that is not UTF-8.
    NotUtf8(OsString),
    /// `-o` or `-t` at the end, without its value.
    NeedsValue(&'static str),
    /// `-t` with a type other than stfs's.
    WrongType(String),
    /// A flag mount(8) does not pass.
    UnknownFlag(char),
    /// Not exactly SOURCE and MOUNTPOINT: how many positional arguments were given.
    Arguments(usize),
}

impl fmt::Display for HelperError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelperError::NotUtf8(arg) => write!(f, "argument {arg:?} is not UTF-8"),
            HelperError::NeedsValue(flag) => write!(f, "`{flag}` needs a value"),
            HelperError::WrongType(kind) => write!(f, "type `{kind}` is not stfs's (use -t fuse.stfs)"),
            HelperError::UnknownFlag(flag) => write!(f, "unknown flag `-{flag}`\n{HELPER_USAGE}"),
            HelperError::Arguments(n) => write!(f, "expected SOURCE and MOUNTPOINT, got {n} arguments\n{HELPER_USAGE}"),
        }
    }
}

impl std::error::Error for HelperError {}

/// Why `stfs install-helper` left the link as it was.
#[derive(Debug)]
enum InstallError {
    /// `--remove` of something that is not a symbolic link.
    NotALink,
    /// `--remove` of a link that is not there.
    NotInstalled,
    /// Something else is there already: `a file` or `a link to ...`.
    Exists(String),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::NotALink => f.write_str("not a symbolic link; left alone"),
            InstallError::NotInstalled => f.write_str("not installed"),
            InstallError::Exists(what) => write!(f, "already exists ({what}); --force replaces it"),
        }
    }
}

impl std::error::Error for InstallError {}

/// A helper call, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCall {
    /// The checkpoint.
    pub source: String,
    /// Where to mount it.
    pub mountpoint: PathBuf,
    /// The `-o` options, split on commas (`\,` kept inside one, escaped), without the ones mount(8)
    /// adds by default.
    pub options: Vec<String>,
    /// `-f`: check everything, mount nothing (mount(8)'s "fake").
    pub fake: bool,
    /// `-v`: say what is being mounted.
    pub verbose: bool,
    /// `-h`: print the usage.
    pub help: bool,
}

/// Whether the command line (`args[0]` included) is a helper call rather than a subcommand: the
/// program was started as `mount.fuse.stfs`, or its first argument is an existing path or a URL
/// (how fuse3's `mount.fuse` calls the program named by the type).
pub fn is_helper_call(args: &[OsString], subcommands: &[&str]) -> bool {
    let program = args.first().map(Path::new).and_then(Path::file_name);
    if program.is_some_and(|p| p == HELPER_NAME) {
        return true;
    }
    let Some(first) = args.get(1).and_then(|a| a.to_str()) else { return false };
    if first.starts_with('-') || subcommands.contains(&first) {
        return false;
    }
    args.len() >= 3 && (crate::checkpoint::is_url(first) || Path::new(first).exists())
}

/// Parses a helper call's arguments (`args[0]` excluded).
pub fn parse(args: &[OsString]) -> Result<HelperCall, HelperError> {
    let mut positional = Vec::new();
    let mut call = HelperCall {
        source: String::new(),
        mountpoint: PathBuf::new(),
        options: Vec::new(),
        fake: false,
        verbose: false,
        help: false,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let arg = arg.to_str().ok_or_else(|| HelperError::NotUtf8(arg.clone()))?;
        if let Some(opts) = arg.strip_prefix("-o") {
            let opts = if opts.is_empty() { next_str(&mut rest, "-o")? } else { opts };
            // Split as `stfs mount` will (`\,` inside a value) and joined again with the escapes kept.
            let kept = option_list::raw_items(opts).filter(|o| !DROPPED_OPTIONS.contains(o));
            call.options.extend(kept.map(str::to_string));
        } else if let Some(kind) = arg.strip_prefix("-t") {
            let kind = if kind.is_empty() { next_str(&mut rest, "-t")? } else { kind };
            if !matches!(kind, "fuse.stfs" | "stfs") {
                return Err(HelperError::WrongType(kind.to_string()));
            }
        } else if arg == "--help" {
            call.help = true;
        } else if let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) {
            for flag in flags.chars() {
                match flag {
                    'f' => call.fake = true,
                    'v' => call.verbose = true,
                    'h' => call.help = true,
                    // Sloppy (-s) and no-mtab (-n) change nothing: options are checked either way
                    // and stfs writes no mtab.
                    's' | 'n' => {}
                    other => return Err(HelperError::UnknownFlag(other)),
                }
            }
        } else {
            positional.push(arg.to_string());
        }
    }
    if call.help {
        return Ok(call);
    }
    match <[String; 2]>::try_from(positional) {
        Ok([source, mountpoint]) => {
            call.source = source;
            call.mountpoint = PathBuf::from(mountpoint);
            Ok(call)
        }
        Err(p) => Err(HelperError::Arguments(p.len())),
    }
}

fn next_str<'a>(rest: &mut impl Iterator<Item = &'a OsString>, flag: &'static str) -> Result<&'a str, HelperError> {
    let value = rest.next().ok_or(HelperError::NeedsValue(flag))?;
    value.to_str().ok_or_else(|| HelperError::NotUtf8(value.clone()))
}

/// Runs a helper call: `stfs mount` in the background, or only its checks under `-f`.
pub fn run(call: HelperCall) -> Result<ExitCode, Failure> {
    if call.help {
        println!("{HELPER_USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let args = MountArgs {
        source: call.source.clone(),
        mountpoint: call.mountpoint.clone(),
        options: vec![call.options.join(",")],
        ..Default::default()
    };
    let args = option_list::with_env_lists(args, std::env::vars_os())
        .map_err(crate::cli::options::ConfigError::EnvOptionsNotUtf8)?;
    if call.verbose {
        // Header values and URL secrets starred, as `ps` shows them once the mount has started.
        let options = call.options.join(",");
        let secrets = crate::cli::scrub::Secrets::of_source_and_options(&call.source, &call.options);
        let shown = crate::cli::scrub::starred(&[&call.source, "-o", &options], &secrets);
        eprintln!("stfs: mounting {} on {} (-o {})", shown[0], call.mountpoint.display(), shown[2]);
    }
    if call.fake {
        let config = MountConfig::from_args(args)?;
        let stats = Arc::new(crate::stats::Stats::default());
        let opened = crate::checkpoint::open(&config.source, &config.open_options(stats)?)?;
        crate::cli::mount::check_place(&config.mountpoint)?;
        crate::cli::mount::check_hiding(&config.mountpoint, &opened)?;
        return Ok(ExitCode::SUCCESS);
    }
    crate::cli::mount::run(args)
}

/// Runs `stfs install-helper`: links PREFIX/mount.fuse.stfs to this binary (or removes the link).
pub fn install(args: InstallHelperArgs) -> Result<ExitCode, Failure> {
    let link = args.prefix.join(HELPER_NAME);
    let shown = link.display();
    let current = std::fs::read_link(&link).ok();
    if args.remove {
        return match current {
            Some(_) => {
                std::fs::remove_file(&link).map_err(|e| Failure::io(&shown, e))?;
                println!("removed {shown}");
                Ok(ExitCode::SUCCESS)
            }
            None if link.exists() => Err(Failure::at(shown, InstallError::NotALink)),
            None => Err(Failure::at(shown, InstallError::NotInstalled)),
        };
    }
    let exe =
        std::env::current_exe().and_then(std::fs::canonicalize).map_err(|e| Failure::at("finding this binary", e))?;
    if current.as_deref() == Some(exe.as_path()) {
        println!("{shown} -> {} (already installed)", exe.display());
        return Ok(ExitCode::SUCCESS);
    }
    if (current.is_some() || link.exists()) && !args.force {
        let what = current.map_or("a file".to_string(), |c| format!("a link to {}", c.display()));
        return Err(Failure::at(shown, InstallError::Exists(what)));
    }
    // Link under a temporary name, then rename over: the helper is never missing or half-made.
    let temp = args.prefix.join(format!(".{HELPER_NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    symlink(&exe, &temp).map_err(|e| Failure::io(temp.display(), e))?;
    if let Err(e) = std::fs::rename(&temp, &link) {
        let _ = std::fs::remove_file(&temp);
        return Err(Failure::io(shown, e));
    }
    println!("{shown} -> {}", exe.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    // Not `super::*`: tests/layers.rs reads that as an import of `cli`, the dispatch.
    use crate::cli::helper::{is_helper_call, parse};
    use std::ffi::OsString;
    use std::path::Path;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount8_argv_is_understood() {
        let call =
            parse(&os(&["/m/x.safetensors", "/mnt/x", "-s", "-n", "-v", "-o", "rw,nosuid,cache_size=64M"])).unwrap();
        assert_eq!((call.source.as_str(), call.mountpoint.as_path()), ("/m/x.safetensors", Path::new("/mnt/x")));
        assert_eq!(call.options, ["nosuid", "cache_size=64M"]);
        assert!(call.verbose && !call.fake && !call.help);
        let call = parse(&os(&["a", "b", "-f", "-oro", "-t", "fuse.stfs"])).unwrap();
        assert!(call.fake);
        assert_eq!(call.options, ["ro"]);
        let call = parse(&os(&["a", "b", "-o", r"rw,header=X-K: a\,b,npy"])).unwrap();
        assert_eq!(call.options, [r"header=X-K: a\,b", "npy"], "escaped commas stay in the value");
        assert!(parse(&os(&["-h"])).unwrap().help);
    }

    #[test]
    fn bad_helper_calls_are_errors() {
        for (args, needle) in [
            (&["a"][..], "got 1 arguments"),
            (&["a", "b", "c"][..], "got 3 arguments"),
            (&["a", "b", "-x"][..], "unknown flag `-x`"),
            (&["a", "b", "-o"][..], "`-o` needs a value"),
            (&["a", "b", "-t", "ext4"][..], "type `ext4`"),
        ] {
            let e = parse(&os(args)).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn helper_calls_are_told_from_subcommands() {
        let subs = ["mount", "inspect"];
        assert!(is_helper_call(&os(&["/sbin/mount.fuse.stfs", "a", "b"]), &subs));
        assert!(is_helper_call(&os(&["stfs", "/", "/mnt", "-o", "ro"]), &subs));
        assert!(is_helper_call(&os(&["stfs", "https://h/m.safetensors", "/mnt"]), &subs));
        assert!(!is_helper_call(&os(&["stfs", "mount", "/", "/mnt"]), &subs));
        assert!(!is_helper_call(&os(&["stfs", "--help", "/"]), &subs));
        assert!(!is_helper_call(&os(&["stfs", "/no/such/stfs/path", "/mnt"]), &subs));
        assert!(!is_helper_call(&os(&["stfs", "/"]), &subs));
    }

    #[test]
    fn the_helper_call_and_its_starred_echo_hide_secrets() {
        use std::ffi::OsString;
        for form in [vec!["-o", r"ro,header=X-K: v\,1"], vec![r"-oro,header=X-K: v\,1"]] {
            let mut argv: Vec<OsString> = ["https://h/m?sig=q1", "/mnt/m"].map(OsString::from).to_vec();
            argv.extend(form.iter().map(OsString::from));
            let call = parse(&argv).unwrap();
            let secrets = crate::cli::scrub::Secrets::of_source_and_options(&call.source, &call.options);
            let block: Vec<String> = argv.iter().map(|a| a.to_str().unwrap().to_string()).collect();
            let (text, found) = crate::cli::scrub::tests::scrubbed(&block, &secrets);
            assert!(!text.contains(r"v\,1") && !text.contains("sig=q1"), "{text}");
            assert_eq!(found, crate::cli::scrub::Scrubbed { header: true, url: true });
            let shown = crate::cli::scrub::starred(&[&call.source, "-o", &call.options.join(",")], &secrets);
            assert_eq!(shown, ["https://h/m?******", "-o", "ro,header=X-K: ****"]);
        }
    }
}

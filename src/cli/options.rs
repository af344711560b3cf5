//! `-o` mount options and flags, validated once into a [`MountConfig`] the rest of the code takes,
//! and the remote options into the checkpoint's [`OpenOptions`]: the "high" arguments.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::OpenOptions;
use crate::cli::args::{parse_duration, parse_timeout, BadDuration, MetricsArgs, MountArgs, RemoteArgs};
use crate::cli::defaults::*;
use crate::cli::headers::{add_env_headers, add_header_file, HeaderSourceError};
use crate::cli::option_list;
use crate::engine::EngineConfig;
use crate::mount::build::{FsOptions, Owner};
use crate::mount::session::ServeOptions;
use crate::source::http::{HttpError, HttpOptions};
use crate::source::object::ObjectOptions;
use crate::stats::Stats;
use crate::tree::namespace::{Layout, Views};
use crate::util::size::{format_size, parse_size};

/// Smallest and largest block sizes accepted.
const BLOCK_SIZE_RANGE: (u64, u64) = (4 << 10, 1 << 30);

/// Mount options of mount(8) and FUSE that stfs accepts and has nothing to do for
/// (the mount is always read-only, nosuid and nodev).
const IGNORED_OPTIONS: &[&str] = &[
    "ro",
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "nosuid",
    "suid",
    "nodev",
    "dev",
    "noexec",
    "exec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "async",
    "sync",
    "dirsync",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
    "rw=no",
    "default_permissions",
];

/// A mount option, flag or remote option that cannot be used.
#[derive(Debug)]
pub enum ConfigError {
    /// `-o key` without the value it needs.
    NeedsValue {
        /// The option.
        key: String,
    },
    /// `-o key=value` for an option that is a plain switch.
    TakesNoValue {
        /// The option.
        key: String,
        /// The value given.
        value: String,
    },
    /// A count outside its range, or not a number.
    BadCount {
        /// The option.
        key: String,
        /// Least accepted.
        min: u32,
        /// Most accepted.
        max: u32,
        /// The value given.
        value: String,
    },
    /// A size that does not parse.
    BadSize(crate::util::size::SizeError),
    /// A duration that does not parse.
    BadDuration(BadDuration),
    /// `-o rw`: the mount is always read-only.
    ReadWrite,
    /// An option stfs does not know.
    Unknown {
        /// The option.
        key: String,
        /// The known option closest to it, if one is close.
        suggestion: Option<&'static str>,
    },
    /// An option stfs does not know, after a `header=` one: it may be the rest of a header value cut
    /// at a comma, so it is not shown.
    UnknownAfterHeader,
    /// A block size that is not a power of two in range.
    BlockSize {
        /// The size asked for.
        size: u64,
    },
    /// A cache that cannot hold two blocks.
    CacheSize {
        /// The size asked for.
        size: u64,
        /// Two blocks.
        least: u64,
    },
    /// An `STFS_OPTIONS_*` variable that is not UTF-8: its name.
    EnvOptionsNotUtf8(String),
    /// A view dtype other than `f32`.
    ViewDtype(String),
    /// A layout other than `flat` or `tree`.
    Layout(String),
    /// A `--header` that is not `Name: value`.
    Header(HttpError),
    /// A `--token-env` whose variable is unset or empty.
    TokenEnv(HttpError),
    /// A `--header-file` or `STFS_HEADER_*` variable that cannot be used.
    HeaderSource(HeaderSourceError),
    /// A `umask`, `fmask` or `dmask` that is not an octal mode.
    BadMask {
        /// The option.
        key: String,
        /// The value given.
        value: String,
    },
    /// A `metrics_addr` that is not an address and port.
    BadAddress {
        /// The option.
        key: String,
        /// The value given.
        value: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NeedsValue { key } => write!(f, "mount option `{key}` needs a value (`{key}=...`)"),
            ConfigError::TakesNoValue { key, value } => write!(f, "mount option `{key}` takes no value, got `{value}`"),
            ConfigError::BadCount { key, min, max, value } => {
                write!(f, "mount option `{key}` needs a whole number from {min} to {max}, got `{value}`")
            }
            ConfigError::BadSize(error) => error.fmt(f),
            ConfigError::BadDuration(e) => write!(f, "{e}"),
            ConfigError::ReadWrite => f.write_str("stfs mounts are read-only; option `rw` is not supported"),
            ConfigError::Unknown { key, suggestion: Some(known) } => {
                write!(f, "unknown mount option `{key}`; did you mean `{known}`? (see `stfs mount --help`)")
            }
            ConfigError::Unknown { key, suggestion: None } => {
                write!(f, "unknown mount option `{key}` (see `stfs mount --help`)")
            }
            ConfigError::UnknownAfterHeader => {
                f.write_str(r"unknown mount option after header= (write a comma inside a header value as \,)")
            }
            ConfigError::BlockSize { size } => {
                let (lo, hi) = BLOCK_SIZE_RANGE;
                let (size, lo, hi) = (format_size(*size), format_size(lo), format_size(hi));
                write!(f, "block size {size} must be a power of two from {lo} to {hi}")
            }
            ConfigError::CacheSize { size, least } => {
                let (size, least) = (format_size(*size), format_size(*least));
                write!(f, "cache size {size} must hold at least two blocks ({least})")
            }
            ConfigError::EnvOptionsNotUtf8(name) => write!(f, "{name}: not UTF-8"),
            ConfigError::ViewDtype(d) => write!(f, "unsupported view dtype `{d}` (only `f32`)"),
            ConfigError::Layout(l) => write!(f, "unknown layout `{l}` (use `flat` or `tree`)"),
            ConfigError::Header(e) => write!(f, "--header: {e}"),
            ConfigError::TokenEnv(e) => write!(f, "--token-env: {e}"),
            ConfigError::HeaderSource(e) => e.fmt(f),
            ConfigError::BadMask { key, value } => {
                write!(f, "mount option `{key}` needs an octal mode such as 022 or 0077, got `{value}`")
            }
            ConfigError::BadAddress { key, value } => {
                write!(f, "mount option `{key}` needs an address and port such as 127.0.0.1:9400, got `{value}`")
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::BadDuration(e) => Some(e),
            ConfigError::Header(e) | ConfigError::TokenEnv(e) => Some(e),
            ConfigError::HeaderSource(e) => Some(e),
            _ => None,
        }
    }
}

/// Everything `stfs mount` needs, validated.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The checkpoint as named by the user.
    pub source: String,
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Run in the foreground.
    pub foreground: bool,
    /// Block engine settings.
    pub engine: EngineConfig,
    /// Let other users in (and turn on default_permissions).
    pub allow_other: bool,
    /// Background log file.
    pub log_file: Option<PathBuf>,
    /// FUSE threads.
    pub threads: u32,
    /// Kernel readahead in KiB; 0 leaves it alone.
    pub kernel_readahead_kb: u32,
    /// Largest read request to ask the kernel for, in KiB.
    pub max_request_kb: u32,
    /// Splice read replies of a local file's pages (`--no-splice` clears it).
    pub splice: bool,
    /// `--io-uring`: ask the kernel for FUSE over io_uring.
    pub io_uring: bool,
    /// Path layout.
    pub layout: Layout,
    /// Extra views.
    pub views: Views,
    /// Re-serve the checkpoint's own files in the root.
    pub checkpoint_files: bool,
    /// Remote access options.
    pub remote: RemoteArgs,
    /// Owner of every file (`-o uid=`, `gid=`; default: who mounts).
    pub owner: Owner,
    /// Permission bits of files and directories from `-o umask`/`fmask`/`dmask`.
    pub perms: (Option<u16>, Option<u16>),
    /// `-o allow_root`.
    pub allow_root: bool,
    /// `-d`/`--debug`: foreground with debug logging.
    pub debug: bool,
    /// The disk cache directory (`--cache-dir`), if any.
    pub cache_dir: Option<PathBuf>,
    /// Its bound in bytes (`--cache-dir-size`); `None`: the default.
    pub cache_dir_size: Option<u64>,
    /// `--no-passthrough`: no whole tensor files in the disk cache for the kernel.
    pub no_passthrough: bool,
    /// `--auto-unmount`: a watcher detaches the mount if the daemon dies.
    pub auto_unmount: bool,
    /// `--drop-privileges USER` (`-o drop_privileges[=USER]`): mount as root, then serve as USER
    /// without capabilities; an empty name keeps root's uid (mount.fuse3's `drop_privileges`).
    pub drop_privileges: Option<String>,
    /// `--metrics-file`, `--metrics-addr`: where the counters go in the Prometheus text format.
    pub metrics: Box<MetricsArgs>,
}

/// Parses an octal mask (`022`, `0077`, `7`).
fn parse_mask(key: &str, value: &str) -> Result<u16, ConfigError> {
    match u16::from_str_radix(value, 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(ConfigError::BadMask { key: key.to_string(), value: value.to_string() }),
    }
}

impl MountConfig {
    /// The checkpoint-opening options of a mount, counting into `stats`: an `hf://` repository's
    /// small files come along unless `-o no_checkpoint_file` hides every file but tensors.
    pub fn open_options(&self, stats: Arc<Stats>) -> Result<OpenOptions, ConfigError> {
        Ok(OpenOptions { repo_files: self.checkpoint_files, ..self.remote.open_options(stats)? })
    }

    /// Applies `-o` options under the explicit flags: a flag wins over the same `-o` option, and of
    /// a repeated `-o` option the last wins (as in mount(8) and libfuse).
    pub fn from_args(args: MountArgs) -> Result<MountConfig, ConfigError> {
        let o = DashO::parse(&args.options)?;
        let mut a = args;
        a.cache_size = a.cache_size.or(o.cache_size);
        a.block_size = a.block_size.or(o.block_size);
        a.allow_other |= o.allow_other.unwrap_or(false);
        a.foreground |= o.foreground.unwrap_or(false);
        a.log_file = a.log_file.or(o.log_file);
        a.threads = a.threads.or(o.threads);
        a.io_threads = a.io_threads.or(o.io_threads);
        a.kernel_readahead_kb = a.kernel_readahead_kb.or(o.kernel_readahead_kb);
        a.max_request_kb = a.max_request_kb.or(o.max_request_kb);
        a.npy |= o.npy.unwrap_or(false);
        a.as_dtype = a.as_dtype.or(o.as_dtype);
        a.layout = a.layout.or(o.layout);
        a.remote.headers.extend(o.headers);
        a.remote.header_file = a.remote.header_file.or(o.header_file);
        a.remote.token_env = a.remote.token_env.or(o.token_env);
        a.remote.timeout = a.remote.timeout.or(o.timeout);
        a.remote.http_retries = a.remote.http_retries.or(o.http_retries);
        a.remote.http_retry_delay = a.remote.http_retry_delay.or(o.http_retry_delay);
        a.remote.http_timeout = a.remote.http_timeout.or(o.http_timeout);
        a.remote.endpoint_url = a.remote.endpoint_url.or(o.endpoint_url);
        a.remote.region = a.remote.region.or(o.region);
        a.remote.no_sign_request |= o.no_sign_request.unwrap_or(false);
        a.no_checkpoint_file |= o.no_checkpoint_file.unwrap_or(false);
        a.debug |= o.debug.unwrap_or(false);
        a.auto_unmount |= o.auto_unmount.unwrap_or(false);
        a.drop_privileges = a.drop_privileges.or(o.drop_privileges);
        let mut owner = Owner::of_process();
        owner.uid = o.uid.unwrap_or(owner.uid);
        owner.gid = o.gid.unwrap_or(owner.gid);
        let (umask, fmask, dmask) = (o.umask, o.fmask, o.dmask);
        let allow_root = o.allow_root.unwrap_or(false);
        a.cache_dir = a.cache_dir.or(o.cache_dir);
        a.cache_dir_size = a.cache_dir_size.or(o.cache_dir_size);
        a.no_passthrough |= o.no_passthrough.unwrap_or(false);
        a.no_map |= o.no_map.unwrap_or(false);
        a.no_splice |= o.no_splice.unwrap_or(false);
        a.io_uring |= o.io_uring.unwrap_or(false);
        a.metrics.metrics_file = a.metrics.metrics_file.or(o.metrics_file);
        a.metrics.metrics_addr = a.metrics.metrics_addr.or(o.metrics_addr);
        let block_size = a.block_size.unwrap_or(default_block_size(&a.source));
        let (lo, hi) = BLOCK_SIZE_RANGE;
        if !(lo..=hi).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(ConfigError::BlockSize { size: block_size });
        }
        let cache_size = a.cache_size.unwrap_or(DEFAULT_CACHE_SIZE.max(2 * block_size));
        if cache_size < 2 * block_size {
            return Err(ConfigError::CacheSize { size: cache_size, least: 2 * block_size });
        }
        let threads = a.threads.unwrap_or_else(|| default_threads(&a.source));
        let engine = EngineConfig {
            block_size,
            cache_size,
            io_threads: a.io_threads.unwrap_or_else(|| default_io_threads(&a.source)) as usize,
            map_files: !a.no_map,
            source_timeout: a.remote.timeout.unwrap_or(crate::source::http::DEFAULT_TIMEOUT),
        };
        let as_f32 = match a.as_dtype.as_deref() {
            None => false,
            Some(d) if d.eq_ignore_ascii_case("f32") => true,
            Some(other) => return Err(ConfigError::ViewDtype(other.to_string())),
        };
        let layout = match a.layout.as_deref() {
            None | Some("flat") => Layout::Flat,
            Some("tree") => Layout::Tree,
            Some(other) => return Err(ConfigError::Layout(other.to_string())),
        };
        Ok(MountConfig {
            cache_dir: a.cache_dir,
            cache_dir_size: a.cache_dir_size,
            no_passthrough: a.no_passthrough,
            layout,
            views: Views { npy: a.npy, as_f32 },
            checkpoint_files: !a.no_checkpoint_file,
            remote: a.remote,
            source: a.source,
            mountpoint: a.mountpoint,
            foreground: a.foreground || a.debug,
            debug: a.debug,
            auto_unmount: a.auto_unmount,
            drop_privileges: a.drop_privileges,
            metrics: a.metrics,
            owner,
            perms: (fmask.or(umask).map(|m| 0o444 & !m), dmask.or(umask).map(|m| 0o555 & !m)),
            allow_root,
            engine,
            allow_other: a.allow_other,
            log_file: a.log_file,
            threads,
            kernel_readahead_kb: a.kernel_readahead_kb.unwrap_or(DEFAULT_KERNEL_READAHEAD_KB),
            max_request_kb: a.max_request_kb.unwrap_or(DEFAULT_MAX_REQUEST_KB),
            splice: !a.no_splice,
            io_uring: a.io_uring,
        })
    }

    /// What the filesystem shows and how it reads, owned by who mounts (with no disk cache: the
    /// caller opens `cache_dir`, which checks the directory, and sets it).
    pub fn fs_options(&self) -> FsOptions {
        FsOptions {
            engine: self.engine.clone(),
            layout: self.layout,
            views: self.views,
            owner: self.owner,
            perms: self.perms,
            checkpoint_files: self.checkpoint_files,
            disk: None,
        }
    }

    /// Where and how to mount.
    pub fn serve_options(&self) -> ServeOptions {
        ServeOptions {
            mountpoint: self.mountpoint.clone(),
            threads: self.threads,
            allow_other: self.allow_other,
            allow_root: self.allow_root,
            kernel_readahead_kb: self.kernel_readahead_kb,
            max_request_bytes: self.max_request_kb << 10,
            splice: self.splice,
            passthrough: !self.no_passthrough,
            io_uring: self.io_uring,
            premounted: crate::mount::premounted::premounted_descriptor(&self.mountpoint),
        }
    }
}

impl RemoteArgs {
    /// The checkpoint-opening options these arguments describe, counting into `stats`.
    pub fn open_options(&self, stats: Arc<Stats>) -> Result<OpenOptions, ConfigError> {
        let mut http = HttpOptions { stats, ..Default::default() };
        for h in &self.headers {
            http.add_header_arg(h).map_err(ConfigError::Header)?;
        }
        if let Some(path) = &self.header_file {
            add_header_file(&mut http, path).map_err(ConfigError::HeaderSource)?;
        }
        add_env_headers(&mut http, std::env::vars_os()).map_err(ConfigError::HeaderSource)?;
        if let Some(var) = &self.token_env {
            http.token_from_env(var).map_err(ConfigError::TokenEnv)?;
        }
        if let Some(attempts) = self.http_retries {
            http.retry.attempts = attempts;
        }
        if let Some(delay) = self.http_retry_delay {
            http.retry.base_delay = delay;
            http.retry.max_delay = delay.saturating_mul(32).min(http.retry.max_delay);
        }
        if let Some(timeout) = self.timeout {
            http.timeout = timeout;
        }
        if let Some(timeout) = self.http_timeout {
            http.connect_timeout = timeout;
            http.read_timeout = timeout;
        }
        let mut object = ObjectOptions::default();
        object.endpoint_url = self.endpoint_url.clone();
        object.no_sign_request = self.no_sign_request;
        object.region = self.region.clone();
        Ok(OpenOptions { http, repo_files: false, object })
    }
}

/// The `-o` options of one command line, each the last value given.
#[derive(Default)]
struct DashO {
    cache_size: Option<u64>,
    block_size: Option<u64>,
    allow_other: Option<bool>,
    foreground: Option<bool>,
    log_file: Option<PathBuf>,
    threads: Option<u32>,
    io_threads: Option<u32>,
    kernel_readahead_kb: Option<u32>,
    max_request_kb: Option<u32>,
    npy: Option<bool>,
    as_dtype: Option<String>,
    layout: Option<String>,
    headers: Vec<String>,
    header_file: Option<PathBuf>,
    token_env: Option<String>,
    timeout: Option<Duration>,
    http_retries: Option<u32>,
    http_retry_delay: Option<Duration>,
    http_timeout: Option<Duration>,
    no_checkpoint_file: Option<bool>,
    debug: Option<bool>,
    uid: Option<u32>,
    gid: Option<u32>,
    umask: Option<u16>,
    fmask: Option<u16>,
    dmask: Option<u16>,
    allow_root: Option<bool>,
    cache_dir: Option<PathBuf>,
    cache_dir_size: Option<u64>,
    no_passthrough: Option<bool>,
    auto_unmount: Option<bool>,
    drop_privileges: Option<String>,
    no_map: Option<bool>,
    no_splice: Option<bool>,
    io_uring: Option<bool>,
    endpoint_url: Option<String>,
    region: Option<String>,
    no_sign_request: Option<bool>,
    metrics_file: Option<PathBuf>,
    metrics_addr: Option<std::net::SocketAddr>,
}

impl DashO {
    /// Reads comma-separated `-o` arguments (`\,` is a comma inside a value); a later value of an
    /// option replaces an earlier one (`header` adds one more).
    fn parse(options: &[String]) -> Result<DashO, ConfigError> {
        let mut o = DashO::default();
        let mut after_header = false;
        for opt in options.iter().flat_map(|list| option_list::items(list)) {
            let opt = opt.as_str();
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let need = || value.ok_or_else(|| ConfigError::NeedsValue { key: key.to_string() });
            let switch = || match value {
                None | Some("true") | Some("yes") | Some("1") => Ok(Some(true)),
                Some("false") | Some("no") | Some("0") => Ok(Some(false)),
                Some(other) => Err(ConfigError::TakesNoValue { key: key.to_string(), value: other.to_string() }),
            };
            let size = || need().and_then(|text| parse_size(text).map_err(ConfigError::BadSize)).map(Some);
            let duration = || need().and_then(|text| parse_duration(text).map_err(ConfigError::BadDuration)).map(Some);
            let timeout = || need().and_then(|text| parse_timeout(text).map_err(ConfigError::BadDuration)).map(Some);
            let count = |min, max| need().and_then(|text| parse_count(key, text, min, max)).map(Some);
            let text = || need().map(|text| Some(text.to_string()));
            match key.replace('-', "_").as_str() {
                "cache_size" => o.cache_size = size()?,
                "block_size" => o.block_size = size()?,
                "allow_other" => o.allow_other = switch()?,
                "foreground" => o.foreground = switch()?,
                "log_file" => o.log_file = need().map(|p| Some(PathBuf::from(p)))?,
                "threads" => o.threads = count(1, 256)?,
                "io_threads" => o.io_threads = count(1, 64)?,
                "kernel_readahead_kb" => o.kernel_readahead_kb = count(0, 1 << 20)?,
                "max_request_kb" => o.max_request_kb = count(4, 16384)?,
                "npy" => o.npy = switch()?,
                "as" => o.as_dtype = text()?,
                "layout" => o.layout = text()?,
                "header" => {
                    o.headers.push(need()?.to_string());
                    after_header = true;
                }
                "header_file" => o.header_file = need().map(|p| Some(PathBuf::from(p)))?,
                "token_env" => o.token_env = text()?,
                "timeout" => o.timeout = timeout()?,
                "http_retries" => o.http_retries = count(1, 100)?,
                "http_retry_delay" => o.http_retry_delay = duration()?,
                "http_timeout" => o.http_timeout = duration()?,
                "no_checkpoint_file" => o.no_checkpoint_file = switch()?,
                "checkpoint_file" => o.no_checkpoint_file = switch()?.map(|shown| !shown),
                "debug" => o.debug = switch()?,
                "uid" => o.uid = count(0, u32::MAX - 1)?,
                "gid" => o.gid = count(0, u32::MAX - 1)?,
                "umask" => o.umask = need().and_then(|v| parse_mask(key, v)).map(Some)?,
                "fmask" => o.fmask = need().and_then(|v| parse_mask(key, v)).map(Some)?,
                "dmask" => o.dmask = need().and_then(|v| parse_mask(key, v)).map(Some)?,
                "allow_root" => o.allow_root = switch()?,
                "auto_unmount" => o.auto_unmount = switch()?,
                "drop_privileges" => o.drop_privileges = Some(value.unwrap_or_default().to_string()),
                "no_map" => o.no_map = switch()?,
                "no_splice" => o.no_splice = switch()?,
                "io_uring" => o.io_uring = switch()?,
                "read_only" => {}
                "cache_dir" => o.cache_dir = need().map(|p| Some(PathBuf::from(p)))?,
                "cache_dir_size" => o.cache_dir_size = size()?,
                "no_passthrough" => o.no_passthrough = switch()?,
                "endpoint_url" => o.endpoint_url = text()?,
                "region" => o.region = text()?,
                "no_sign_request" => o.no_sign_request = switch()?,
                "metrics_file" => o.metrics_file = need().map(|p| Some(PathBuf::from(p)))?,
                "metrics_addr" => {
                    let bad = |value: &str| ConfigError::BadAddress { key: key.to_string(), value: value.to_string() };
                    o.metrics_addr = need().and_then(|v| v.parse().map_err(|_| bad(v))).map(Some)?
                }
                "rw" => return Err(ConfigError::ReadWrite),
                k if IGNORED_OPTIONS.contains(&k) || key.starts_with("x-") || k == "fsname" || k == "subtype" => {}
                _ if after_header => return Err(ConfigError::UnknownAfterHeader),
                _ => {
                    let candidates = option_list::KNOWN_OPTIONS.iter().chain(IGNORED_OPTIONS).copied();
                    let suggestion = crate::util::suggest::closest(key, candidates);
                    return Err(ConfigError::Unknown { key: key.to_string(), suggestion });
                }
            }
        }
        Ok(o)
    }
}

fn parse_count(key: &str, value: &str, min: u32, max: u32) -> Result<u32, ConfigError> {
    match value.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError::BadCount { key: key.to_string(), min, max, value: value.to_string() }),
    }
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;

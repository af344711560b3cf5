//! `-o` mount options and flags, validated once into a [`MountConfig`] the rest of the code takes,
//! and the remote options into the checkpoint's [`OpenOptions`]: the "high" arguments.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::checkpoint::OpenOptions;
use crate::cli::args::{parse_duration, BadDuration, MountArgs, RemoteArgs};
use crate::engine::EngineConfig;
use crate::mount::build::{FsOptions, Owner};
use crate::mount::session::ServeOptions;
use crate::source::http::{HttpError, HttpOptions};
use crate::source::object::ObjectOptions;
use crate::stats::Stats;
use crate::tree::namespace::{Layout, Views};
use crate::util::size::{format_size, parse_size};

/// Default block size: the unit of the cache and of alignment, 64 KiB. A random 4 KiB reader pays
/// for one such block, most of it in fresh memory for the cache (measured in docs/benchmarks.md:
/// first-touch random reads take about half the time of 256 KiB blocks, and 8 MiB blocks made them
/// 4-20x slower), while sequential streams still reach the storage in reads of up to
/// [`crate::engine::PREFETCH_CHUNK_BYTES`] (8 MiB): the prefetch coalesces whole aligned blocks.
pub const DEFAULT_BLOCK_SIZE: u64 = 64 << 10;
/// Default block size for a checkpoint read over HTTP(S): 4 MiB. Every block loaded on demand is
/// one request whose round trip dwarfs the transfer of a few MiB, and a 1 MiB kernel request then
/// mostly falls inside one block, which is handed to the kernel without being joined, and a
/// tensor's first window (one block per prefetch lane) spans 16 MiB (measured in docs/remote.md: a
/// 1 GiB model 1.7-1.9 s against 2.0-2.2 s with 64 KiB blocks, a 16 MiB tensor 0.095 s against
/// 0.12 s; the price is that a random 4 KiB read costs one 4 MiB request).
pub const DEFAULT_REMOTE_BLOCK_SIZE: u64 = 4 << 20;
/// Default cache size.
pub const DEFAULT_CACHE_SIZE: u64 = 512 << 20;
/// Default FUSE threads: enough for the kernel's parallel readahead and several readers.
pub const DEFAULT_THREADS: u32 = 16;
/// Default readahead threads: one stream with all eight prefetch lanes busy, or several sharing
/// them (they mostly wait on storage, so more threads than cores is the point).
pub const DEFAULT_IO_THREADS: u32 = 8;
/// Default kernel readahead: 1 MiB, the largest request the kernel sends (max_pages 256).
pub const DEFAULT_KERNEL_READAHEAD_KB: u32 = 1024;
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
    },
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
    /// A view dtype other than `f32`.
    ViewDtype(String),
    /// A layout other than `flat` or `tree`.
    Layout(String),
    /// A `--header` that is not `Name: value`.
    Header(HttpError),
    /// A `--token-env` whose variable is unset or empty.
    TokenEnv(HttpError),
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
            ConfigError::Unknown { key } => write!(f, "unknown mount option `{key}` (see `stfs mount --help`)"),
            ConfigError::BlockSize { size } => {
                let (lo, hi) = BLOCK_SIZE_RANGE;
                let (size, lo, hi) = (format_size(*size), format_size(lo), format_size(hi));
                write!(f, "block size {size} must be a power of two from {lo} to {hi}")
            }
            ConfigError::CacheSize { size, least } => {
                let (size, least) = (format_size(*size), format_size(*least));
                write!(f, "cache size {size} must hold at least two blocks ({least})")
            }
            ConfigError::ViewDtype(d) => write!(f, "unsupported view dtype `{d}` (only `f32`)"),
            ConfigError::Layout(l) => write!(f, "unknown layout `{l}` (use `flat` or `tree`)"),
            ConfigError::Header(e) => write!(f, "--header: {e}"),
            ConfigError::TokenEnv(e) => write!(f, "--token-env: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::BadDuration(e) => Some(e),
            ConfigError::Header(e) | ConfigError::TokenEnv(e) => Some(e),
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
    /// Path layout.
    pub layout: Layout,
    /// Extra views.
    pub views: Views,
    /// Remote access options.
    pub remote: RemoteArgs,
}

impl MountConfig {
    /// Applies `-o` options under the explicit flags (a flag wins over the same `-o` option).
    pub fn from_args(args: MountArgs) -> Result<MountConfig, ConfigError> {
        let mut a = args.clone();
        for opt in args.options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let need = || value.ok_or_else(|| ConfigError::NeedsValue { key: key.to_string() });
            let flag_value = |v: Option<&str>| match v {
                None | Some("true") | Some("yes") | Some("1") => Ok(true),
                Some("false") | Some("no") | Some("0") => Ok(false),
                Some(other) => Err(ConfigError::TakesNoValue { key: key.to_string(), value: other.to_string() }),
            };
            let size = |text: &str| parse_size(text).map_err(ConfigError::BadSize);
            let duration = |text: &str| parse_duration(text).map_err(ConfigError::BadDuration);
            match key.replace('-', "_").as_str() {
                "cache_size" => a.cache_size = a.cache_size.or(Some(size(need()?)?)),
                "block_size" => a.block_size = a.block_size.or(Some(size(need()?)?)),
                "allow_other" => a.allow_other |= flag_value(value)?,
                "foreground" => a.foreground |= flag_value(value)?,
                "log_file" => a.log_file = a.log_file.or(Some(PathBuf::from(need()?))),
                "threads" => a.threads = a.threads.or(Some(parse_count(key, need()?, 1, 256)?)),
                "io_threads" => a.io_threads = a.io_threads.or(Some(parse_count(key, need()?, 1, 64)?)),
                "kernel_readahead_kb" => {
                    a.kernel_readahead_kb = a.kernel_readahead_kb.or(Some(parse_count(key, need()?, 0, 1 << 20)?))
                }
                "npy" => a.npy |= flag_value(value)?,
                "as" => a.as_dtype = a.as_dtype.or(Some(need()?.to_string())),
                "layout" => a.layout = a.layout.or(Some(need()?.to_string())),
                "header" => a.remote.headers.push(need()?.to_string()),
                "token_env" => a.remote.token_env = a.remote.token_env.or(Some(need()?.to_string())),
                "http_retries" => {
                    a.remote.http_retries = a.remote.http_retries.or(Some(parse_count(key, need()?, 1, 100)?))
                }
                "http_retry_delay" => {
                    a.remote.http_retry_delay = a.remote.http_retry_delay.or(Some(duration(need()?)?))
                }
                "http_timeout" => a.remote.http_timeout = a.remote.http_timeout.or(Some(duration(need()?)?)),
                "endpoint_url" => a.remote.endpoint_url = a.remote.endpoint_url.or(Some(need()?.to_string())),
                "region" => a.remote.region = a.remote.region.or(Some(need()?.to_string())),
                "no_sign_request" => a.remote.no_sign_request |= flag_value(value)?,
                "rw" => return Err(ConfigError::ReadWrite),
                k if IGNORED_OPTIONS.contains(&k) || key.starts_with("x-") || k == "fsname" || k == "subtype" => {}
                _ => return Err(ConfigError::Unknown { key: key.to_string() }),
            }
        }
        let block_size = a.block_size.unwrap_or(default_block_size(&a.source));
        let (lo, hi) = BLOCK_SIZE_RANGE;
        if !(lo..=hi).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(ConfigError::BlockSize { size: block_size });
        }
        let cache_size = a.cache_size.unwrap_or(DEFAULT_CACHE_SIZE.max(2 * block_size));
        if cache_size < 2 * block_size {
            return Err(ConfigError::CacheSize { size: cache_size, least: 2 * block_size });
        }
        let engine =
            EngineConfig { block_size, cache_size, io_threads: a.io_threads.unwrap_or(DEFAULT_IO_THREADS) as usize };
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
            layout,
            views: Views { npy: a.npy, as_f32 },
            remote: a.remote,
            source: a.source,
            mountpoint: a.mountpoint,
            foreground: a.foreground,
            engine,
            allow_other: a.allow_other,
            log_file: a.log_file,
            threads: a.threads.unwrap_or(DEFAULT_THREADS),
            kernel_readahead_kb: a.kernel_readahead_kb.unwrap_or(DEFAULT_KERNEL_READAHEAD_KB),
        })
    }

    /// What the filesystem shows and how it reads, owned by who mounts.
    pub fn fs_options(&self) -> FsOptions {
        FsOptions { engine: self.engine.clone(), layout: self.layout, views: self.views, owner: Owner::of_process() }
    }

    /// Where and how to mount.
    pub fn serve_options(&self) -> ServeOptions {
        ServeOptions {
            mountpoint: self.mountpoint.clone(),
            threads: self.threads,
            allow_other: self.allow_other,
            kernel_readahead_kb: self.kernel_readahead_kb,
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
        if let Some(timeout) = self.http_timeout {
            http.connect_timeout = timeout;
            http.read_timeout = timeout;
        }
        let mut object = ObjectOptions::default();
        object.endpoint_url = self.endpoint_url.clone();
        object.no_sign_request = self.no_sign_request;
        object.region = self.region.clone();
        Ok(OpenOptions { http, object })
    }
}

/// The block size for `source` when none is given: [`DEFAULT_REMOTE_BLOCK_SIZE`] for a URL,
/// [`DEFAULT_BLOCK_SIZE`] otherwise.
pub fn default_block_size(source: &str) -> u64 {
    if crate::checkpoint::is_url(source) {
        DEFAULT_REMOTE_BLOCK_SIZE
    } else {
        DEFAULT_BLOCK_SIZE
    }
}

/// The engine settings for `source` with every option at its default (what `stfs extract` and
/// `stfs cat` read through).
pub fn default_engine(source: &str) -> EngineConfig {
    EngineConfig {
        block_size: default_block_size(source),
        cache_size: DEFAULT_CACHE_SIZE,
        io_threads: DEFAULT_IO_THREADS as usize,
    }
}

fn parse_count(key: &str, value: &str, min: u32, max: u32) -> Result<u32, ConfigError> {
    match value.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError::BadCount { key: key.to_string(), min, max, value: value.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::options::*;

    fn args(options: &[&str]) -> MountArgs {
        MountArgs {
            source: "m.safetensors".into(),
            options: options.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults() {
        let c = MountConfig::from_args(args(&[])).unwrap();
        assert_eq!((c.engine.block_size, c.engine.cache_size), (DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_SIZE));
        assert_eq!((c.threads, c.kernel_readahead_kb, c.allow_other), (DEFAULT_THREADS, 1024, false));
        for url in ["http://host/m.safetensors", "https://host/repo/model.safetensors.index.json"] {
            let c = MountConfig::from_args(MountArgs { source: url.into(), ..args(&[]) }).unwrap();
            assert_eq!(c.engine.block_size, DEFAULT_REMOTE_BLOCK_SIZE, "{url}");
            // extract and cat read through the same engine settings as a mount with no options.
            let e = default_engine(url);
            assert_eq!(
                (e.block_size, e.cache_size, e.io_threads),
                (c.engine.block_size, c.engine.cache_size, c.engine.io_threads)
            );
        }
        let e = default_engine("m.safetensors");
        assert_eq!(
            (e.block_size, e.cache_size, e.io_threads),
            (DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_SIZE, DEFAULT_IO_THREADS as usize)
        );
        let explicit = MountArgs { source: "https://host/m.safetensors".into(), ..args(&["block_size=64K"]) };
        assert_eq!(MountConfig::from_args(explicit).unwrap().engine.block_size, 64 << 10);
    }

    #[test]
    fn dash_o_options_map_to_flags_and_flags_win() {
        let c =
            MountConfig::from_args(args(&["ro,cache_size=1G,block-size=4M", "allow_other,nosuid,x-systemd.automount"]))
                .unwrap();
        assert_eq!((c.engine.cache_size, c.engine.block_size, c.allow_other), (1 << 30, 4 << 20, true));
        let c = MountConfig::from_args(args(&["npy,as=f32,layout=tree"])).unwrap();
        assert_eq!((c.views, c.layout), (Views { npy: true, as_f32: true }, Layout::Tree));
        let c = MountConfig::from_args(args(&["endpoint_url=http://h:9000,region=eu-west-1,no_sign_request"])).unwrap();
        let object = c.remote.open_options(Default::default()).unwrap().object;
        assert_eq!(object.endpoint_url.as_deref(), Some("http://h:9000"));
        assert_eq!((object.region.as_deref(), object.no_sign_request), (Some("eu-west-1"), true));
        assert_eq!(default_block_size("s3://b/k"), DEFAULT_REMOTE_BLOCK_SIZE);
        assert_eq!(default_block_size("gs://b/k"), DEFAULT_REMOTE_BLOCK_SIZE);
        let mut a = args(&["cache_size=1G"]);
        a.cache_size = Some(64 << 20);
        assert_eq!(MountConfig::from_args(a).unwrap().engine.cache_size, 64 << 20);
    }

    #[test]
    fn bad_options_name_the_option() {
        for (opts, needle) in [
            (&["bogus=1"][..], "unknown mount option `bogus`"),
            (&["rw"][..], "read-only"),
            (&["cache_size"][..], "needs a value"),
            (&["cache_size=lots"][..], "invalid size"),
            (&["block_size=3M"][..], "power of two"),
            (&["block_size=8M,cache_size=8M"][..], "at least two blocks"),
            (&["threads=0"][..], "whole number"),
            (&["allow_other=maybe"][..], "takes no value"),
            (&["as=f16"][..], "only `f32`"),
            (&["layout=deep"][..], "unknown layout"),
        ] {
            let e = MountConfig::from_args(args(opts)).unwrap_err().to_string();
            assert!(e.contains(needle), "{opts:?}: {e}");
        }
    }

    #[test]
    fn hidden_http_knobs_reach_the_options() {
        use std::time::Duration;
        let remote = RemoteArgs {
            http_retries: Some(2),
            http_retry_delay: Some(Duration::from_millis(10)),
            http_timeout: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        let http = remote.open_options(Default::default()).unwrap().http;
        assert_eq!(
            (http.retry.attempts, http.retry.base_delay, http.retry.max_delay),
            (2, Duration::from_millis(10), Duration::from_millis(320))
        );
        assert_eq!((http.connect_timeout, http.read_timeout), (Duration::from_secs(1), Duration::from_secs(1)));
        let bad = RemoteArgs { headers: vec!["no colon".into()], ..Default::default() };
        let e = bad.open_options(Default::default()).unwrap_err();
        assert!(e.to_string().starts_with("--header: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }
}

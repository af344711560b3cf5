//! The command line as clap parses it: the subcommands, their arguments and their help texts,
//! kept "as close to the flags as possible"; `options` validates them into the configs the library
//! takes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Examples, exit statuses and logging, after `stfs --help`.
const AFTER_HELP: &str = "\
Examples:
  stfs mount model.safetensors /mnt/model     # returns once the mount answers
  ls -l /mnt/model; cat /mnt/model/metadata.json
  dd if=/mnt/model/lm_head.weight bs=1M skip=3 count=2 | legacy-tool
  stfs inspect model.safetensors              # the tensor table, no mount
  stfs cat model.safetensors lm_head.weight | od -t f4 | head   # no FUSE needed
  stfs extract --npy model.safetensors lm_head.weight -o out/
  stfs umount /mnt/model
  stfs install-helper && mount -t fuse.stfs model.safetensors /mnt/model -o ro,cache_size=1G

Exit status: 0 success, 1 failure (bad input, mount or unmount failed), 2 usage error (a bad
flag or -o option); as mount(8)'s helper mount.fuse.stfs: 32 failure, 1 usage error.
Logging: RUST_LOG=stfs=debug (to stderr in the foreground, to --log-file in
the background, else warnings and errors to syslog as stfs[PID]).
Secrets: header values and URL query strings are cleared from the process's
command line once read; pass headers with --header-file or STFS_HEADER_<ANY>.";

/// Mount a safetensors checkpoint as a read-only directory with one raw file per tensor.
#[derive(Parser, Debug)]
#[command(name = "stfs", version, about, after_help = AFTER_HELP, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands. Each has `display_name = "stfs"`, so `stfs mount -V` prints `stfs 0.1.0`
/// (clap would say `stfs-mount 0.1.0`, a program that does not exist).
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mount a checkpoint; returns once the mount answers (the daemon stays in the background).
    #[command(after_help = MOUNT_HELP, display_name = "stfs")]
    Mount(Box<MountArgs>),
    /// Unmount an stfs mount; also clears a stale mount left by a killed daemon.
    #[command(alias = "unmount", after_help = UMOUNT_HELP, display_name = "stfs")]
    Umount(UmountArgs),
    /// Print the tensor table of a checkpoint without mounting it.
    #[command(
        after_help = "Example:\n  stfs inspect model.safetensors --json | jq '.tensors | length'",
        display_name = "stfs"
    )]
    Inspect(InspectArgs),
    /// Print the live counters of a mount (cache hits, backing reads, resident bytes).
    #[command(after_help = STATS_HELP, display_name = "stfs")]
    Stats(StatsArgs),
    /// Show or empty a disk cache directory (`--cache-dir`).
    #[command(after_help = CACHE_HELP, display_name = "stfs", disable_help_subcommand = true)]
    Cache(CacheArgs),
    /// Write tensors to files (raw bytes, or .npy) without mounting: no /dev/fuse needed.
    #[command(after_help = EXTRACT_HELP, display_name = "stfs")]
    Extract(ExtractArgs),
    /// Write one tensor's bytes (raw, or .npy) to stdout without mounting.
    #[command(after_help = CAT_HELP, display_name = "stfs")]
    Cat(CatArgs),
    /// Link /sbin/mount.fuse.stfs to this binary, so `mount -t fuse.stfs` and fstab lines work.
    #[command(after_help = INSTALL_HELPER_HELP, display_name = "stfs")]
    InstallHelper(InstallHelperArgs),
    /// Serve a CSI v1 node plugin on a unix socket: Kubernetes pods get checkpoints as read-only
    /// volumes, served by unprivileged daemons (see docs/kubernetes.md). Runs as root.
    #[command(after_help = CSI_HELP, display_name = "stfs")]
    Csi(CsiArgs),
    /// What is mounted at a path, from /proc/self/mountinfo without touching it, as one JSON line
    /// (for the Python package and scripts: one reading of mountinfo for every caller).
    #[command(name = "mount-info", hide = true, display_name = "stfs")]
    MountInfo(MountInfoArgs),
}

const INSTALL_HELPER_HELP: &str = "\
mount(8) runs /sbin/mount.fuse.stfs SOURCE MOUNTPOINT -o OPTIONS for the type
fuse.stfs. The options are those of `stfs mount`; `rw`, which mount(8) adds
unless told `ro`, is ignored (the mount is read-only).

Examples:
  stfs install-helper
  mount -t fuse.stfs /models/m.safetensors /mnt/m -o ro,cache_size=1G
  echo '/models/m.safetensors /mnt/m fuse.stfs ro,cache_size=1G,nofail 0 0' >> /etc/fstab
  stfs install-helper --remove";

/// Arguments of `stfs mount`. Every long option is also accepted as `-o name=value`.
#[derive(Args, Debug, Default, Clone)]
pub struct MountArgs {
    /// The checkpoint: a .safetensors file, a *.index.json of shards, a directory of shards, an
    /// http(s)://, s3://BUCKET/KEY or gs://BUCKET/OBJECT name of a file or an index, or a hub
    /// repository hf://ORG/REPO[@REVISION][/PATH]. `-`: the source is in the variable
    /// STFS_SOURCE, so that a signed URL or a `user:pass@` stays off the command line (a file
    /// named `-` is `./-`).
    pub source: String,
    /// An existing directory to mount on; or `/dev/fd/N` (also `/proc/self/fd/N`): serve the
    /// `/dev/fuse` descriptor N, which the caller opened and mounted (libfuse's convention), with no
    /// mount or unmount call, so no privilege is needed; options that need the mount point
    /// (--auto-unmount, --kernel-readahead-kb) do not apply, and the mount ends when its mounter
    /// unmounts it.
    pub mountpoint: PathBuf,
    /// Stay in the foreground (logs to stderr; Ctrl-C unmounts).
    #[arg(short, long)]
    pub foreground: bool,
    /// Foreground with debug logging (RUST_LOG=stfs=debug unless RUST_LOG is set), as sshfs -d.
    #[arg(short, long)]
    pub debug: bool,
    /// Accepted for mount(8) habits and ignored, like `-o ro`: the mount is always read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Comma-separated options, as mount(8) passes them: `-o cache_size=1G,allow_other`. Every
    /// environment variable STFS_OPTIONS_<ANY> holds one more list, taken first (for options that
    /// carry a header value, which no command line should show).
    #[arg(short = 'o', value_name = "OPT[,OPT...]")]
    pub options: Vec<String>,
    /// Most bytes the block cache may hold (readahead included) [default: 512M].
    #[arg(long, value_name = "SIZE", value_parser = crate::util::size::parse_size)]
    pub cache_size: Option<u64>,
    /// Cache and alignment unit: every backing read covers whole blocks of this size, aligned to the
    /// backing file (sequential readers get reads of many blocks at once) [default: 64K; 4M for a
    /// URL].
    #[arg(long, value_name = "SIZE", value_parser = crate::util::size::parse_size)]
    pub block_size: Option<u64>,
    /// Keep whole blocks in this directory too, below the memory cache, so a later mount (after a
    /// restart, or by another process) reads them from local disk instead of the store. Created
    /// mode 0700 if missing; refused if another user owns it or may write to it. Shared safely by
    /// any number of mounts [default: off].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes --cache-dir may hold; least recently used blocks are evicted past it [default:
    /// 10% of the free space on its filesystem at mount time plus what it already holds, at most
    /// 256G].
    #[arg(long, value_name = "SIZE", value_parser = crate::util::size::parse_size)]
    pub cache_dir_size: Option<u64>,
    /// With --cache-dir, as root: do not keep whole tensor files in it for the kernel to read
    /// directly (FUSE passthrough); they double what a fully cached tensor takes there.
    #[arg(long)]
    pub no_passthrough: bool,
    /// Let other users (not only the one who mounted) use the mount; turns on default_permissions.
    #[arg(long)]
    pub allow_other: bool,
    /// Where the background daemon writes its log [default: warnings and errors to syslog, as
    /// stfs[PID]].
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Unmount if the daemon dies (killed, crashed): a small watcher process detaches the mount
    /// [default: off, a stale mount stays until `stfs umount`].
    #[arg(long)]
    pub auto_unmount: bool,
    /// As root: mount, then serve as USER (a name or a uid) with no capability and no_new_privs
    /// (`-o drop_privileges` alone, as mount.fuse3: root's uid without its capabilities). USER
    /// must be able to read the checkpoint (and --cache-dir); without allow_other only USER may
    /// enter the mount. Not with -f or --auto-unmount.
    #[arg(long, value_name = "USER")]
    pub drop_privileges: Option<String>,
    /// Threads answering FUSE requests [default: twice the CPUs, 4 to 16, for a local file; 16 for a
    /// URL or a file on a network or FUSE filesystem].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Background threads doing readahead [default: 8 for a local file; 16 for a URL or a file on
    /// a network or FUSE filesystem].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub io_threads: Option<u32>,
    /// Read local files through the block cache too, instead of replying to the kernel straight
    /// from a read-only mapping of the file (the default on local filesystems).
    #[arg(long)]
    pub no_map: bool,
    /// Reply to reads of a local file by copying from its mapping (`writev`) instead of splicing
    /// the file's pages into the FUSE device.
    #[arg(long)]
    pub no_splice: bool,
    /// Ask the kernel for FUSE over io_uring (Linux 6.14+ with the fuse module's enable_uring
    /// parameter on): requests come through per-CPU rings instead of /dev/fuse reads; without
    /// the kernel's consent the mount uses /dev/fuse (`stfs stats` says which).
    #[arg(long)]
    pub io_uring: bool,
    /// Kernel readahead of the mount in KiB (root only; 0 leaves the kernel's 128 alone) [default: 1024].
    #[arg(long, value_name = "KIB")]
    pub kernel_readahead_kb: Option<u32>,
    /// Largest read request to ask the kernel for, in KiB, 4 to 16384 (the kernel grants at most
    /// fs.fuse.max_pages_limit pages; `stfs stats` shows what it granted) [default: 1024].
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u32).range(4..=16384))]
    pub max_request_kb: Option<u32>,
    /// Also show every tensor as NAME.npy (a NumPy header, then the raw bytes) for np.load.
    #[arg(long)]
    pub npy: bool,
    /// Serve float tensors converted to this dtype (only `f32`): BF16, F16, F8, F4 and F64 become
    /// F32; integer and bool tensors keep their bytes and dtype (metadata.json: `served_dtype`).
    #[arg(long = "as", value_name = "DTYPE", value_parser = ["f32"])]
    pub as_dtype: Option<String>,
    /// How names become paths: `flat` (one file per tensor in the root) or `tree` (split on `.`).
    #[arg(long, value_name = "LAYOUT", value_parser = ["flat", "tree"])]
    pub layout: Option<String>,
    /// Do not re-serve the checkpoint's own files (each shard, the *.index.json) in the root, nor
    /// an hf:// repository's small files (config.json, tokenizer files). By default they are there
    /// under their own names, byte for byte, for loaders that open the .safetensors file
    /// (safe_open, from_pretrained): same blocks, cache and readahead as the tensor files.
    #[arg(long)]
    pub no_checkpoint_file: bool,
    /// Remote checkpoints.
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Prometheus metrics (boxed: rarely given, and the other subcommands' arguments are small).
    #[command(flatten)]
    pub metrics: Box<MetricsArgs>,
}

/// Exporting a mount's counters (those of `.stfs/stats.json`) in the Prometheus text format.
#[derive(Args, Debug, Default, Clone)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// Write the counters in the Prometheus text format to this file every 5 s, atomically (a new
    /// file renamed over it), for node_exporter's textfile collector (name it *.prom in the
    /// collector's directory); removed at unmount [default: off].
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
    /// Serve the counters in the Prometheus text format at http://ADDR/metrics; loopback addresses
    /// only (127.0.0.1:9400, [::1]:9400) [default: off].
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Options for `http://`, `https://`, `s3://` and `gs://` checkpoints.
#[derive(Args, Debug, Default, Clone)]
#[command(next_help_heading = "Remote checkpoints")]
pub struct RemoteArgs {
    /// Send this header with every request (repeatable): `--header 'Authorization: Bearer ...'`.
    /// Other users can see a command line: put credentials in --header-file or STFS_HEADER_*.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// Send the headers of this file with every request: one `NAME: VALUE` per line (`#` comments
    /// and blank lines skipped), read once at start; refused if group or others may read it.
    /// Every environment variable STFS_HEADER_<ANY> holding `NAME: VALUE` adds one header too.
    #[arg(long, value_name = "PATH")]
    pub header_file: Option<PathBuf>,
    /// Send the bearer token held in this environment variable (HF_TOKEN is used for hub URLs and hf://).
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Give up on a server that does not answer, or answers too slowly, after this long (`45s`,
    /// `500ms`), retries included: opening the checkpoint fails, a read from the mount gets EIO
    /// [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// Tries per request before a read fails (tests and benchmarks) [default: 5].
    #[arg(long, hide = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub http_retries: Option<u32>,
    /// Backoff ceiling of the first retry, doubling per retry up to 32 times it (`20ms`, `1s`) [default: 100ms].
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub http_retry_delay: Option<Duration>,
    /// Limit for connecting and for each wait on the socket (`500ms`, `10s`) [default: 10s, 30s].
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub http_timeout: Option<Duration>,
    /// s3:// and gs://: the store's endpoint (an S3-compatible store, addressed path-style, or a GCS
    /// emulator) [default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST].
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// s3:// and gs://: send anonymous requests (public buckets), look for no credentials.
    #[arg(long)]
    pub no_sign_request: bool,
    /// s3://: the bucket's region [default: AWS_REGION, the profile's, else found from the store].
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
}

/// A duration that [`parse_duration`] could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDuration {
    /// The text as given.
    pub text: String,
}

impl std::fmt::Display for BadDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid duration `{}` (use e.g. 250ms or 3s)", self.text)
    }
}

impl std::error::Error for BadDuration {}

/// Parses `250ms`, `3s` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, BadDuration> {
    let (number, scale) = match text.strip_suffix("ms") {
        Some(n) => (n, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1000),
    };
    match number.trim().parse::<u64>().ok().and_then(|n| n.checked_mul(scale)) {
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Err(BadDuration { text: text.to_string() }),
    }
}

/// Parses a timeout: a [`parse_duration`] longer than zero.
pub fn parse_timeout(text: &str) -> Result<Duration, BadDuration> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(BadDuration { text: text.to_string() }),
        d => Ok(d),
    }
}

/// Arguments of `stfs umount`.
#[derive(Args, Debug)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Detach now even if files are open; the mount goes away when they are closed.
    #[arg(short = 'l', long)]
    pub lazy: bool,
}

/// Arguments of `stfs csi`.
#[derive(Args, Debug)]
pub struct CsiArgs {
    /// The socket kubelet calls: unix:///PATH.
    #[arg(long, value_name = "unix:///PATH")]
    pub endpoint: String,
    /// This node's name (NodeGetInfo's answer).
    #[arg(long, value_name = "NAME")]
    pub node_id: String,
    /// Where shared mounts and their users are recorded; keep it across plugin restarts (a hostPath).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/stfs-csi")]
    pub state_dir: PathBuf,
    /// A node-level disk cache for every daemon (made mode 0700, owned by --daemon-user) [default: off].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// The user the mount daemons run as: a name or a number (nobody's uid by default).
    #[arg(long, value_name = "USER", default_value = "65534")]
    pub daemon_user: String,
    /// Let a volume with no secret use the node's own cloud identity (EC2 instance metadata, the
    /// GCE metadata server, gcloud): any pod author could read what the node may. Off by default.
    #[arg(long)]
    pub allow_node_credentials: bool,
    /// A cgroup (v2) the mount daemons join, created if missing, so that they outlive this
    /// plugin's container: a container runtime ends every process in a stopped container's cgroup.
    /// In a DaemonSet: the host's /sys/fs/cgroup mounted in, and hostPID [default: the plugin's own].
    #[arg(long, value_name = "DIR")]
    pub daemon_cgroup: Option<PathBuf>,
}

const CSI_HELP: &str = "\
Volume attributes (source, cacheSize, layout, uid, gid, ...) and secrets (HF_TOKEN, AWS_*,
GOOGLE_APPLICATION_CREDENTIALS_JSON): see docs/kubernetes.md. Logs go to stderr
(RUST_LOG=stfs=debug for more); each daemon logs to STATE/private/*/daemon.log.

Example:
  stfs csi --endpoint unix:///csi/csi.sock --node-id \"$NODE_NAME\" --cache-dir /var/cache/stfs \\
    --daemon-cgroup /host/sys/fs/cgroup/stfs-csi-daemons";

/// Arguments of `stfs mount-info`.
#[derive(Args, Debug)]
pub struct MountInfoArgs {
    /// The path (links followed up to its last component, which is looked up in mountinfo).
    pub path: PathBuf,
}

/// Arguments of `stfs inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The checkpoint: a .safetensors file, a *.index.json, a directory of shards, a URL, or hf://ORG/REPO.
    pub source: String,
    /// Print the same JSON document a mount serves as metadata.json.
    #[arg(long)]
    pub json: bool,
    /// Remote checkpoints.
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Arguments of `stfs extract`.
#[derive(Args, Debug)]
pub struct ExtractArgs {
    /// The checkpoint: a .safetensors file, a *.index.json, a directory of shards, a URL, or hf://ORG/REPO.
    pub source: String,
    /// Tensor names, as in the header (`stfs inspect` lists them).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub tensors: Vec<String>,
    /// Extract every tensor.
    #[arg(long)]
    pub all: bool,
    /// Directory to write into (created if missing).
    #[arg(short = 'o', long = "output-dir", value_name = "DIR", default_value = ".")]
    pub output_dir: PathBuf,
    /// Write NAME.npy (a NumPy header, then the bytes) instead of the raw bytes.
    #[arg(long)]
    pub npy: bool,
    /// Remote checkpoints.
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Arguments of `stfs cat`.
#[derive(Args, Debug)]
pub struct CatArgs {
    /// The checkpoint: a .safetensors file, a *.index.json, a directory of shards, a URL, or hf://ORG/REPO.
    pub source: String,
    /// The tensor's name, as in the header.
    pub tensor: String,
    /// Write the .npy form (a NumPy header, then the bytes).
    #[arg(long)]
    pub npy: bool,
    /// Remote checkpoints.
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Arguments of `stfs install-helper`.
#[derive(Args, Debug)]
pub struct InstallHelperArgs {
    /// Directory mount(8) looks in for helpers.
    #[arg(long, value_name = "DIR", default_value = "/sbin")]
    pub prefix: PathBuf,
    /// Replace an existing mount.fuse.stfs that points elsewhere.
    #[arg(long)]
    pub force: bool,
    /// Remove the link instead (only if it is a symbolic link).
    #[arg(long, conflicts_with = "force")]
    pub remove: bool,
}

/// Arguments of `stfs cache`.
#[derive(Args, Debug)]
pub struct CacheArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: CacheAction,
}

/// The `stfs cache` actions.
#[derive(Subcommand, Debug)]
pub enum CacheAction {
    /// Print what a cache directory holds: blocks, bytes, sources, last use.
    Info {
        /// The cache directory.
        dir: PathBuf,
    },
    /// Remove every cached block (mounts using the directory go on, fetching again).
    Clear {
        /// The cache directory.
        dir: PathBuf,
    },
}

const CACHE_HELP: &str = "\
Actions:
  info DIR    what a cache directory holds: blocks, bytes, sources, last use
  clear DIR   remove every cached block

Examples:
  stfs mount --cache-dir ~/.cache/stfs https://host/model.safetensors /mnt/model
  stfs cache info ~/.cache/stfs
  stfs cache clear ~/.cache/stfs";

/// Arguments of `stfs stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Print the counters in the Prometheus text format (labelled with the mount point and the
    /// source) instead of the summary.
    #[arg(long, conflicts_with_all = ["json", "watch"])]
    pub prometheus: bool,
    /// Print the raw counters of .stfs/stats.json, as JSON, instead of the summary.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Reprint the summary every SECS seconds (default 1), with the throughput of each interval,
    /// until interrupted or the mount goes away.
    #[arg(long, value_name = "SECS", num_args = 0..=1, require_equals = true, default_missing_value = "1",
          value_parser = parse_watch)]
    pub watch: Option<f64>,
}

/// A `--watch` interval: seconds, from 0.1 to a day.
fn parse_watch(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if (0.1..=86400.0).contains(&secs) => Ok(secs),
        _ => Err(format!("{text:?} is not a number of seconds from 0.1 to 86400")),
    }
}

/// Extra help for `stfs mount`.
const MOUNT_HELP: &str = "\
Mount options (-o, comma-separated, a comma inside a value written \\,; each long flag works as
-o name=value; a flag wins over the same -o option, and of a repeated -o option the last wins):
  cache_size=SIZE, block_size=SIZE, allow_other, threads=N, io_threads=N,
  kernel_readahead_kb=KIB, max_request_kb=KIB, log_file=PATH, foreground, debug, npy, as=f32,
  layout=flat|tree, header=NAME:VALUE, header_file=PATH, token_env=VAR,
  timeout=DURATION,
  no_checkpoint_file, cache_dir=DIR, cache_dir_size=SIZE, no_passthrough,
  uid=N, gid=N (owner of every file), umask=M, fmask=M, dmask=M (octal: mode
  bits removed from files, directories), allow_root, auto_unmount,
  drop_privileges[=USER],
  endpoint_url=URL, region=REGION, no_sign_request, no_map, no_splice, io_uring
  metrics_file=PATH, metrics_addr=ADDR
  ro, nosuid, nodev, noatime, _netdev, x-* and other generic mount(8) options
  are accepted and ignored.
Sizes: 4096, 512K, 64M, 1.5G (binary units; a fraction is rounded down to
whole bytes). Durations: 30s, 500ms.

Nothing may be mounted on the mount point, and no file of the checkpoint may be
under it. A user who is not root needs read-write access to /dev/fuse and
fusermount3 (package fuse3); when either is missing, the error says which and
what to do. Without /dev/fuse at all, a fusermount3 on PATH (a proxy that mounts
for a container) mounts instead.

MOUNTPOINT /dev/fd/N (libfuse's convention): serve descriptor N, a /dev/fuse
that the caller opened and mounted; no privilege needed. Not applicable there:
--auto-unmount (refused), kernel_readahead_kb (the mounter sets it), `stfs
umount` (the mounter unmounts; the daemon exits when the connection ends).

Examples:
  stfs mount model.safetensors /mnt/model
  stfs mount -o cache_size=2G,allow_other model.safetensors /mnt/model
  stfs mount --cache-dir /var/cache/stfs https://host/model.safetensors /mnt/model
  stfs mount -f model.safetensors /mnt/model     # foreground; Ctrl-C unmounts
  stfs mount --drop-privileges nobody -o allow_other model.safetensors /mnt/m
  stfs mount s3://bucket/model.safetensors.index.json /mnt/m  # AWS chain
  stfs mount gs://bucket/model.safetensors /mnt/m             # Google ADC";

/// Extra help for `stfs stats`.
const STATS_HELP: &str = "\
The summary: the bytes programs read from the mount, the bytes stfs read
from the source for them (and their ratio), opens handed to the kernel,
memory (and disk) cache hit rates, throughput (average since the mount, or
over each interval under --watch) and errors. Every counter is in --json.

Examples:
  stfs stats /mnt/model                  # the summary
  stfs stats --watch /mnt/model          # the same, updated every second
  stfs stats --json /mnt/model | jq .cache_hits
  stfs stats --prometheus /mnt/model     # the Prometheus text format";

/// Extra help for `stfs umount`.
const UMOUNT_HELP: &str = "\
Only stfs mounts (type fuse.stfs) are unmounted; anything else mounted there is
named and left alone. What is mounted is read from /proc/self/mountinfo without
touching the mount, so this returns within 2 s even when the daemon is stopped
or hung (longer only while the kernel is still working through the inodes of
a large mount, up to 60 s). As root it calls umount2(2); as another user it runs `fusermount3 -u`
(package fuse3), which unmounts only that user's own mounts.

Examples:
  stfs umount /mnt/model
  stfs umount --lazy /mnt/model     # files are still open: detach now";

/// Extra help for `stfs extract`.
const EXTRACT_HELP: &str = "\
Files are named as a mount names them (`stfs inspect` lists the tensors);
an existing file is replaced.

Examples:
  stfs extract model.safetensors lm_head.weight model.norm.weight -o out/
  stfs extract --npy model.safetensors lm_head.weight      # writes ./lm_head.weight.npy
  stfs extract --all https://host/model.safetensors -o weights/";

/// Extra help for `stfs cat`.
const CAT_HELP: &str = "\
Examples:
  stfs cat model.safetensors lm_head.weight | od -A d -t f4 | head
  stfs cat --npy model.safetensors lm_head.weight > lm_head.npy";

#[cfg(test)]
mod tests {
    use crate::cli::args::*;

    #[test]
    fn durations_in_milliseconds_or_seconds() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("soon").is_err() && parse_duration("99999999999999999s").is_err());
        assert_eq!(parse_duration("soon").unwrap_err().to_string(), "invalid duration `soon` (use e.g. 250ms or 3s)");
        assert_eq!(parse_timeout("45s"), Ok(Duration::from_secs(45)));
        assert!(parse_timeout("0s").is_err() && parse_timeout("0").is_err());
    }

    /// Help texts of at most 100 columns are never re-wrapped by clap (which wraps at 100 at most)
    /// (a 103-column line came out as "the options\nare\nthose of").
    #[test]
    fn help_texts_fit_100_columns() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        cli.build();
        for command in std::iter::once(&cli).chain(cli.get_subcommands()) {
            for text in [command.get_after_help(), command.get_before_help()].into_iter().flatten() {
                for line in text.to_string().lines() {
                    assert!(line.chars().count() <= 100, "{}: {line:?}", command.get_name());
                }
            }
        }
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

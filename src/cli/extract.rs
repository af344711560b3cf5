//! `stfs extract` and `stfs cat`: tensor bytes (raw, or `.npy` with `--npy`) written without a mount,
//! for containers without /dev/fuse. They read through the same filesystem operations and block engine
//! as a mount, so the bytes, the file names and the backing reads are the mount's.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use super::progress::Progress;
use super::{CatArgs, ExtractArgs, RemoteArgs};
use crate::checkpoint;
use crate::engine::EngineConfig;
use crate::fs::Fs;
use crate::mount::session::{self, ServeOptions};
use crate::stats::Stats;
use crate::tree::namespace::{Ino, Layout, Views, ROOT_INO};
use crate::util::describe_io;

/// Extra help for `stfs extract`.
pub const EXTRACT_HELP: &str = "\
Files are named as a mount names them (`stfs inspect` lists the tensors); an existing file is replaced.

Examples:
  stfs extract model.safetensors lm_head.weight model.norm.weight -o out/
  stfs extract --npy model.safetensors lm_head.weight      # writes ./lm_head.weight.npy
  stfs extract --all https://host/model.safetensors -o weights/";

/// Extra help for `stfs cat`.
pub const CAT_HELP: &str = "\
Examples:
  stfs cat model.safetensors lm_head.weight | od -A d -t f4 | head
  stfs cat --npy model.safetensors lm_head.weight > lm_head.npy";

/// Bytes asked of the filesystem per read: what the kernel asks of a mount, at most.
const CHUNK: u32 = 4 << 20;
/// Cache for a copy: enough blocks for the readahead to stay ahead of a sequential reader.
const COPY_CACHE_SIZE: u64 = 64 << 20;

/// One file to write: the tensor's name, its path in the (flat) namespace, its inode and size.
struct Item {
    name: String,
    path: String,
    ino: Ino,
    size: u64,
}

/// Runs `stfs extract`.
pub fn run_extract(args: ExtractArgs) -> Result<ExitCode, String> {
    let fs = open_fs(&args.source, &args.remote, args.npy)?;
    let names: Vec<String> = if args.all {
        fs.namespace().tensors().iter().map(|t| t.name.clone()).collect()
    } else {
        let mut seen = HashSet::new();
        args.tensors.iter().filter(|n| seen.insert(n.as_str())).cloned().collect()
    };
    // Every name is checked before anything is written: a typo leaves no partial output behind.
    let items = names.iter().map(|n| find(&fs, &args.source, n, args.npy)).collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(&args.output_dir)
        .map_err(|e| format!("{}: {}", args.output_dir.display(), describe_io(&e)))?;
    let mut progress = Progress::new(items.iter().map(|i| i.size).sum());
    for item in &items {
        write_file(&fs, item, &args.output_dir, &mut progress).map_err(|e| format!("{}: {e}", args.source))?;
    }
    progress.finish();
    Ok(ExitCode::SUCCESS)
}

/// Runs `stfs cat`: the tensor to stdout; a closed pipe ends quietly with success.
pub fn run_cat(args: CatArgs) -> Result<ExitCode, String> {
    let fs = open_fs(&args.source, &args.remote, args.npy)?;
    let item = find(&fs, &args.source, &args.tensor, args.npy)?;
    let mut progress = Progress::new(item.size);
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(CHUNK as usize, stdout.lock());
    let result = copy(&fs, &item, &mut out, &mut progress).and_then(|()| out.flush().map_err(CopyError::Write));
    progress.finish();
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(CopyError::Write(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(CopyError::Write(e)) => Err(format!("writing to stdout: {}", describe_io(&e))),
        Err(e) => Err(format!("{}: {e}", args.source)),
    }
}

/// Opens `source` as a mount would, without mounting: flat layout, with `.npy` views if asked.
fn open_fs(source: &str, remote: &RemoteArgs, npy: bool) -> Result<Arc<Fs>, String> {
    let stats = Arc::new(Stats::default());
    let opened = checkpoint::open(source, &remote.open_options(stats.clone())?).map_err(|e| e.to_string())?;
    let options = ServeOptions {
        mountpoint: PathBuf::new(),
        engine: EngineConfig { cache_size: COPY_CACHE_SIZE, ..super::options::default_engine(source) },
        threads: 1,
        allow_other: false,
        kernel_readahead_kb: 0,
        layout: Layout::Flat,
        views: Views { npy, as_f32: false },
    };
    session::build_fs(opened, &options, stats)
}

/// The file that serves tensor `name` (its `.npy` view if `npy`), or an error naming the tensor.
fn find(fs: &Fs, source: &str, name: &str, npy: bool) -> Result<Item, String> {
    let tensor = fs.namespace().tensors().iter().find(|t| t.name == name);
    let Some(tensor) = tensor else {
        return Err(format!("{source}: no tensor named {name:?} (`stfs inspect {source}` lists them)"));
    };
    let path = if npy { tensor.npy_path.clone() } else { Some(tensor.path.clone()) };
    let path =
        path.ok_or_else(|| format!("{source}: tensor {name:?} has no .npy view (its dtype has no NumPy equivalent)"))?;
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = fs.lookup(ino, OsStr::new(part)).map_err(|e| format!("{source}: {path}: {e}"))?.ino;
    }
    let size = fs.getattr(ino).map_err(|e| format!("{source}: {path}: {e}"))?.size;
    Ok(Item { name: name.to_string(), path, ino, size })
}

/// Why a copy stopped.
enum CopyError {
    /// Reading the tensor failed (a backing read error, or the file ended early).
    Read(String),
    /// Writing the output failed.
    Write(io::Error),
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::Read(text) => f.write_str(text),
            CopyError::Write(e) => f.write_str(&describe_io(e)),
        }
    }
}

/// Streams the whole of `item` into `out`, front to back, so the engine sees one sequential reader.
fn copy(fs: &Fs, item: &Item, out: &mut impl Write, progress: &mut Progress) -> Result<(), CopyError> {
    fs.open(item.ino, false).map_err(|e| CopyError::Read(format!("{}: {e}", item.path)))?;
    let mut offset = 0u64;
    loop {
        if offset >= item.size {
            return Ok(());
        }
        let data = match fs.read(item.ino, offset, CHUNK) {
            Ok(d) if d.is_empty() => {
                return Err(CopyError::Read(format!("{}: ended at byte {offset} of {}", item.path, item.size)))
            }
            Ok(d) => d,
            Err(e) => return Err(CopyError::Read(format!("reading tensor {:?}: {e}", item.name))),
        };
        if let Err(e) = out.write_all(&data) {
            return Err(CopyError::Write(e));
        }
        offset += data.len() as u64;
        progress.advance(data.len() as u64, &item.name);
    }
}

/// Writes `item` to `dir/PATH`: first under a temporary name, renamed into place once complete, so
/// an interrupted extract never leaves a truncated file under the tensor's name.
fn write_file(fs: &Fs, item: &Item, dir: &Path, progress: &mut Progress) -> Result<(), String> {
    let target = dir.join(&item.path);
    // A short temporary name: the tensor's own may already be near NAME_MAX.
    let temp = dir.join(format!(".stfs-partial-{}-{}", std::process::id(), item.ino));
    let fail = |path: &Path, e: &io::Error| format!("{}: {}", path.display(), describe_io(e));
    let file = std::fs::File::create(&temp).map_err(|e| fail(&temp, &e))?;
    let mut out = io::BufWriter::with_capacity(CHUNK as usize, file);
    let copied = copy(fs, item, &mut out, progress).and_then(|()| out.flush().map_err(CopyError::Write));
    let result = match copied {
        Ok(()) => std::fs::rename(&temp, &target).map_err(|e| fail(&target, &e)),
        Err(CopyError::Write(e)) => Err(fail(&temp, &e)),
        Err(e) => Err(e.to_string()),
    };
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

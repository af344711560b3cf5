//! `stfs extract` and `stfs cat`: tensor bytes (raw, or `.npy` with `--npy`) written without a mount,
//! for containers without /dev/fuse. They read through the same filesystem operations and block engine
//! as a mount, so the bytes, the file names and the backing reads are the mount's.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::checkpoint;
use crate::cli::args::{CatArgs, ExtractArgs, RemoteArgs};
use crate::cli::defaults::default_engine;
use crate::cli::progress::Progress;
use crate::cli::report::Failure;
use crate::engine::EngineConfig;
use crate::format::PrintablePath;
use crate::fs::{Fs, FsError};
use crate::mount::build::{build_fs, FsOptions, Owner};
use crate::stats::Stats;
use crate::tree::namespace::{Ino, Layout, Views, ROOT_INO};
use crate::util::describe_io;

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

/// A tensor that cannot be written as asked.
#[derive(Debug)]
enum ExtractError {
    /// The checkpoint has no tensor of that name.
    NoSuchTensor {
        /// The checkpoint as named.
        source: String,
        /// The name asked for.
        name: String,
    },
    /// `--npy` for a tensor whose dtype NumPy cannot express.
    NoNpyView {
        /// The tensor.
        name: String,
    },
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::NoSuchTensor { source, name } => {
                write!(f, "no tensor named {name:?} (`stfs inspect {source}` lists them)")
            }
            ExtractError::NoNpyView { name } => {
                write!(f, "tensor {name:?} has no .npy view (its dtype has no NumPy equivalent)")
            }
        }
    }
}

impl std::error::Error for ExtractError {}

/// Runs `stfs extract`.
pub fn run_extract(args: ExtractArgs) -> Result<ExitCode, Failure> {
    let fs = open_fs(&args.source, &args.remote, args.npy)?;
    let names: Vec<String> = if args.all {
        fs.namespace().tensors().iter().map(|t| t.name.clone()).collect()
    } else {
        let mut seen = HashSet::new();
        args.tensors.iter().filter(|n| seen.insert(n.as_str())).cloned().collect()
    };
    // Every name is checked before anything is written: a typo leaves no partial output behind.
    let items = names.iter().map(|n| find(&fs, &args.source, n, args.npy)).collect::<Result<Vec<_>, _>>()?;
    create_output_dir(&args.output_dir)?;
    let mut progress = Progress::new(total_size(&items));
    for item in &items {
        write_file(&fs, &args.source, item, &args.output_dir, &mut progress)?;
    }
    progress.finish();
    Ok(ExitCode::SUCCESS)
}

/// Creates the output directory (and its parents) if missing; one that exists as anything but a
/// directory (a link to one is followed) is "not a directory", not std's "file exists".
fn create_output_dir(dir: &Path) -> Result<(), Failure> {
    match std::fs::create_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !dir.is_dir() => {
            Err(Failure::io(shown(dir), io::Error::from_raw_os_error(libc::ENOTDIR)))
        }
        result => result.map_err(|e| Failure::io(shown(dir), e)),
    }
}

/// Bytes to write in all, for the progress bar: saturating, since the sizes of many shards' tensors
/// (as a server claims them) together need not fit in a u64.
fn total_size(items: &[Item]) -> u64 {
    items.iter().fold(0u64, |total, item| total.saturating_add(item.size))
}

/// Runs `stfs cat`: the tensor to stdout; a closed pipe ends quietly with success.
pub fn run_cat(args: CatArgs) -> Result<ExitCode, Failure> {
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
        Err(CopyError::Write(e)) => Err(Failure::io("writing to stdout", e)),
        Err(e) => Err(Failure::at(&args.source, e)),
    }
}

/// Opens `source` as a mount would, without mounting: flat layout, with `.npy` views if asked. The
/// checkpoint's own files are in the tree, as in a default mount, so a tensor whose name collides
/// with one is written under the name the mount gives it; they are never written themselves (the
/// source is that file already).
fn open_fs(source: &str, remote: &RemoteArgs, npy: bool) -> Result<Arc<Fs>, Failure> {
    let stats = Arc::new(Stats::default());
    let opened = checkpoint::open(source, &remote.open_options(stats.clone())?)?.own(source)?;
    let options = FsOptions {
        engine: EngineConfig { cache_size: COPY_CACHE_SIZE, ..default_engine(source) },
        layout: Layout::Flat,
        views: Views { npy, as_f32: false },
        owner: Owner::of_process(),
        checkpoint_files: true,
        perms: (None, None),
        disk: None,
    };
    Ok(build_fs(opened, &options, stats)?)
}

/// The file that serves tensor `name` (its `.npy` view if `npy`), or an error naming the tensor.
fn find(fs: &Fs, source: &str, name: &str, npy: bool) -> Result<Item, Failure> {
    let tensor = fs.namespace().tensors().iter().find(|t| t.name == name);
    let Some(tensor) = tensor else {
        return Err(Failure::at(source, ExtractError::NoSuchTensor { source: source.into(), name: name.into() }));
    };
    let path = if npy { tensor.npy_path.clone() } else { Some(tensor.path.clone()) };
    let path = path.ok_or_else(|| Failure::at(source, ExtractError::NoNpyView { name: name.into() }))?;
    let at_path = |e: FsError| Failure::at(format!("{source}: {}", PrintablePath(&path)), e);
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = fs.lookup(ino, OsStr::new(part)).map_err(at_path)?.ino;
    }
    let size = fs.getattr(ino).map_err(at_path)?.size;
    Ok(Item { name: name.to_string(), path, ino, size })
}

/// Why a copy stopped.
#[derive(Debug)]
enum CopyError {
    /// The file could not be opened.
    Open {
        /// Its path in the namespace.
        path: String,
        /// Why.
        error: FsError,
    },
    /// Reading the tensor failed (a backing read error).
    Read {
        /// The tensor.
        name: String,
        /// Why.
        error: FsError,
    },
    /// The file ended before its size.
    EndedEarly {
        /// Its path in the namespace.
        path: String,
        /// Where it ended.
        offset: u64,
        /// The size it should have.
        size: u64,
    },
    /// Writing the output failed.
    Write(io::Error),
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyError::Open { path, error } => write!(f, "{}: {error}", PrintablePath(path)),
            CopyError::Read { name, error } => write!(f, "reading tensor {name:?}: {error}"),
            CopyError::EndedEarly { path, offset, size } => {
                write!(f, "{}: ended at byte {offset} of {size}", PrintablePath(path))
            }
            CopyError::Write(e) => f.write_str(&describe_io(e)),
        }
    }
}

impl std::error::Error for CopyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CopyError::Open { error, .. } | CopyError::Read { error, .. } => Some(error),
            CopyError::Write(e) => Some(e),
            CopyError::EndedEarly { .. } => None,
        }
    }
}

/// Streams the whole of `item` into `out`, front to back, so the engine sees one sequential reader.
fn copy(fs: &Fs, item: &Item, out: &mut impl Write, progress: &mut Progress) -> Result<(), CopyError> {
    fs.open(item.ino, false).map_err(|error| CopyError::Open { path: item.path.clone(), error })?;
    let mut offset = 0u64;
    loop {
        if offset >= item.size {
            return Ok(());
        }
        let data = match fs.read(item.ino, offset, CHUNK) {
            Ok(d) if d.is_empty() => {
                return Err(CopyError::EndedEarly { path: item.path.clone(), offset, size: item.size })
            }
            Ok(d) => d,
            Err(error) => return Err(CopyError::Read { name: item.name.clone(), error }),
        };
        if let Err(e) = out.write_all(&data) {
            return Err(CopyError::Write(e));
        }
        offset += data.len() as u64;
        progress.advance(data.len() as u64, &item.name);
    }
}

/// Creates `path` for writing, only if nothing is there (not even a dangling link: O_EXCL, and
/// O_NOFOLLOW), so a link planted under the temporary name never redirects the write. Something
/// already there is named; any other failure (a directory the user may not write, a filesystem
/// out of inodes) names `target`, the file the user asked for.
fn create_exclusive(path: &Path, target: &Path) -> Result<std::fs::File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options.open(path).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => Failure::at(
            shown(path),
            "already exists (left by an interrupted extract, or planted there); remove it and retry",
        ),
        _ => Failure::io(shown(target), e),
    })
}

/// `path` as an error line shows it: the tensor's part of it may hold any character but `/` and NUL.
fn shown(path: &Path) -> String {
    PrintablePath(&path.to_string_lossy()).to_string()
}

/// Writes `item` to `dir/PATH`: first under a temporary name, renamed into place once complete, so
/// an interrupted extract never leaves a truncated file under the tensor's name. A failure to write
/// (a full disk) or to rename names the output file; a failure to read names `source`.
fn write_file(fs: &Fs, source: &str, item: &Item, dir: &Path, progress: &mut Progress) -> Result<(), Failure> {
    let target = dir.join(&item.path);
    // A short temporary name: the tensor's own may already be near NAME_MAX.
    let temp = dir.join(format!(".stfs-partial-{}-{}", std::process::id(), item.ino));
    let file = create_exclusive(&temp, &target)?;
    let mut out = io::BufWriter::with_capacity(CHUNK as usize, file);
    let copied = copy(fs, item, &mut out, progress).and_then(|()| out.flush().map_err(CopyError::Write));
    let result = match copied {
        Ok(()) => std::fs::rename(&temp, &target).map_err(|e| Failure::io(shown(&target), e)),
        Err(CopyError::Write(e)) => Err(Failure::io(shown(&target), e)),
        Err(e) => Err(Failure::at(source, e)),
    };
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use crate::cli::extract::{total_size, Item};

    /// Nine tensors of 2^61 - 1 bytes (shards a server may claim) sum past a u64 without a panic.
    #[test]
    fn the_total_to_write_saturates() {
        let item = |size| Item { name: "w".into(), path: "w".into(), ino: 2, size };
        let items: Vec<Item> = (0..9).map(|_| item((1u64 << 61) - 1)).collect();
        assert_eq!(total_size(&items), u64::MAX);
        assert_eq!(total_size(&[item(3), item(4)]), 7);
    }
}

//! Building the filesystem for an opened checkpoint: the engine, the namespace and the attributes
//! every file shows. It needs nothing of a mount (no mount point, no FUSE threads), so `stfs
//! extract` and `stfs cat` read through the very filesystem a mount serves.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::checkpoint::Checkpoint;
use crate::engine::disk::DiskCache;
use crate::engine::{Engine, EngineConfig};
use crate::fs::Fs;
use crate::stats::Stats;
use crate::tree::namespace::{AttrBase, Component, Layout, NameClash, Namespace, RootFile, RootKind, Shard, Views};

/// Whose files they are: the owner and group every file and directory shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Owner {
    /// The user and group of this process (who mounted).
    pub fn of_process() -> Owner {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Owner { uid, gid }
    }
}

/// What the filesystem shows and how it reads: everything of `stfs mount`'s options that is not
/// about the mount itself.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Engine tuning (block size, cache size, readahead threads).
    pub engine: EngineConfig,
    /// Path layout.
    pub layout: Layout,
    /// Extra views.
    pub views: Views,
    /// Owner of every file.
    pub owner: Owner,
    /// Re-serve the checkpoint's own files (every shard, the index; shards through the engine) and
    /// an `hf://` repository's small files in the root (`-o no_checkpoint_file` turns this off).
    pub checkpoint_files: bool,
    /// Permission bits of files and of directories (`-o fmask`/`dmask`/`umask`); `None`: the read
    /// bits of the backing files.
    pub perms: (Option<u16>, Option<u16>),
    /// The disk tier below the engine's cache (`--cache-dir`), opened and checked by the caller.
    pub disk: Option<Arc<DiskCache>>,
}

/// Builds the filesystem for `checkpoint`, counting into `stats`: its own shards and files in the
/// root, each of its components in its folder. Files are readable by whom the backing files are
/// (the read bits common to all local shards and all local small files served: one a mount
/// serves is never readable by more than its target), and dated by the newest shard.
pub fn build_fs(checkpoint: Checkpoint, options: &FsOptions, stats: Arc<Stats>) -> Result<Arc<Fs>, NameClash> {
    let engine = Engine::with_disk_cache(options.engine.clone(), options.disk.clone(), stats);
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut read_bits = 0o444;
    let Checkpoint { shards, index_files, repo_files, components } = checkpoint;
    let root = crate::checkpoint::Checkpoint { shards, index_files, repo_files, components: Vec::new() };
    let parts = std::iter::once((String::new(), root)).chain(components.into_iter().map(|c| (c.folder, c.checkpoint)));
    let mut laid_out = Vec::new();
    for (folder, part) in parts {
        let mut shards = Vec::new();
        for s in part.shards {
            newest = newest.max(s.source.modified().unwrap_or(newest));
            if !crate::checkpoint::is_url(s.source.name()) {
                if let Ok(meta) = std::fs::metadata(s.source.name()) {
                    read_bits &= meta.permissions().mode();
                }
            }
            let name = s.source.name().to_string();
            let file = if options.checkpoint_files { crate::checkpoint::file_name(&name) } else { None };
            let source = engine.add_source(s.source);
            shards.push(Shard { source, name, header: s.header, file });
        }
        let mut files = Vec::new();
        if options.checkpoint_files {
            let local = part.index_files.iter().chain(&part.repo_files).filter_map(|f| f.local_mode);
            read_bits = local.fold(read_bits, |bits, mode| bits & mode);
            files = root_files(part.index_files, part.repo_files);
        }
        laid_out.push(Component { folder, shards, files });
    }
    let ns = Namespace::build_components(laid_out, options.layout, options.views)?;
    let (file_perm, dir_perm) = AttrBase::perms_from_mode(read_bits);
    let (file_perm, dir_perm) = (options.perms.0.unwrap_or(file_perm), options.perms.1.unwrap_or(dir_perm));
    let Owner { uid, gid } = options.owner;
    let blksize = u32::try_from(options.engine.block_size).unwrap_or(u32::MAX);
    let base = AttrBase { uid, gid, mtime: newest, file_perm, dir_perm, blksize };
    Ok(Arc::new(Fs::new(ns, engine, base)))
}

/// The small files a checkpoint came with, as the namespace serves them in the root: its index
/// files, then the repository's files.
pub fn root_files(
    index_files: Vec<crate::checkpoint::RootFile>,
    repo_files: Vec<crate::checkpoint::RootFile>,
) -> Vec<RootFile> {
    let tagged =
        |kind: RootKind| move |f: crate::checkpoint::RootFile| RootFile { name: f.name, bytes: f.bytes.into(), kind };
    let index = index_files.into_iter().map(tagged(RootKind::Index));
    index.chain(repo_files.into_iter().map(tagged(RootKind::Repo))).collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use crate::format::Dtype;
    use crate::mount::build::{build_fs, FsOptions, Owner};
    use crate::tree::namespace::{Layout, Views, ROOT_INO};

    /// A checkpoint becomes a filesystem with no mount point and no FUSE threads anywhere.
    #[test]
    fn builds_without_any_mount_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let tensors = vec![("a.b".to_string(), Dtype::U8, vec![3u64], vec![1u8, 2, 3])];
        std::fs::write(&path, crate::format::writer::serialize(&tensors, None).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let checkpoint = crate::checkpoint::open(path.to_str().unwrap(), &Default::default()).unwrap();
        let options = FsOptions {
            engine: crate::engine::EngineConfig {
                block_size: 4096,
                cache_size: 1 << 20,
                io_threads: 1,
                map_files: true,
                source_timeout: std::time::Duration::from_secs(30),
            },
            layout: Layout::Tree,
            views: Views { npy: true, as_f32: false },
            owner: Owner { uid: 1234, gid: 5678 },
            checkpoint_files: true,
            perms: (None, None),
            disk: None,
        };
        let fs = build_fs(checkpoint, &options, Default::default()).unwrap();
        let a = fs.lookup(ROOT_INO, "a".as_ref()).unwrap();
        let b = fs.lookup(a.ino, "b".as_ref()).unwrap();
        // Owned as told, readable by whom the backing file is, blocks of the engine's size.
        assert_eq!((b.uid, b.gid, b.perm, b.size, b.blksize), (1234, 5678, 0o440, 3, 4096));
        assert_eq!(fs.read(b.ino, 0, 10).unwrap(), [1, 2, 3]);
        assert!(fs.lookup(a.ino, "b.npy".as_ref()).is_ok());
        // The checkpoint itself is served, byte for byte.
        let whole = fs.lookup(ROOT_INO, "m.safetensors".as_ref()).unwrap();
        assert_eq!(fs.read(whole.ino, 0, 1 << 20).unwrap(), std::fs::read(&path).unwrap());
    }
}

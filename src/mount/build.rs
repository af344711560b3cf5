//! Building the filesystem for an opened checkpoint: the engine, the namespace and the attributes
//! every file shows. It needs nothing of a mount (no mount point, no FUSE threads), so `stfs
//! extract` and `stfs cat` read through the very filesystem a mount serves.

use std::sync::Arc;
use std::time::SystemTime;

use crate::checkpoint::Checkpoint;
use crate::engine::disk::DiskCache;
use crate::engine::{Engine, EngineConfig};
use crate::fs::Fs;
use crate::stats::Stats;
use crate::tree::namespace::{
    AttrBase, Component, Layout, NameClash, Namespace, RootFile, RootKind, Shard, Views, Which,
};

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
/// root, each of its components in its folder, each other checkpoint of a folder in that folder's
/// `%.checkpoints/NAME` (its files beside the folder's own). Files are readable by whom the backing shards are
/// (the read bits common to all local shards, taken from the descriptor each was pinned by: one
/// a mount serves is never readable by more than its target), `-o fmask`/`dmask`/`umask` narrowing
/// them further and never widening them, and dated by the newest shard. A local small file (or
/// index) readable by fewer users than that is left out, with a warning naming it: it never
/// narrows the whole mount.
pub fn build_fs(checkpoint: Checkpoint, options: &FsOptions, stats: Arc<Stats>) -> Result<Arc<Fs>, NameClash> {
    let engine = Engine::with_disk_cache(options.engine.clone(), options.disk.clone(), stats);
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut parts: Vec<(String, Which, crate::checkpoint::Checkpoint)> = Vec::new();
    let mut root = checkpoint;
    let components = std::mem::take(&mut root.components);
    for (folder, mut part) in
        std::iter::once((String::new(), root)).chain(components.into_iter().map(|c| (c.folder, c.checkpoint)))
    {
        let others = std::mem::take(&mut part.others);
        let main = Which { other_of: None, name: std::mem::take(&mut part.name), variant: part.variant.take() };
        parts.push((folder.clone(), main, part));
        // Each other checkpoint of the folder in its folder of them (`in_folder`'s OTHERS_DIR).
        for other in others {
            let at = if folder.is_empty() { String::new() } else { format!("{folder}/") };
            let which = Which { other_of: Some(folder.clone()), name: other.name.clone(), variant: other.variant };
            parts.push((format!("{at}{}/{}", crate::checkpoint::OTHERS_DIR, other.name), which, other.checkpoint));
        }
    }
    let read_bits = parts.iter().flat_map(|(_, _, part)| &part.shards).fold(0o444, |bits, s| bits & shard_mode(s));
    let mut laid_out = Vec::new();
    for (folder, which, part) in parts {
        let mut shards = Vec::new();
        for s in part.shards {
            newest = newest.max(s.source.modified().unwrap_or(newest));
            let name = s.source.name().to_string();
            let file = if options.checkpoint_files { crate::checkpoint::file_name(&name) } else { None };
            let source = engine.add_source(s.source);
            let starts = s.header.tensors.iter().filter(|t| t.byte_len() > 0).map(|t| s.header.tensor_range(t).start);
            engine.set_tensor_starts(source, starts.collect());
            shards.push(Shard { source, name, header: s.header, file });
        }
        let mut files = Vec::new();
        if options.checkpoint_files {
            // Another checkpoint's files are in its main one's folder: named from there.
            let files_in = which.other_of.as_deref().unwrap_or(&folder);
            let index_files = readable_as_shards(part.index_files, read_bits, files_in);
            files = root_files(index_files, readable_as_shards(part.repo_files, read_bits, files_in));
        }
        laid_out.push(Component { folder, shards, files, checkpoint: which });
    }
    let ns = Namespace::build_components(laid_out, options.layout, options.views)?;
    let (file_perm, dir_perm) = AttrBase::perms_from_mode(read_bits);
    let (file_perm, dir_perm) =
        (options.perms.0.map_or(file_perm, |p| p & file_perm), options.perms.1.map_or(dir_perm, |p| p & dir_perm));
    let Owner { uid, gid } = options.owner;
    let blksize = u32::try_from(options.engine.block_size).unwrap_or(u32::MAX);
    let base = AttrBase { uid, gid, mtime: newest, file_perm, dir_perm, blksize };
    Ok(Arc::new(Fs::new(ns, engine, base)))
}

/// The mode bits a shard bounds the mount's by: a local shard's own (`st_mode` from the
/// descriptor it was pinned by), all for a remote one, none (fail closed) for a local shard
/// whose mode is unknown.
fn shard_mode(shard: &crate::checkpoint::OpenedShard) -> u32 {
    match shard.local_mode {
        Some(mode) => mode,
        None if crate::checkpoint::is_url(shard.source.name()) => 0o444,
        None => 0,
    }
}

/// `files` of the mount's folder `folder` without the local ones readable by fewer users than
/// `read_bits` (the shards') let in, each left out with a warning line naming it.
fn readable_as_shards(
    files: Vec<crate::checkpoint::RootFile>,
    read_bits: u32,
    folder: &str,
) -> Vec<crate::checkpoint::RootFile> {
    let wanted = read_bits & 0o444;
    let (kept, narrower): (Vec<_>, Vec<_>) =
        files.into_iter().partition(|f| f.local_mode.is_none_or(|mode| mode & wanted == wanted));
    for file in narrower {
        let shown = if folder.is_empty() { file.name } else { format!("{folder}/{}", file.name) };
        log::warn!("{shown}: not served: readable by fewer users than the checkpoint");
    }
    kept
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

    /// A checkpoint of one tensor `a.b` at `path`, with `mode`.
    fn write_checkpoint(path: &std::path::Path, mode: u32) {
        let tensors = vec![("a.b".to_string(), Dtype::U8, vec![3u64], vec![1u8, 2, 3])];
        std::fs::write(path, crate::format::writer::serialize(&tensors, None).unwrap()).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn options() -> FsOptions {
        FsOptions {
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
        }
    }

    /// A checkpoint becomes a filesystem with no mount point and no FUSE threads anywhere.
    #[test]
    fn builds_without_any_mount_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write_checkpoint(&path, 0o640);
        let checkpoint = crate::checkpoint::open(path.to_str().unwrap(), &Default::default()).unwrap();
        let fs = build_fs(checkpoint, &options(), Default::default()).unwrap();
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

    /// A shard's mode is the one of the file opened, taken from its descriptor: the path renamed
    /// over by a file every user may read, or gone, after the open widens nothing (the mount
    /// fails closed, never open).
    #[test]
    fn a_shard_narrows_by_the_file_opened_not_by_its_path_again() {
        let dir = tempfile::tempdir().unwrap();
        let (path, wider) = (dir.path().join("m.safetensors"), dir.path().join("wider"));
        write_checkpoint(&path, 0o600);
        write_checkpoint(&wider, 0o644);
        let checkpoint = crate::checkpoint::open(path.to_str().unwrap(), &Default::default()).unwrap();
        std::fs::rename(&wider, &path).unwrap();
        let fs = build_fs(checkpoint, &options(), Default::default()).unwrap();
        assert_eq!(fs.lookup(ROOT_INO, "m.safetensors".as_ref()).unwrap().perm, 0o400, "renamed over");
        let checkpoint = crate::checkpoint::open(path.to_str().unwrap(), &Default::default()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let fs = build_fs(checkpoint, &options(), Default::default()).unwrap();
        assert_eq!(fs.lookup(ROOT_INO, "m.safetensors".as_ref()).unwrap().perm, 0o444, "0644 when opened");
        write_checkpoint(&wider, 0o600);
        let checkpoint = crate::checkpoint::open(wider.to_str().unwrap(), &Default::default()).unwrap();
        std::fs::remove_file(&wider).unwrap();
        let fs = build_fs(checkpoint, &options(), Default::default()).unwrap();
        assert_eq!(fs.lookup(ROOT_INO, "wider".as_ref()).unwrap().perm, 0o400, "gone");
    }

    /// A small file readable by fewer users than the shards is left out, and the mount keeps the
    /// shards' modes; one as readable (or a remote one) is served. `-o fmask`/`dmask` narrow the
    /// modes and never widen them.
    #[test]
    fn a_narrower_small_file_is_left_out_and_masks_never_widen() {
        use crate::checkpoint::RootFile;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write_checkpoint(&path, 0o644);
        let open = || crate::checkpoint::open(path.to_str().unwrap(), &Default::default()).unwrap();
        let mut checkpoint = open();
        let file = |name: &str, local_mode| RootFile { name: name.into(), bytes: b"{}".to_vec(), local_mode };
        checkpoint.repo_files.push(file("README.md", Some(0o100600)));
        checkpoint.repo_files.push(file("config.json", Some(0o100644)));
        checkpoint.repo_files.push(file("remote.json", None));
        checkpoint.index_files.push(file("m.safetensors.index.json", Some(0o100640)));
        let fs = build_fs(checkpoint, &options(), Default::default()).unwrap();
        for name in ["README.md", "m.safetensors.index.json"] {
            assert!(fs.lookup(ROOT_INO, name.as_ref()).is_err(), "{name} served");
        }
        for name in ["config.json", "remote.json", "m.safetensors"] {
            assert_eq!(fs.lookup(ROOT_INO, name.as_ref()).unwrap().perm, 0o444, "{name}");
        }
        // Masks narrow, and never widen past what the shards let in.
        let masked = FsOptions { perms: (Some(0o440), Some(0o550)), ..options() };
        let fs = build_fs(open(), &masked, Default::default()).unwrap();
        assert_eq!(fs.lookup(ROOT_INO, "m.safetensors".as_ref()).unwrap().perm, 0o440);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let wide = FsOptions { perms: (Some(0o444), Some(0o555)), ..options() };
        let fs = build_fs(open(), &wide, Default::default()).unwrap();
        assert_eq!(fs.lookup(ROOT_INO, "m.safetensors".as_ref()).unwrap().perm, 0o440);
        assert_eq!(fs.getattr(ROOT_INO).unwrap().perm, 0o550);
    }
}

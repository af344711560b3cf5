//! How a mount's components are laid out into the tree ([`Namespace::lay_out`]): each in its
//! folder, its checkpoint's files and small files first, then one file per tensor under its
//! escaped name (flat, or split on `.` in the tree layout), the names of the folders below
//! reserved. Inode numbers follow from this order (see `namespace`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::format::Dtype;
use crate::tree::names;
use crate::tree::namespace::{
    Component, ComponentInfo, Content, Dir, Ino, Layout, NameClash, Namespace, Node, NodeKind, RootFile, RootKind,
    ServedFile, Shard, Tensor, Views, CONTROL_DIR, METADATA_NAME, RESERVED, ROOT_INO, SELF_NAME, STATS_NAME,
};

impl Namespace {
    /// Lays out the tree for `components` with empty `metadata.json` files ([`Namespace::build`]
    /// renders them). The root's comes first (an empty one is made if there is none); the others
    /// are laid out in folder order, each in its folder. Each shard's tensor list is
    /// moved into [`Namespace::tensors`] (not copied: a header may hold a million entries), so the
    /// kept shards' `header.tensors` are empty.
    pub(super) fn lay_out(
        mut components: Vec<Component>,
        layout: Layout,
        views: Views,
    ) -> Result<Namespace, NameClash> {
        let root = components.iter().position(|c| c.folder.is_empty()).map(|i| components.remove(i));
        // A folder must be a path of plain names (the caller's are; nothing else could be served).
        components.retain(|c| {
            let plain = c.folder.split('/').all(|part| !matches!(part, "" | "." | ".."));
            if !plain {
                log::warn!("folder {:?} is not served: not a relative path of plain names", c.folder);
            }
            plain
        });
        components.sort_by(|a, b| a.folder.cmp(&b.folder));
        components.insert(0, root.unwrap_or_default());
        let folders = child_folders(&components);
        let others_files = others_files(&components);
        let mut ns = Namespace {
            nodes: Vec::new(),
            tensors: Vec::new(),
            shards: Vec::new(),
            shard_tensors: Vec::new(),
            components: Vec::new(),
        };
        ns.nodes.push(Node { parent: ROOT_INO, kind: NodeKind::Dir(Dir::default()) });
        let root_metadata = ns.add_file(ROOT_INO, METADATA_NAME.into(), Content::Bytes(Arc::from(&[][..])), 0);
        let control = ns.add_dir(ROOT_INO, CONTROL_DIR.into());
        ns.add_file(control, STATS_NAME.into(), Content::Stats, 0);
        for component in components {
            let (dir, metadata) = if component.folder.is_empty() {
                (ROOT_INO, root_metadata)
            } else {
                let Some(dir) = ns.make_dirs(ROOT_INO, &component.folder) else {
                    log::warn!("folder {:?} is not served: the name is taken", component.folder);
                    continue;
                };
                (dir, ns.add_file(dir, METADATA_NAME.into(), Content::Bytes(Arc::from(&[][..])), 0))
            };
            // Another checkpoint's own files are served in its main one's folder, laid out before it.
            let files_dir = match &component.checkpoint.other_of {
                Some(owner) if !owner.is_empty() => ns.make_dirs(ROOT_INO, owner).unwrap_or(dir),
                Some(_) => ROOT_INO,
                None => dir,
            };
            let names = Reserved { folders: &folders, others_files: &others_files };
            ns.lay_out_component(component, (dir, files_dir), metadata, &names, layout, views)?;
        }
        ns.sort_entries();
        Ok(ns)
    }

    /// Lays out one component in `dir`: its checkpoint's files (in `files_dir`: `dir`, or for
    /// another checkpoint its main one's folder), its small files, then its tensors (the names
    /// `names` reserves in its folder reserved in `dir`).
    fn lay_out_component(
        &mut self,
        component: Component,
        (dir, files_dir): (Ino, Ino),
        metadata: Ino,
        names: &Reserved<'_>,
        layout: Layout,
        views: Views,
    ) -> Result<(), NameClash> {
        let Component { folder, mut shards, files, checkpoint } = component;
        let first_shard = self.shards.len();
        let first_tensor = self.tensors.len();
        let (served, repo_served, mut reserved) = self.add_checkpoint_files(files_dir, first_shard, &mut shards, files);
        if files_dir != dir {
            // Its files are not in its folder: only the mount's own names are taken there.
            reserved = RESERVED.iter().map(|r| r.to_string()).collect();
        }
        let mut reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
        reserved.extend(names.folders.get(&folder).into_iter().flatten().map(String::as_str));
        reserved.extend(names.others_files.get(&folder).into_iter().flatten().map(String::as_str));
        let prefix = if folder.is_empty() { String::new() } else { format!("{folder}/") };
        for (local_index, shard) in shards.iter_mut().enumerate() {
            let shard_index = first_shard + local_index;
            let first = self.tensors.len();
            for info in std::mem::take(&mut shard.header.tensors) {
                let i = self.tensors.len();
                let start = shard.header.data_start() + info.data_offsets.0;
                let len = info.byte_len();
                let elements = info.shape.iter().product::<u64>();
                let (content, served_len) = match crate::views::f32::converted_len(info.dtype, elements) {
                    Some(n) if views.as_f32 && crate::views::f32::served_as_f32(info.dtype) => (Content::F32(i), n),
                    _ => (Content::Tensor(i), len),
                };
                let converted = matches!(content, Content::F32(_));
                let served_dtype = if converted { Dtype::F32 } else { info.dtype };
                let place = Place { base: dir, prefix: &prefix, reserved: &reserved, layout, views };
                let path = self.place(&place, &info.name, content, served_len, "")?;
                // The view shows what the tensor's file serves: under `as=f32`, the conversion.
                let npy_header =
                    if views.npy { crate::views::npy::npy_header(served_dtype, &info.shape).ok() } else { None };
                self.tensors.push(Tensor {
                    name: info.name,
                    dtype: info.dtype,
                    shape: info.shape,
                    shard: shard_index,
                    source: shard.source,
                    start,
                    len,
                    path,
                    served_dtype,
                    served_len,
                    npy_path: None,
                });
                // A tensor whose header cannot be expressed (never for a validated file) has no view.
                if let Some(header) = npy_header {
                    let size = header.len() as u64 + served_len;
                    let content = Content::Npy { tensor: i, header: header.into(), converted };
                    let name = std::mem::take(&mut self.tensors[i].name);
                    let placed = self.place(&place, &name, content, size, ".npy");
                    self.tensors[i].name = name;
                    self.tensors[i].npy_path = Some(placed?);
                }
            }
            self.shard_tensors.push(first..self.tensors.len());
        }
        self.shards.extend(shards);
        self.components.push(ComponentInfo {
            folder,
            dir,
            metadata,
            shards: first_shard..self.shards.len(),
            tensors: first_tensor..self.tensors.len(),
            served,
            repo_served,
            checkpoint,
        });
        Ok(())
    }

    /// Adds a component's own files to its directory `dir`: each shard that has a [`Shard::file`]
    /// name, then the index files, then the repository's files (one whose path has folders goes
    /// into them, made as needed). A name already taken (a reserved one, or an earlier file's) is
    /// left out: that file is not served. Returns the checkpoint's files and the repository's
    /// files served, and every name tensors may not take in `dir`.
    fn add_checkpoint_files(
        &mut self,
        dir: Ino,
        first_shard: usize,
        shards: &mut [Shard],
        root_files: Vec<RootFile>,
    ) -> (Vec<ServedFile>, Vec<ServedFile>, Vec<String>) {
        let (mut served, mut repo_served) = (Vec::new(), Vec::new());
        let mut reserved: Vec<String> = RESERVED.iter().map(|r| r.to_string()).collect();
        let mut claim = |name: &Option<String>| match name {
            Some(n) if !reserved.contains(n) => {
                reserved.push(n.clone());
                true
            }
            Some(n) => {
                log::warn!("file {n:?} is not served: the name is taken");
                false
            }
            None => false,
        };
        for (i, shard) in shards.iter_mut().enumerate() {
            // Another checkpoint's file in its main one's folder: that folder's own files came first.
            let taken = shard.file.as_ref().is_some_and(|n| self.dir(dir).is_some_and(|d| d.get(n).is_some()));
            if taken {
                log::warn!("file {:?} is not served: the name is taken", shard.file.as_deref().unwrap_or_default());
            }
            if taken || !claim(&shard.file) {
                shard.file = None;
                continue;
            }
            let name = shard.file.clone().unwrap_or_default();
            let size = shard.header.file_len;
            self.add_file(dir, name.clone(), Content::Checkpoint(first_shard + i), size);
            served.push(ServedFile { name, shard: Some(i), size });
        }
        let (index_files, repo_files): (Vec<_>, Vec<_>) =
            root_files.into_iter().partition(|f| f.kind == RootKind::Index);
        for file in index_files.into_iter().chain(repo_files) {
            if !claim(&Some(file.name.clone())) {
                continue;
            }
            let (parent, leaf) = match file.name.rsplit_once('/') {
                Some((folders, leaf)) => (self.make_dirs(dir, folders), leaf),
                None => (Some(dir), file.name.as_str()),
            };
            let Some(parent) = parent.filter(|&p| self.dir(p).is_some_and(|d| d.get(leaf).is_none())) else {
                log::warn!("file {:?} is not served: the name is taken", file.name);
                continue;
            };
            let size = file.bytes.len() as u64;
            self.add_file(parent, leaf.to_string(), Content::Bytes(file.bytes), size);
            let entry = ServedFile { name: file.name, shard: None, size };
            match file.kind {
                RootKind::Index => served.push(entry),
                RootKind::Repo => repo_served.push(entry),
            }
        }
        (served, repo_served, reserved)
    }

    /// The directory at `path` (`a/b`) below `dir`, made as needed; `None` if a file holds one of
    /// its names.
    fn make_dirs(&mut self, dir: Ino, path: &str) -> Option<Ino> {
        path.split('/').try_fold(dir, |parent, name| match self.dir(parent)?.get(name) {
            Some(ino) => self.dir(ino).map(|_| ino),
            None => Some(self.add_dir(parent, name.to_string())),
        })
    }

    /// Adds the file for one tensor under its escaped path in `place`'s folder; returns the path
    /// from the mount root.
    fn place(
        &mut self,
        place: &Place<'_>,
        name: &str,
        content: Content,
        size: u64,
        suffix: &str,
    ) -> Result<String, NameClash> {
        let &Place { base, prefix, reserved: reserved_in_root, layout, views } = place;
        let clash = |path: String| NameClash { path, tensor: name.to_string() };
        let (dirs, leaf): (Vec<&str>, &str) = match layout {
            Layout::Flat => (Vec::new(), name),
            Layout::Tree => {
                let mut parts: Vec<&str> = name.split('.').collect();
                let leaf = parts.pop().unwrap_or_default();
                (parts, leaf)
            }
        };
        let mut dir = base;
        let mut path = prefix.to_string();
        for part in dirs {
            let reserved = if dir == base { reserved_in_root } else { &[] };
            let file_name = names::escape(part, reserved);
            path.push_str(&file_name);
            path.push('/');
            dir = match self.dir(dir).and_then(|d| d.get(&file_name)) {
                Some(ino) if self.dir(ino).is_some() => ino,
                // A tensor already holds this name: it moves into the new directory as SELF_NAME.
                Some(ino) => self.demote_to_self(dir, &file_name, ino),
                None => self.add_dir(dir, file_name),
            };
        }
        let reserved = if dir == base { reserved_in_root } else { &[] };
        // With the .npy view on, a raw file may not end in `.npy`: that dot is escaped (`x%2Enpy`).
        let guard = (views.npy && suffix.is_empty()).then_some(".npy");
        let file_name = names::escape_view(leaf, reserved, suffix, guard);
        if let Some(existing) = self.dir(dir).and_then(|d| d.get(&file_name)) {
            if layout == Layout::Tree && self.dir(existing).is_some() {
                // A directory of this name exists: the tensor lives inside it.
                let self_name = format!("{SELF_NAME}{suffix}");
                if self.dir(existing).and_then(|d| d.get(&self_name)).is_some() {
                    return Err(clash(format!("{path}{file_name}/{self_name}")));
                }
                self.add_file(existing, self_name.clone(), content, size);
                return Ok(format!("{path}{file_name}/{self_name}"));
            }
            return Err(clash(format!("{path}{file_name}")));
        }
        self.add_file(dir, file_name.clone(), content, size);
        Ok(format!("{path}{file_name}"))
    }

    /// Turns the file `ino` named `name` in `parent` into `name/SELF_NAME`; returns the new directory.
    fn demote_to_self(&mut self, parent: Ino, name: &str, ino: Ino) -> Ino {
        self.remove_entry(parent, name);
        let new_dir = self.add_dir(parent, name.to_string());
        self.insert_entry(new_dir, SELF_NAME.to_string(), ino);
        self.nodes[(ino - 1) as usize].parent = new_dir;
        if let Some(NodeKind::File { content: Content::Tensor(i), .. }) = self.node(ino).map(|n| &n.kind) {
            let i = *i;
            self.tensors[i].path = format!("{}/{SELF_NAME}", self.tensors[i].path);
        }
        new_dir
    }
}

/// The names a component's tensors may not take in its folder, beside its own files': the folders
/// the mount shows in it, and the files of its folder's other checkpoints served there.
struct Reserved<'a> {
    folders: &'a HashMap<String, Vec<String>>,
    others_files: &'a HashMap<String, Vec<String>>,
}

/// For every folder with other checkpoints than its main one, the names of their files served in
/// it (shards, index files).
fn others_files(components: &[Component]) -> HashMap<String, Vec<String>> {
    let mut names: HashMap<String, Vec<String>> = HashMap::new();
    for c in components {
        if let Some(owner) = &c.checkpoint.other_of {
            let files = c.shards.iter().filter_map(|s| s.file.clone());
            let index_files = c.files.iter().filter(|f| f.kind == RootKind::Index).map(|f| f.name.clone());
            names.entry(owner.clone()).or_default().extend(files.chain(index_files));
        }
    }
    names
}

/// Where and how [`Namespace::place`] lays a component's tensors out.
struct Place<'a> {
    /// The component's directory.
    base: Ino,
    /// Its folder and a `/`, or empty for the root: the start of every path.
    prefix: &'a str,
    /// The names its tensors may not take in `base`.
    reserved: &'a [&'a str],
    layout: Layout,
    views: Views,
}

/// For every folder (the root is `""`), the names of the folders directly in it that the mount
/// shows: components' folders and those of small files, and every folder on the way to them.
fn child_folders(components: &[Component]) -> HashMap<String, Vec<String>> {
    let mut folders: HashMap<String, Vec<String>> = HashMap::new();
    let mut add = |path: &str| {
        let mut parent = String::new();
        for name in path.split('/') {
            let names = folders.entry(parent.clone()).or_default();
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
            parent = if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") };
        }
    };
    for c in components {
        if !c.folder.is_empty() {
            add(&c.folder);
        }
        for f in &c.files {
            if let Some((dirs, _)) = f.name.rsplit_once('/') {
                add(&if c.folder.is_empty() { dirs.to_string() } else { format!("{}/{dirs}", c.folder) });
            }
        }
    }
    folders
}

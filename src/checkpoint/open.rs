//! [`open`]: what the user named (a file, an `*.index.json`, a directory, a URL) to opened shards.
//!
//! Everything that can be wrong with the input is found here, before anything is mounted.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::confined::Confinement;
use super::error::{OpenError, OpenProblem};
use super::index_file::MAX_INDEX_SIZE;
use super::local::open_index;
use super::shard::{checked, file_name, open_all, open_file, open_source, Checkpoint, OpenedShard, RootFile};
use crate::format::index;
use crate::source::http::{display_name, HttpError, HttpOptions, HttpSource};
use crate::source::object::{self, ObjectOptions};
use crate::source::Source;

/// How to reach remote checkpoints.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Headers, token, timeouts and the counters for `http://` and `https://` sources (and the
    /// object stores read through them).
    pub http: HttpOptions,
    /// For an `hf://` name, a directory or a local index, also take the small files beside the
    /// checkpoint (configs, tokenizers) into [`Checkpoint::repo_files`]: a mount serves them
    /// (`stfs mount` asks, unless `-o no_checkpoint_file`); inspecting or extracting has no use
    /// for them.
    pub repo_files: bool,
    /// Endpoint, region and credential settings of `s3://` and `gs://` sources.
    pub object: ObjectOptions,
}

/// Whether `spec` names a remote object (an `http(s)://` URL, an `hf://` repository, or an
/// `s3://` or `gs://` object).
pub fn is_url(spec: &str) -> bool {
    spec.starts_with("http://")
        || spec.starts_with("https://")
        || crate::source::hub::is_hub_spec(spec)
        || object::is_object_url(spec)
}

/// The scheme of a `scheme://...` name no source kind handles, if `spec` is one and no such
/// local path exists.
fn unknown_scheme(spec: &str) -> Option<&str> {
    let (scheme, _) = spec.split_once("://")?;
    let plausible = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    (plausible && !is_url(spec) && !Path::new(spec).exists()).then_some(scheme)
}

/// Opens what the user named: a `.safetensors` file, a `*.index.json` of shards, a directory of
/// `*.safetensors` shards (with the folders below it that hold a checkpoint as components: a model
/// repository as it is laid out), an `http(s)://` URL of a file or of an index, an `hf://`
/// repository, or an object store's prefix (`s3://BUCKET/PREFIX/`, laid out as a repository).
///
/// A remote checkpoint is opened within one [`HttpOptions::timeout`], index and shards together:
/// a server that stalls makes this fail in that time, not in one timeout per request.
pub fn open(spec: &str, options: &OpenOptions) -> Result<Checkpoint, OpenError> {
    if is_url(spec) {
        let mut options = options.clone();
        options.http.deadline = Some(Instant::now() + options.http.timeout);
        if crate::source::hub::is_hub_spec(spec) {
            return super::hub::open_hub(spec, &options);
        }
        if object::is_object_prefix(spec) {
            return super::prefix::open_prefix(spec, &options);
        }
        return if url_path(spec).ends_with(".json") {
            open_url_index(spec, &options)
        } else {
            open_url(spec, &options).map(single)
        };
    }
    if let Some(scheme) = unknown_scheme(spec) {
        return Err(OpenError::new(spec, OpenProblem::UnknownScheme(scheme.to_string())));
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return super::folders::open_folder(path, options.repo_files);
    } else if !spec.ends_with(".json") {
        return open_file(path).map(single);
    }
    // An index: it, its shards and the small files beside it are read by the link rule of its
    // folder.
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let rule = Confinement::of(folder).map_err(|e| OpenError::new(folder.display().to_string(), e))?;
    let mut checkpoint = open_index(path, &rule, MAX_INDEX_SIZE)?;
    if options.repo_files {
        checkpoint.repo_files = super::beside::small_files_beside(&rule, folder);
    }
    Ok(checkpoint)
}

fn single(shard: OpenedShard) -> Checkpoint {
    Checkpoint::of(vec![shard])
}

/// A single remote safetensors object; its reads get their own timeouts once its header is in.
fn open_url(url: &str, options: &OpenOptions) -> Result<OpenedShard, OpenError> {
    let source = Arc::new(open_remote(url, options).map_err(|e| OpenError::new(display_name(url), e))?);
    let shard = open_source(Arc::clone(&source) as Arc<dyn Source>)?;
    source.opened();
    Ok(shard)
}

/// The remote object `url` names, by scheme: an object store's, or a plain URL.
fn open_remote(url: &str, options: &OpenOptions) -> Result<HttpSource, HttpError> {
    if object::is_object_url(url) {
        return object::open(url, &options.http, &options.object);
    }
    HttpSource::open(url, options.http.clone())
}

/// A remote index whose shards are resolved relative to its URL.
fn open_url_index(url: &str, options: &OpenOptions) -> Result<Checkpoint, OpenError> {
    let shown = display_name(url);
    let source = open_remote(url, options).map_err(|e| OpenError::new(&shown, e))?;
    let len = usize::try_from(source.len()).unwrap_or(usize::MAX);
    if len > MAX_INDEX_SIZE {
        return Err(OpenError::new(&shown, OpenProblem::IndexTooLarge { len, limit: MAX_INDEX_SIZE }));
    }
    let mut bytes = vec![0; len];
    let mut reader = source.open_reader().map_err(|e| OpenError::new(&shown, e))?;
    reader.read_exact_at(&mut bytes, 0).map_err(|e| OpenError::new(&shown, e))?;
    let mut index = index::parse_index(&bytes).map_err(|e| OpenError::new(&shown, e))?;
    index.merge_spellings(index::without_dot_segments);
    // An object store's key may hold '?' or '#': only a URL has a query to drop.
    let path = if object::is_object_url(url) { url } else { url_path(url) };
    let base = match Some(path).and_then(|u| u.rfind('/')) {
        Some(i) => &url[..=i],
        None => url,
    };
    let urls: Vec<String> = index.shards.iter().map(|f| format!("{base}{f}")).collect();
    let opened = open_all(&urls, |url| open_url(url, options))?;
    let index_files = file_name(url).map(|name| RootFile::remote(name, bytes)).into_iter().collect();
    checked(&shown, opened, Some(&index), index_files)
}

fn url_path(url: &str) -> &str {
    if object::is_object_url(url) {
        return url;
    }
    url.split(['?', '#']).next().unwrap_or(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::test_support::make_fifo;
    use std::error::Error;

    /// A valid shard of one tensor at `path`.
    fn write_shard(path: &Path) {
        let tensors = [("x".to_string(), crate::format::Dtype::U8, vec![4], b"abcd".to_vec())];
        crate::util::test_support::write_new(path, crate::format::writer::serialize(&tensors, None).unwrap());
    }

    #[test]
    fn problems_name_the_path_and_keep_their_source() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.safetensors");
        let err = open(missing.to_str().unwrap(), &OpenOptions::default()).err().unwrap();
        assert_eq!(err.to_string(), format!("{}: no such file or directory", missing.display()));
        let io = err.source().and_then(|s| s.downcast_ref::<std::io::Error>()).unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);

        let err = open(dir.path().to_str().unwrap(), &OpenOptions::default()).err().unwrap();
        assert_eq!(err.to_string(), format!("{}: directory holds no *.safetensors files", dir.path().display()));
        assert!(err.source().is_none());

        let short = dir.path().join("short.safetensors");
        std::fs::write(&short, [0u8; 3]).unwrap();
        let err = open(short.to_str().unwrap(), &OpenOptions::default()).err().unwrap();
        let format = err.source().and_then(|s| s.downcast_ref::<crate::format::FormatError>());
        assert!(matches!(format, Some(crate::format::FormatError::HeaderTooSmall { file_len: 3 })), "{err:?}");
    }

    /// A FIFO would block the read forever and /dev/zero never ends: a local index is refused
    /// unless it is a regular file, and past [`MAX_INDEX_SIZE`] by its length.
    #[test]
    fn an_index_that_is_not_a_regular_file_or_too_large_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        make_fifo(&path("fifo.index.json"));
        std::os::unix::fs::symlink("/dev/zero", path("zero.index.json")).unwrap();
        let large = std::fs::File::create_new(path("large.index.json")).unwrap();
        large.set_len(MAX_INDEX_SIZE as u64 + 1).unwrap(); // sparse: no disk
        let expected = [
            ("fifo.index.json", "is not a regular file".to_string()),
            ("zero.index.json", "resolves outside the model's folder".to_string()),
            (
                "large.index.json",
                format!("index of {} bytes is over the limit of {MAX_INDEX_SIZE}", MAX_INDEX_SIZE + 1),
            ),
        ];
        for (name, problem) in expected {
            let err = open(path(name).to_str().unwrap(), &OpenOptions::default()).err().unwrap();
            assert_eq!(err.to_string(), format!("{}: {problem}", path(name).display()));
        }
    }

    /// A shard of a directory that cannot be opened fails the open, naming it, instead of leaving
    /// its tensors out of the checkpoint (an HF cache snapshot whose blob is missing).
    #[test]
    fn every_safetensors_entry_of_a_directory_is_a_shard_or_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        write_shard(&path("a.safetensors"));
        let spec = dir.path().to_str().unwrap();
        assert_eq!(open(spec, &OpenOptions::default()).unwrap().shards.len(), 1);
        let second = path("b.safetensors");
        type Make<'a> = &'a dyn Fn(&Path) -> std::io::Result<()>;
        // (A folder named `b.safetensors` is a folder of the walk, not a file of it.)
        let broken: [(Make, &str); 3] = [
            (&|p| std::os::unix::fs::symlink(p.with_extension("gone"), p), "no such file or directory"),
            (&|p| std::os::unix::fs::symlink(p, p), "too many levels of symbolic links"),
            (
                &|p| {
                    std::fs::create_dir_all(p.with_extension("d"))
                        .and(std::os::unix::fs::symlink(p.with_extension("d"), p))
                },
                "is a directory",
            ),
        ];
        for (make, problem) in broken {
            make(&second).unwrap();
            let err = open(spec, &OpenOptions::default()).err().unwrap();
            assert_eq!(err.to_string(), format!("{}: {problem}", second.display()));
            std::fs::remove_file(&second).or_else(|_| std::fs::remove_dir(&second)).unwrap();
        }
        make_fifo(&path("c.safetensors"));
        let err = open(spec, &OpenOptions::default()).err().unwrap();
        assert_eq!(err.to_string(), format!("{}: is not a regular file", path("c.safetensors").display()));
    }

    /// A shard name of the index is shown escaped in the one-line message: no second line, no
    /// terminal escape taken from the file.
    #[test]
    fn a_hostile_shard_name_stays_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors.index.json");
        crate::util::test_support::write_new(
            &path,
            br#"{"weight_map":{"x":"model\n\u001b[2Jfake: line.safetensors"}}"#,
        );
        let err = open(path.to_str().unwrap(), &OpenOptions::default()).err().unwrap();
        let shown = r"model\n\u{1b}[2Jfake: line.safetensors: no such file or directory";
        assert_eq!(err.to_string(), format!("{}/{shown}", dir.path().display()));
    }

    /// The index files of a folder's checkpoints are held in the daemon's memory: bounded
    /// together, not only one by one (three of 48 MiB: two are re-served, the third checkpoint
    /// left out).
    #[test]
    fn a_folder_re_serves_index_files_within_a_total() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("model.safetensors"));
        for variant in ["a", "b", "c"] {
            let mut index = br#"{"weight_map": {"x": "model.safetensors"}}"#.to_vec();
            index.resize(48 << 20, b' ');
            let path = dir.path().join(format!("model.safetensors.index.{variant}.json"));
            crate::util::test_support::write_new(&path, index);
        }
        let checkpoint = open(dir.path().to_str().unwrap(), &OpenOptions::default()).unwrap();
        let variants: Vec<_> = checkpoint.others.iter().map(|o| o.variant.as_deref()).collect();
        assert_eq!(variants, [Some("a"), Some("b")]);
        let total: usize =
            checkpoint.others.iter().flat_map(|o| &o.checkpoint.index_files).map(|f| f.bytes.len()).sum();
        assert_eq!(total, 96 << 20);
        assert!(total <= super::super::index_file::MAX_DIRECTORY_INDEX_TOTAL);
    }

    #[test]
    fn index_problems_keep_the_index_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors.index.json");
        std::fs::write(&path, br#"{"weight_map":{}}"#).unwrap();
        let err = open(path.to_str().unwrap(), &OpenOptions::default()).err().unwrap();
        assert_eq!(err.to_string(), format!("{}: the index's weight_map is empty", path.display()));
        assert!(matches!(err.problem, OpenProblem::Index(index::IndexError::EmptyWeightMap)));
    }
}

//! A folder's checkpoints, as `in_folder` decides them, opened ([`open_every`]): the main one (an
//! error opening it fails the open, naming the file), then every other one (one that cannot be
//! opened is left out with a warning naming it and why: loaders read the folder without it),
//! leaving out an other one whose every file is already a shard of one opened before it (a file an
//! index names is that index's), and one whose index files would take the folder's past
//! [`MAX_DIRECTORY_INDEX_TOTAL`] bytes together (they are held in memory for the mount's life: an
//! index past what is left of that budget is refused before it is read), and those past the first
//! [`MAX_OTHER_CHECKPOINTS`] (one warning naming the folder and how many), so that a hostile
//! repository with many index files costs a bounded amount of fetching at mount time.

use super::error::{OpenError, OpenProblem};
use super::in_folder::InFolder;
use super::index_file::{MAX_DIRECTORY_INDEX_TOTAL, MAX_INDEX_SIZE};
use super::shard::{file_name, Checkpoint, OtherCheckpoint};
use crate::format::PrintablePath;
use crate::source::hub::Choice;

/// The most other checkpoints of one folder that are opened; those past it are left out.
pub(super) const MAX_OTHER_CHECKPOINTS: usize = 64;

/// Opens `found` (file names already joined to the folder's path) with `open`, as the module doc
/// says: `open(choice, limit)` refuses an index past `limit` bytes before reading it. `shown` names
/// the folder in the error of a folder that holds no checkpoint.
pub(super) fn open_every(
    found: InFolder,
    shown: &str,
    open: impl Fn(&Choice, usize) -> Result<Checkpoint, OpenError>,
) -> Result<Checkpoint, OpenError> {
    let Some(main) = found.main else { return Err(OpenError::new(shown, OpenProblem::NoShardFiles)) };
    let mut others = found.others;
    if others.len() > MAX_OTHER_CHECKPOINTS {
        log::warn!(
            "{shown}: {} other checkpoints are not served: a folder's first {MAX_OTHER_CHECKPOINTS} are",
            others.len() - MAX_OTHER_CHECKPOINTS
        );
        others.truncate(MAX_OTHER_CHECKPOINTS);
    }
    let mut checkpoint = open(&main.files, MAX_INDEX_SIZE)?;
    checkpoint.name = main.name;
    checkpoint.variant = main.variant;
    let mut opened: Vec<String> = shard_names(&checkpoint);
    let mut index_bytes = index_bytes(&checkpoint);
    for other in others {
        let files: Vec<String> = match &other.files {
            Choice::Single(name) => vec![name.clone()],
            Choice::Shards(names) => names.clone(),
            Choice::Index(_) => Vec::new(),
        };
        let names: Vec<Option<String>> = files.iter().map(|f| file_name(f)).collect();
        if !names.is_empty() && names.iter().all(|n| n.as_ref().is_some_and(|n| opened.contains(n))) {
            log::debug!("{shown}: {}: shards of a checkpoint opened before it", other.name);
            continue;
        }
        let index_limit = MAX_DIRECTORY_INDEX_TOTAL.saturating_sub(index_bytes).min(MAX_INDEX_SIZE);
        match open(&other.files, index_limit) {
            Ok(opened_other) if index_bytes + self::index_bytes(&opened_other) > MAX_DIRECTORY_INDEX_TOTAL => {
                log::warn!(
                    "{shown}: the other checkpoint {} is not served: the folder's index files would take over \
                     {MAX_DIRECTORY_INDEX_TOTAL} bytes together",
                    other.name
                );
            }
            Ok(opened_other) => {
                index_bytes += self::index_bytes(&opened_other);
                opened.extend(shard_names(&opened_other));
                let (name, variant) = (other.name, other.variant);
                checkpoint.others.push(OtherCheckpoint { name, variant, checkpoint: opened_other });
            }
            Err(error) => log::warn!(
                "{}: not served: {} (another checkpoint of the folder, {})",
                PrintablePath(&error.path),
                error.problem,
                PrintablePath(&other.name)
            ),
        }
    }
    Ok(checkpoint)
}

/// The file names of a checkpoint's shards.
fn shard_names(checkpoint: &Checkpoint) -> Vec<String> {
    checkpoint.shards.iter().filter_map(|s| file_name(s.source.name())).collect()
}

/// The bytes of a checkpoint's index files.
fn index_bytes(checkpoint: &Checkpoint) -> usize {
    checkpoint.index_files.iter().map(|f| f.bytes.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::super::in_folder::Found;
    use super::super::shard::RootFile;
    use super::*;
    use std::cell::RefCell;

    /// A folder whose main checkpoint and each of `others` other ones is an index.
    fn folder_of_indexes(others: usize) -> InFolder {
        let found = |name: String| Found { files: Choice::Index(format!("{name}.json")), name, variant: None };
        InFolder {
            main: Some(found("model.safetensors.index".into())),
            others: (0..others).map(|i| found(format!("model.safetensors.index.v{i}"))).collect(),
        }
    }

    /// Opens `folder` where every index is `index_len` bytes and an open past its limit is refused
    /// (as a fetch refuses one): the limit each open was given.
    fn limits_given(folder: InFolder, index_len: usize) -> (Checkpoint, Vec<usize>) {
        let limits = RefCell::new(Vec::new());
        let checkpoint = open_every(folder, "repo", |choice, limit| {
            limits.borrow_mut().push(limit);
            let Choice::Index(name) = choice else { panic!("{choice:?}") };
            if index_len > limit {
                return Err(OpenError::new(name, OpenProblem::IndexTooLarge { len: index_len, limit }));
            }
            let mut opened = Checkpoint::of(Vec::new());
            opened.index_files.push(RootFile::remote(name.clone(), vec![0; index_len]));
            Ok(opened)
        })
        .expect("the main checkpoint opens");
        (checkpoint, limits.into_inner())
    }

    #[test]
    fn at_most_the_first_64_other_checkpoints_are_opened() {
        let (checkpoint, limits) = limits_given(folder_of_indexes(1000), 10);
        assert_eq!(limits.len(), 1 + MAX_OTHER_CHECKPOINTS, "the main one and the first 64 others are opened");
        assert_eq!(checkpoint.others.len(), MAX_OTHER_CHECKPOINTS);
        assert_eq!(checkpoint.others[0].name, "model.safetensors.index.v0");
    }

    #[test]
    fn each_index_is_read_only_within_what_is_left_of_the_folders_budget() {
        let index_len = 50 << 20;
        let (checkpoint, limits) = limits_given(folder_of_indexes(10), index_len);
        // The main one and one other take 100 MiB: the 28 MiB left is each later index's limit.
        let left = MAX_DIRECTORY_INDEX_TOTAL - 2 * index_len;
        let mut expected = vec![MAX_INDEX_SIZE, MAX_INDEX_SIZE];
        expected.extend([left; 9]);
        assert_eq!(limits, expected);
        assert_eq!(checkpoint.others.len(), 1);
    }
}

//! A folder's checkpoints, as `in_folder` decides them, opened ([`open_every`]): the main one (an
//! error opening it fails the open, naming the file), then every other one (one that cannot be
//! opened is left out with a warning naming it and why: loaders read the folder without it),
//! leaving out an other one whose every file is already a shard of one opened before it (a file an
//! index names is that index's), and one whose index files would take the folder's past
//! [`MAX_DIRECTORY_INDEX_TOTAL`] bytes together (they are held in memory for the mount's life).

use super::error::{OpenError, OpenProblem};
use super::in_folder::InFolder;
use super::index_file::MAX_DIRECTORY_INDEX_TOTAL;
use super::shard::{file_name, Checkpoint, OtherCheckpoint};
use crate::format::PrintablePath;
use crate::source::hub::Choice;

/// Opens `found` (file names already joined to the folder's path) with `open`, as the module doc
/// says; `shown` names the folder in the error of a folder that holds no checkpoint.
pub(super) fn open_every(
    found: InFolder,
    shown: &str,
    open: impl Fn(&Choice) -> Result<Checkpoint, OpenError>,
) -> Result<Checkpoint, OpenError> {
    let Some(main) = found.main else { return Err(OpenError::new(shown, OpenProblem::NoShardFiles)) };
    let mut checkpoint = open(&main.files)?;
    checkpoint.name = main.name;
    checkpoint.variant = main.variant;
    let mut opened: Vec<String> = shard_names(&checkpoint);
    let mut index_bytes = index_bytes(&checkpoint);
    for other in found.others {
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
        match open(&other.files) {
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

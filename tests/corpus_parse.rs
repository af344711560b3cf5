//! Runs the header parser on every file of the hostile-input corpus (`tests/corpus/bad/`): each
//! must be rejected with a message containing the substring `tests/corpus/expected.json` gives.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use stfs::format::{read_header, FormatError, Header};

/// Parses a file already read into memory, reading it as a file would be read.
fn parse(bytes: &[u8]) -> Result<Header, FormatError> {
    let read_at = |buf: &mut [u8], offset: u64| -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start.checked_add(buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?);
        Ok(())
    };
    read_header(read_at, bytes.len() as u64)
}

fn corpus_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus"))
}

fn expected() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(corpus_dir().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn every_corpus_file_is_rejected_with_its_expected_message() {
    let expected = expected();
    assert!(expected.len() >= 45, "corpus has only {} files", expected.len());
    let mut failures = Vec::new();
    for (file_name, needle) in &expected {
        let bytes = std::fs::read(corpus_dir().join("bad").join(file_name)).unwrap();
        match parse(&bytes) {
            Ok(header) => failures.push(format!("{file_name} was accepted: {header:?}")),
            Err(error) => {
                let message = error.to_string();
                // Control characters in a message could drive the user's terminal.
                if !message.contains(needle.as_str()) || message.chars().any(char::is_control) {
                    failures.push(format!("{file_name}: {message:?} (expected {needle:?})"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn expected_json_lists_exactly_the_corpus_files() {
    let mut on_disk: Vec<String> = std::fs::read_dir(corpus_dir().join("bad"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    on_disk.sort();
    let listed: Vec<String> = expected().into_keys().collect();
    assert_eq!(on_disk, listed);
}

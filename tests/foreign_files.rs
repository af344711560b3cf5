//! Files that are not safetensors at all: a PyTorch checkpoint (a `torch.save` zip archive, or a
//! legacy pickle, as `.bin` and `.pt` files on the hub are) is refused with one line saying it is not
//! a safetensors file, that it looks like a PyTorch checkpoint, and how to convert it; any other
//! foreign file is refused as "not a safetensors file" with the reason. A real safetensors file whose
//! length prefix happens to begin like a pickle still mounts.

mod common;

use std::path::Path;

use common::*;
use stfs::format::Dtype;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `stfs inspect` and `stfs mount` both refuse `file`: exit 1, one `stfs: PATH: ` line containing
/// every needle (case-insensitive) and none of `absent`, nothing mounted.
fn assert_refused(file: &Path, needles: &[&str], absent: &[&str]) {
    let mp = workdir();
    for args in
        [vec!["inspect", file.to_str().unwrap()], vec!["mount", file.to_str().unwrap(), mp.path().to_str().unwrap()]]
    {
        let out = stfs(&args);
        let err = stderr_of(&out);
        let mounted = is_mounted(mp.path());
        force_unmount(mp.path());
        assert!(!mounted, "{args:?} mounted it");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.starts_with(&format!("stfs: {}: ", file.display())), "{args:?}: {err}");
        let lower = err.to_lowercase();
        for needle in needles {
            assert!(lower.contains(&needle.to_lowercase()), "{args:?}: expected {needle:?} in {err}");
        }
        for word in absent {
            assert!(!lower.contains(&word.to_lowercase()), "{args:?}: did not expect {word:?} in {err}");
        }
    }
}

const PYTORCH: [&str; 3] = ["not a safetensors file", "looks like a PyTorch checkpoint", "convert"];

/// The start of a zip archive's first local file header, as `torch.save` writes it (version 0,
/// flags 0x0808 from its streaming writer) and as a generic zip tool does (version 20, no flags).
fn zip_file(version_and_flags: [u8; 4]) -> Vec<u8> {
    let mut bytes = b"PK\x03\x04".to_vec();
    bytes.extend_from_slice(&version_and_flags);
    bytes.extend_from_slice(&[0; 18]);
    bytes.extend_from_slice(&(16u16).to_le_bytes()); // name length
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(b"archive/data.pkl");
    bytes.extend_from_slice(&[0x80, 0x02, b'}', b'q', 0x00, b'.']);
    bytes.resize(4096, 0);
    bytes
}

#[test]
fn pytorch_zip_checkpoints_are_named_as_such() {
    let dir = workdir();
    for (name, head) in [("pytorch_model.bin", [0, 0, 8, 8]), ("model.pt", [20, 0, 0, 0])] {
        let file = dir.path().join(name);
        std::fs::write(&file, zip_file(head)).unwrap();
        assert_refused(&file, &PYTORCH, &[]);
    }
}

#[test]
fn pytorch_pickles_are_named_as_such() {
    let dir = workdir();
    // Legacy torch.save: pickle protocol 2 with its magic number first; newer pickles: 3 to 5.
    let legacy = [&[0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19][..]].concat();
    for (name, head) in [
        ("legacy.pt", legacy),
        ("p3.bin", vec![0x80, 0x03, b'c', b'c', b'o', b'l']),
        ("p4.pt", vec![0x80, 0x04, 0x95, 0x10, 0, 0, 0, 0, 0, 0, 0, b'}']),
        ("p5.pth", vec![0x80, 0x05, 0x95, 0x10, 0, 0, 0, 0, 0, 0, 0, b'}']),
    ] {
        let file = dir.path().join(name);
        let mut bytes = head;
        bytes.resize(2048, b'.');
        std::fs::write(&file, bytes).unwrap();
        assert_refused(&file, &PYTORCH, &[]);
    }
}

#[test]
fn other_foreign_files_are_not_safetensors_with_the_reason() {
    let dir = workdir();
    let text = dir.path().join("README.md");
    std::fs::write(&text, "# A model card\n\nThis repository holds weights.\n".repeat(50)).unwrap();
    assert_refused(&text, &["not a safetensors file", "header length"], &["pytorch"]);
    let tiny = dir.path().join("tiny.safetensors");
    std::fs::write(&tiny, b"abc").unwrap();
    assert_refused(&tiny, &["not a safetensors file", "too small"], &["pytorch"]);
    let gzip = dir.path().join("model.safetensors.gz");
    let mut bytes = vec![0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0];
    bytes.resize(1000, 7);
    std::fs::write(&gzip, bytes).unwrap();
    assert_refused(&gzip, &["not a safetensors file"], &["pytorch"]);
}

/// A header of exactly 640 bytes gives a length prefix of `80 02 00 00 00 00 00 00`, the start of a
/// protocol 2 pickle: it is a valid safetensors file and must still mount.
#[test]
fn a_safetensors_file_whose_prefix_looks_like_a_pickle_still_mounts() {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = [T::new("w", Dtype::F32, &[16])];
    let bytes = (0..600)
        .find_map(|pad| {
            let meta = std::collections::BTreeMap::from([("pad".to_string(), "x".repeat(pad))]);
            let bytes = write_checkpoint(&file, &tensors, Some(&meta));
            (bytes[..8] == [0x80, 0x02, 0, 0, 0, 0, 0, 0]).then_some(bytes)
        })
        .expect("some padding gives a 640-byte header");
    assert_eq!(&bytes[..2], &[0x80, 0x02]);
    let out = stfs(&["inspect", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let m = Mount::new(&file, &[]);
    assert_eq!(std::fs::read(m.file("w")).unwrap(), tensors[0].data);
}

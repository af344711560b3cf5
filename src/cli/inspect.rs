//! `stfs inspect`: the tensor table of a checkpoint, or its metadata.json, without mounting.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::checkpoint::{self, OpenOptions};
use crate::cli::args::InspectArgs;
use crate::cli::report::{print_out, Failure};
use crate::format::prints_as_itself;
use crate::tree::namespace::{Layout, Namespace, Shard, Views};

/// Runs `stfs inspect`.
pub fn run(args: InspectArgs) -> Result<ExitCode, Failure> {
    // An hf:// repository's small files are listed in metadata.json, so `--json` fetches them.
    let options = OpenOptions { repo_files: args.json, ..args.remote.open_options(Default::default())? };
    // One checkpoint: a folder's own (its folders with one of their own are mounts' business).
    let opened = checkpoint::open(&args.source, &options)?.own(&args.source)?;
    let shards = opened
        .shards
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let name = s.source.name().to_string();
            Shard { source: i, file: checkpoint::file_name(&name), name, header: s.header }
        })
        .collect();
    // As a default mount shows it, so `--json` is the mount's metadata.json.
    let files = crate::mount::build::root_files(opened.index_files, opened.repo_files);
    let ns =
        Namespace::build(shards, files, Layout::Flat, Views::default()).map_err(|e| Failure::at(&args.source, e))?;
    if args.json {
        let json = crate::tree::metadata::render(&ns);
        return print_out(&String::from_utf8_lossy(&json));
    }
    print_out(&table(&ns))
}

/// A tensor name as the table shows it: as it is, or Debug-quoted when any character of it does
/// not print as itself (control characters, C1 controls, line separators, bidirectional overrides
/// and other format characters), so a hostile name can neither drive the terminal nor reorder
/// the line.
fn shown_name(name: &str) -> String {
    if name.chars().all(prints_as_itself) {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

/// One line per tensor: name, dtype, shape, bytes, absolute offset; then a total.
fn table(ns: &Namespace) -> String {
    let names: Vec<String> = ns.tensors().iter().map(|t| shown_name(&t.name)).collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(4).clamp(4, 60);
    let mut out = format!("{:<width$}  {:<11}  {:<20}  {:>14}  {:>14}\n", "NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET");
    // Each shard's tensors fit in its length, but shards together (lengths a server claims) need not
    // fit in a u64.
    let mut total = 0u128;
    for (t, name) in ns.tensors().iter().zip(&names) {
        let shape = format!("{:?}", t.shape);
        let _ = writeln!(out, "{name:<width$}  {:<11}  {shape:<20}  {:>14}  {:>14}", t.dtype.name(), t.len, t.start);
        total += u128::from(t.len);
    }
    let _ = writeln!(out, "{} tensors, {} bytes", ns.tensors().len(), total);
    out
}

#[cfg(test)]
mod tests {
    use crate::cli::inspect::table;
    use crate::format::parse_header;
    use crate::tree::namespace::{Layout, Namespace, Shard, Views};

    /// A shard of U8 tensors `names`, `len` bytes each, as its header and a claimed file length
    /// describe it (no data is needed to build the table).
    fn shard(source: usize, names: &[&str], len: u64) -> Shard {
        let mut offset = 0u64;
        let mut entries = Vec::new();
        for name in names {
            let entry = serde_json::json!({"dtype": "U8", "shape": [len], "data_offsets": [offset, offset + len]});
            entries.push((name.to_string(), entry));
            offset += len;
        }
        let json = serde_json::Value::Object(entries.into_iter().collect()).to_string();
        let header = parse_header(json.as_bytes(), 8 + json.len() as u64 + offset).unwrap();
        Shard { source, name: format!("m{source}.safetensors"), header, file: None }
    }

    fn namespace(names: &[&str]) -> Namespace {
        Namespace::build(vec![shard(0, names, 2)], Vec::new(), Layout::Flat, Views::default()).unwrap()
    }

    /// The total of nine shards' bytes, 2^61 - 1 each (the most a tensor's bit count allows) as a
    /// server may claim, does not overflow.
    #[test]
    fn the_total_of_huge_shards_does_not_overflow() {
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        let shards = names.iter().enumerate().map(|(i, n)| shard(i, &[n], (1 << 61) - 1)).collect();
        let ns = Namespace::build(shards, Vec::new(), Layout::Flat, Views::default()).unwrap();
        let text = table(&ns);
        assert!(text.ends_with("9 tensors, 20752587082923245559 bytes\n"), "{text}");
    }

    /// Names that do not print as themselves are quoted with their escapes: C0 and C1 controls,
    /// and also a bidirectional override (U+202E) and a line separator (U+2028), which are no
    /// control characters but reorder or break the line. Plain names, combining marks after a
    /// letter and quotes stay as they are, and the columns stay aligned.
    #[test]
    fn names_that_do_not_print_as_themselves_are_escaped() {
        let names =
            ["a\u{1b}[2Jb", "c\u{9b}31m", "evil\u{202e}gpj.exe", "x\u{2028}y", "plain", "e\u{301}'q\"", "\u{e0041}"];
        let text = table(&namespace(&names));
        for raw in ['\u{1b}', '\u{9b}', '\u{202e}', '\u{2028}', '\u{e0041}'] {
            assert!(!text.contains(raw), "{raw:?} shown raw in {text}");
        }
        for quoted in [r#""evil\u{202e}gpj.exe""#, r#""x\u{2028}y""#, r#""a\u{1b}[2Jb""#, "e\u{301}'q\"  "] {
            assert!(text.contains(quoted), "{quoted} missing from {text}");
        }
        let dtype_columns: Vec<usize> = text.lines().skip(1).take(names.len()).map(|l| l.chars().count()).collect();
        assert!(dtype_columns.windows(2).all(|w| w[0] == w[1]), "misaligned: {text}");
    }
}

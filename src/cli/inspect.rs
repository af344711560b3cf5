//! `stfs inspect`: the tensor table of a checkpoint, or its metadata.json, without mounting.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::checkpoint::{self, OpenOptions};
use crate::cli::args::InspectArgs;
use crate::cli::report::{print_out, Failure};
use crate::format::PrintablePath;
use crate::tree::namespace::{Layout, Namespace, Shard, Views};

/// Runs `stfs inspect`.
pub fn run(args: InspectArgs) -> Result<ExitCode, Failure> {
    // An hf:// repository's small files are listed in metadata.json, so `--json` fetches them.
    let options = OpenOptions { repo_files: args.json, ..args.remote.open_options(Default::default())? };
    let opened = checkpoint::open(&args.source, &options)?;
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
    if PrintablePath(name).to_string() == name {
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
    let mut total = 0u64;
    for (t, name) in ns.tensors().iter().zip(&names) {
        let shape = format!("{:?}", t.shape);
        let _ = writeln!(out, "{name:<width$}  {:<11}  {shape:<20}  {:>14}  {:>14}", t.dtype.name(), t.len, t.start);
        total += t.len;
    }
    let _ = writeln!(out, "{} tensors, {} bytes", ns.tensors().len(), total);
    out
}

#[cfg(test)]
mod tests {
    use crate::cli::inspect::table;
    use crate::format::{parse_header, Dtype};
    use crate::tree::namespace::{Layout, Namespace, Shard, Views};

    fn namespace(names: &[&str]) -> Namespace {
        let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> =
            names.iter().map(|n| (n.to_string(), Dtype::U8, vec![2], vec![0; 2])).collect();
        let bytes = crate::format::writer::serialize(&tensors, None).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = parse_header(&bytes[8..8 + n], bytes.len() as u64).unwrap();
        let shard = Shard { source: 0, name: "m.safetensors".into(), header, file: None };
        Namespace::build(vec![shard], Vec::new(), Layout::Flat, Views::default()).unwrap()
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

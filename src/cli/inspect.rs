//! `stfs inspect`: the tensor table of a checkpoint, or its metadata.json, without mounting.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::checkpoint::{self, OpenOptions};
use crate::cli::args::InspectArgs;
use crate::cli::report::{print_out, Failure};
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

/// One line per tensor: name, dtype, shape, bytes, absolute offset; then a total.
fn table(ns: &Namespace) -> String {
    let width = ns.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).clamp(4, 60);
    let mut out = format!("{:<width$}  {:<11}  {:<20}  {:>14}  {:>14}\n", "NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET");
    let mut total = 0u64;
    for t in ns.tensors() {
        let shape = format!("{:?}", t.shape);
        // Debug-quote names with control characters so a hostile name cannot drive the terminal.
        let name = if t.name.chars().any(char::is_control) { format!("{:?}", t.name) } else { t.name.clone() };
        let _ = writeln!(out, "{name:<width$}  {:<11}  {shape:<20}  {:>14}  {:>14}", t.dtype.name(), t.len, t.start);
        total += t.len;
    }
    let _ = writeln!(out, "{} tensors, {} bytes", ns.tensors().len(), total);
    out
}

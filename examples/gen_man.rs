//! Writes the man pages from the clap definitions: `stfs.1` and one `stfs-COMMAND.1` per subcommand.
//! Run: `cargo run --example gen_man -- docs/man` (the default directory), then `man -l docs/man/stfs.1`.
//!
//! clap_mangen renders the title, name, description, options, subcommands and the after-help; this
//! adds a synopsis that names every option's value (clap_mangen's shows `[-o ]`), and the EXIT
//! STATUS, ENVIRONMENT and SEE ALSO sections every page has.

use std::io::Write;
use std::path::PathBuf;

use clap::{Arg, ArgAction, Command, CommandFactory};

/// The exit statuses, as `stfs --help` states them.
const EXIT_STATUS: &str = "\
.SH \"EXIT STATUS\"
.TP
\\fB0\\fR
Success.
.TP
\\fB1\\fR
Failure: the checkpoint is missing or malformed, mounting or unmounting failed, an I/O error.
.TP
\\fB2\\fR
Usage error: an unknown or malformed option or argument.
.PP
Run by mount(8) as \\fBmount.fuse.stfs\\fR, stfs exits with the statuses mount(8) documents.
";

/// The environment variables stfs reads.
const ENVIRONMENT: &str = "\
.SH ENVIRONMENT
.TP
\\fBRUST_LOG\\fR
What is logged: \\fBRUST_LOG=stfs=debug\\fR for everything stfs does (\\fB\\-d\\fR sets it). The log goes to
stderr in the foreground, to \\fB\\-\\-log\\-file\\fR in the background.
.TP
\\fBHF_TOKEN\\fR
Sent as a bearer token to huggingface.co and hf.co URLs (\\fB\\-\\-token\\-env\\fR names another variable).
.TP
\\fBSTFS_HEADER_\\fR\\fINAME\\fR
Each variable whose name starts with \\fBSTFS_HEADER_\\fR holds one header, \\fBName: value\\fR, sent with every
request to a URL's origin (in the variables' name order), as \\fB\\-\\-header\\fR would without showing it in ps(1).
";

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "docs/man".into()));
    std::fs::create_dir_all(&dir)?;
    // `stfs help` is clap's, with no page of its own: no page refers to a stfs-help(1).
    let mut stfs = stfs::cli::Cli::command().disable_help_subcommand(true);
    // Building propagates the version and global settings to the subcommands.
    stfs.build();
    let subcommands: Vec<String> =
        stfs.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| format!("stfs-{}", s.get_name())).collect();
    let mut pages = vec![("stfs".to_string(), stfs.clone())];
    for sub in stfs.get_subcommands().filter(|s| !s.is_hide_set()) {
        // A subcommand's page is named and titled as `stfs-NAME`, the convention of git(1) and cargo(1).
        // clap takes names as &'static str; leaking a few short strings in a one-shot generator is fine.
        let name: &'static str = format!("stfs-{}", sub.get_name()).leak();
        pages.push((name.to_string(), sub.clone().name(name).display_name(name)));
    }
    let version = stfs.get_version().unwrap_or_default().to_string();
    for (name, command) in pages {
        let see_also: Vec<&str> = std::iter::once("stfs")
            .chain(subcommands.iter().map(String::as_str))
            .filter(|page| *page != name)
            .collect();
        let page = render(&name, &version, command, &see_also)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page)?;
        println!("{}", path.display());
    }
    Ok(())
}

/// One page: clap_mangen's sections with our synopsis, then ours.
fn render(name: &str, version: &str, command: Command, see_also: &[&str]) -> std::io::Result<Vec<u8>> {
    let synopsis = synopsis(&command);
    let has_options = command.get_arguments().any(|a| !a.is_hide_set());
    // Only stfs(1) lists its subcommands: a nested one (`stfs cache info`) has no page of its own to
    // refer to, and its parent's help text lists its actions.
    let has_subcommands = command.has_subcommands() && name == "stfs";
    let has_extra = command.get_after_help().is_some() || command.get_after_long_help().is_some();
    let man = clap_mangen::Man::new(command).title(name).source(format!("stfs {version}"));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    let mut sections: Vec<Vec<u8>> = Vec::new();
    let mut section = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| -> std::io::Result<()> {
        let mut buf = Vec::new();
        render(&mut buf)?;
        sections.push(buf);
        Ok(())
    };
    section(&|w| man.render_name_section(w))?;
    section(&|w| w.write_all(synopsis.as_bytes()))?;
    section(&|w| man.render_description_section(w))?;
    if has_options {
        section(&|w| man.render_options_section(w))?;
    }
    if has_subcommands {
        section(&|w| man.render_subcommands_section(w))?;
    }
    if has_extra {
        section(&|w| man.render_extra_section(w))?;
    }
    section(&|w| w.write_all(EXIT_STATUS.as_bytes()))?;
    section(&|w| w.write_all(ENVIRONMENT.as_bytes()))?;
    let refs: Vec<String> = see_also.iter().map(|p| format!("\\fB{}\\fR(1)", escape(p))).collect();
    let see = format!(".SH \"SEE ALSO\"\n{}, mount(8), fstab(5), fusermount3(1)\n", refs.join(", "));
    section(&|w| w.write_all(see.as_bytes()))?;
    section(&|w| man.render_version_section(w))?;
    // Every render_* call starts with the same two-line preamble; the title already wrote it.
    let preamble: Vec<u8> = out.split_inclusive(|&b| b == b'\n').take(2).flatten().copied().collect();
    for s in sections {
        out.extend_from_slice(s.strip_prefix(&preamble[..]).unwrap_or(&s));
    }
    Ok(out)
}

/// The SYNOPSIS section: every visible option with its value name (`[-o OPT[,OPT...]]`), then the
/// positional arguments, then `COMMAND` for a command with subcommands.
fn synopsis(command: &Command) -> String {
    let name = command.get_bin_name().unwrap_or_else(|| command.get_name());
    let mut line = format!("\\fB{}\\fR", escape(name));
    for arg in command.get_arguments().filter(|a| !a.is_hide_set() && !a.is_positional()) {
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(s), Some(l)) => format!("\\fB\\-{s}\\fR|\\fB\\-\\-{}\\fR", escape(l)),
            (Some(s), None) => format!("\\fB\\-{s}\\fR"),
            (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", escape(l)),
            (None, None) => continue,
        };
        let value = value_names(arg).map(|v| format!(" \\fI{}\\fR", escape(&v))).unwrap_or_default();
        line.push_str(&format!(" [{flag}{value}]"));
    }
    for arg in command.get_arguments().filter(|a| a.is_positional() && !a.is_hide_set()) {
        let value = escape(&value_names(arg).unwrap_or_else(|| arg.get_id().to_string().to_uppercase()));
        let repeated = if matches!(arg.get_action(), ArgAction::Append) { "..." } else { "" };
        if arg.is_required_set() {
            line.push_str(&format!(" \\fI{value}\\fR{repeated}"));
        } else {
            line.push_str(&format!(" [\\fI{value}\\fR]{repeated}"));
        }
    }
    if command.has_subcommands() {
        line.push_str(" \\fICOMMAND\\fR [\\fIARGS\\fR]");
    }
    format!(".SH SYNOPSIS\n{line}\n")
}

/// An argument's value names joined by spaces, if it takes a value.
fn value_names(arg: &Arg) -> Option<String> {
    if !arg.get_action().takes_values() {
        return None;
    }
    let names: Vec<String> = arg.get_value_names()?.iter().map(|n| n.to_string()).collect();
    Some(names.join(" "))
}

/// Roff-escapes text: backslashes and hyphens.
fn escape(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

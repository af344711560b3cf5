//! Writes the man pages from the clap definitions: `stfs.1` and one `stfs-COMMAND.1` per subcommand.
//! Run: `cargo run --example gen_man -- docs/man` (the default directory), then `man -l docs/man/stfs.1`.

use std::path::PathBuf;

use clap::CommandFactory;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "docs/man".into()));
    std::fs::create_dir_all(&dir)?;
    let mut stfs = stfs::cli::Cli::command();
    // Building propagates the version and global settings to the subcommands.
    stfs.build();
    let mut pages = vec![("stfs".to_string(), stfs.clone())];
    for sub in stfs.get_subcommands().filter(|s| s.get_name() != "help") {
        // A subcommand's page is named and titled as `stfs-NAME`, the convention of git(1) and cargo(1).
        // clap takes names as &'static str; leaking a few short strings in a one-shot generator is fine.
        let name: &'static str = format!("stfs-{}", sub.get_name()).leak();
        pages.push((name.to_string(), sub.clone().name(name)));
    }
    for (name, command) in pages {
        let mut page = Vec::new();
        clap_mangen::Man::new(command).render(&mut page)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page)?;
        println!("{}", path.display());
    }
    Ok(())
}

//! `settled generate man|completions DIR` (hidden): the manual pages and the
//! shell completions, made from the one clap definition of the command line
//! (the Debian package ships them). It writes files into DIR and nothing else.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use clap_complete::Shell;
use settled::cmd::{Global, Outcome, Runnable};

/// Write the manual pages or the shell completions into a directory.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// One page per command that `--help` lists: settled.1, settled-worker.1, ...
    Man {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
    /// Completions for bash (settled.bash), zsh (_settled) and fish (settled.fish).
    Completions {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
}

/// The generator, with the command line it describes.
pub(crate) struct Generate {
    args: Args,
    cli: clap::Command,
}

impl Generate {
    /// Generates from `cli`, the binary's whole command line.
    pub(crate) fn new(args: Args, cli: clap::Command) -> Generate {
        Generate { args, cli }
    }
}

impl Runnable for Generate {
    fn single_threaded(&self) -> bool {
        true
    }

    fn run(self: Box<Self>, _global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let Generate { args, mut cli } = *self;
            let (dir, written) = match args.what {
                What::Man { dir } => {
                    let written = man_pages(&mut cli, &dir)?;
                    (dir, written)
                }
                What::Completions { dir } => {
                    let written = completions(&mut cli, &dir)?;
                    (dir, written)
                }
            };
            println!("wrote {written} files into {}", dir.display());
            Ok(ExitCode::SUCCESS)
        })
    }
}

/// Writes `settled.1` and `settled-NAME.1` for each visible subcommand (and
/// theirs: `settled-queues-pause.1`); returns how many pages there are.
fn man_pages(cli: &mut clap::Command, dir: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(cli.clone(), dir).with_context(|| format!("writing the pages into {}", dir.display()))?;
    let pages = std::fs::read_dir(dir)?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".1"))
        })
        .count();
    Ok(pages)
}

/// Writes the bash, zsh and fish completions.
fn completions(cli: &mut clap::Command, dir: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = cli.get_name().to_string();
    let shells = [Shell::Bash, Shell::Zsh, Shell::Fish];
    for shell in shells {
        clap_complete::generate_to(shell, cli, &name, dir)
            .with_context(|| format!("writing the {shell} completions into {}", dir.display()))?;
    }
    Ok(shells.len())
}

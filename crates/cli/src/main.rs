//! The `settled` binary: parses the command line into one struct per
//! command and dispatches each, one line apiece, to its own file
//! (`settled::cmd::*` for the product, `settled_lab::cmd::*` for the lab).

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use settled::cmd::{self, on_database, Global, Parsed, Runnable};
use settled_lab::cmd as lab;

mod generate;

/// Settle creators' rewards exactly once, on any number of servers.
///
/// Workers split a period's creators with `SELECT ... FOR NO KEY UPDATE SKIP
/// LOCKED`; the database (row locks, conditional updates, unique keys) makes
/// sure nobody is paid twice. With DATABASE_URL unset, a private PostgreSQL is
/// started from the installed server binaries in --data-dir.
///
/// Exit codes: 0 success; 1 the command ran and found a problem; 2 it could not
/// start (bad usage, or no database and no PostgreSQL binaries).
#[derive(Debug, Parser)]
#[command(name = "settled", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Migrate(cmd::migrate::Args),
    Seed(cmd::seed::Args),
    Import(cmd::import::Args),
    Policy(cmd::policy::Args),
    Worker(cmd::worker::Args),
    Run(cmd::run::Args),
    Runs(cmd::runs::Args),
    Workers(cmd::workers::Args),
    Queues(cmd::queues::Args),
    Serve(cmd::serve::Args),
    Deliver(cmd::deliver::Args),
    Lease(cmd::lease::Args),
    Retry(cmd::retry::Args),
    Status(cmd::status::Args),
    Verify(cmd::verify::Args),
    Reconcile(cmd::reconcile::Args),
    Archive(cmd::archive::Args),
    Demo(cmd::demo::Args),
    // The lab.
    ProviderSim(lab::provider_sim::Args),
    Chaos(lab::chaos::Args),
    Bench(Box<lab::bench::Args>),
    Lab(lab::lab::Args),
    #[command(hide = true)]
    BenchWorker(lab::bench_worker::Args),
    #[command(hide = true)]
    BenchQueueWorker(lab::bench_queue_worker::Args),
    #[command(hide = true)]
    LabWorker(lab::lab_worker::Args),
    #[command(hide = true)]
    Generate(generate::Args),
}

fn dispatch(command: Command) -> Box<dyn Runnable> {
    match command {
        Command::Migrate(args) => on_database(args),
        Command::Seed(args) => on_database(args),
        Command::Import(args) => on_database(args),
        Command::Policy(args) => on_database(args),
        Command::Worker(args) => on_database(args),
        Command::Run(args) => on_database(args),
        Command::Runs(args) => on_database(args),
        Command::Workers(args) => on_database(args),
        Command::Queues(args) => on_database(args),
        Command::Serve(args) => on_database(args),
        Command::Deliver(args) => on_database(args),
        Command::Lease(args) => on_database(args),
        Command::Retry(args) => on_database(args),
        Command::Status(args) => on_database(args),
        Command::Verify(args) => on_database(args),
        Command::Reconcile(args) => Box::new(cmd::reconcile::Reconcile(args)),
        Command::Archive(args) => on_database(args),
        Command::Demo(args) => on_database(args),
        Command::ProviderSim(args) => Box::new(args),
        Command::Chaos(args) => Box::new(args),
        Command::Bench(args) => args,
        Command::Lab(args) => Box::new(args),
        Command::BenchWorker(args) => Box::new(args),
        Command::BenchQueueWorker(args) => Box::new(args),
        Command::LabWorker(args) => on_database(args),
        Command::Generate(args) => Box::new(generate::Generate::new(args, Cli::command())),
    }
}

fn main() -> std::process::ExitCode {
    cmd::execute(|| {
        let matches = Cli::command().get_matches();
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
        Parsed {
            global: cli.global,
            name: matches.subcommand_name().unwrap_or_default().to_string(),
            command: dispatch(cli.command),
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn every_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}

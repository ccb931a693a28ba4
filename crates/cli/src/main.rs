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
    Tokens(cmd::tokens::Args),
    Audit(cmd::audit::Args),
    Workers(cmd::workers::Args),
    Queues(cmd::queues::Args),
    Serve(cmd::serve::Args),
    Deliver(cmd::deliver::Args),
    Lease(cmd::lease::Args),
    Retry(cmd::retry::Args),
    Status(cmd::status::Args),
    Verify(cmd::verify::Args),
    Reconcile(cmd::reconcile::Args),
    Wallet(cmd::wallet::Args),
    GiveUp(cmd::give_up::Args),
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
        Command::Tokens(args) => on_database(args),
        Command::Audit(args) => on_database(args),
        Command::Workers(args) => on_database(args),
        Command::Queues(args) => on_database(args),
        Command::Serve(args) => on_database(args),
        Command::Deliver(args) => on_database(args),
        Command::Lease(args) => on_database(args),
        Command::Retry(args) => on_database(args),
        Command::Status(args) => on_database(args),
        Command::Verify(args) => on_database(args),
        Command::Reconcile(args) => Box::new(cmd::reconcile::Reconcile(args)),
        Command::Wallet(args) => on_database(args),
        Command::GiveUp(args) => on_database(args),
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

    /// Every argument that carries a secret, with the subcommands leading to it.
    fn secret_arguments(command: &clap::Command, path: &[String], found: &mut Vec<(Vec<String>, clap::Arg)>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str().to_ascii_lowercase();
            let secret = ["secret", "password"].iter().any(|word| id.contains(word))
                || ["token", "database_url", "direct_url"]
                    .iter()
                    .any(|end| id.ends_with(end));
            if secret || arg.is_hide_env_values_set() {
                found.push((path.to_vec(), arg.clone()));
            }
        }
        for sub in command.get_subcommands() {
            let mut path = path.to_vec();
            path.push(sub.get_name().to_string());
            secret_arguments(sub, &path, found);
        }
    }

    #[test]
    fn no_parse_error_repeats_a_secret_and_each_names_its_variable() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let mut found = Vec::new();
        secret_arguments(&Cli::command(), &[], &mut found);
        let ids: Vec<&str> = found.iter().map(|(_, arg)| arg.get_id().as_str()).collect();
        for expected in [
            "api_token",
            "provider_webhook_secret",
            "database_url",
            "direct_url",
            "webhook_secret",
        ] {
            assert!(ids.contains(&expected), "{expected} not found among {ids:?}");
        }
        let values = [
            OsString::from("s3cret-probe "),
            OsString::from(" s3cret-probe"),
            OsString::from("s3cret-probe,s3cret-probe,s3cret-probe"),
            OsString::from("s3cret-probe\u{1b}"),
            OsString::from_vec(b"s3cret-probe\xff".to_vec()),
        ];
        for (path, arg) in &found {
            let id = arg.get_id().as_str();
            if let Some(env) = arg.get_env() {
                assert!(arg.is_hide_env_values_set(), "{id}: --help would show ${env:?}");
            }
            let long = format!("--{}", arg.get_long().expect("a secret is a named flag"));
            let name = arg
                .get_env()
                .map_or(long.clone(), |env| env.to_string_lossy().into_owned());
            let mut refused = 0;
            for value in &values {
                let mut argv: Vec<OsString> = vec!["settled".into()];
                argv.extend(path.iter().map(OsString::from));
                argv.extend([OsString::from(&long), value.clone()]);
                let Err(error) = Cli::command().try_get_matches_from(argv) else {
                    continue;
                };
                let text = error.to_string();
                if error.kind() == clap::error::ErrorKind::MissingRequiredArgument
                    || error.kind() == clap::error::ErrorKind::MissingSubcommand
                    || error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                {
                    continue; // the value was taken
                }
                refused += 1;
                assert!(!text.contains("s3cret-probe"), "{id} {value:?}: {text}");
                assert!(text.contains(&name), "{id} {value:?}: the error names {name}: {text}");
            }
            assert!(refused >= 1, "{id}: text that is not UTF-8 is refused");
        }
    }
}

//! `settled migrate`.

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;

/// Apply the database migrations (every other command also does this when needed).
#[derive(Debug, clap::Args)]
pub struct Args {}

impl DbCommand for Args {
    async fn run(self, _db: &Database) -> Outcome {
        println!("migrations applied");
        Ok(std::process::ExitCode::SUCCESS)
    }
}

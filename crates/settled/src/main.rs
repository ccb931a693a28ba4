//! The `settled` command.

use std::process::ExitCode;

fn main() -> ExitCode {
    settled::cli::main()
}

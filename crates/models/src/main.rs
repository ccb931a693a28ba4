//! `settled-models`: checks every model and prints what it found.
//!
//! `cargo run --release -p settled-models` checks the bounds `cargo test`
//! checks; `-- --deep` deeper ones; `-- --counterexamples` prints each
//! guard's counterexample, one action a line.

use std::process::ExitCode;

use settled_models::suite::{self, Bounds};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut ok = true;
    for arg in &args {
        if !matches!(arg.as_str(), "--deep" | "--counterexamples") {
            eprintln!("usage: settled-models [--deep] [--counterexamples]\nunknown argument {arg:?}");
            return ExitCode::from(2);
        }
    }
    if args.iter().any(|a| a == "--counterexamples") {
        for found in suite::counterexamples() {
            println!(
                "== without {}: \"{}\" ({})",
                found.case.guard, found.case.property, found.model
            );
            match &found.trace {
                Some(trace) => print!("{trace}"),
                None => {
                    ok = false;
                    println!("   NO COUNTEREXAMPLE ({} states)", found.states);
                }
            }
            if let Some(test) = found.case.replayed_by {
                println!("   replayed against the database by {test}");
            }
            println!();
        }
    } else {
        let bounds = if args.iter().any(|a| a == "--deep") {
            Bounds::Deep
        } else {
            Bounds::Ci
        };
        suite::check_all(bounds, |summary| {
            print!("{}", summary.report);
            match &summary.acyclic {
                Ok(()) => println!(
                    "  no cycle among its {} states: eventually checked on every behaviour",
                    summary.searched_states
                ),
                Err(around) => println!("  CYCLE:\n{around}"),
            }
            ok &= summary.all_held && summary.acyclic.is_ok();
        });
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

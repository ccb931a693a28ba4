//! How a variant and a state are written in reports and counterexamples.

use crate::check::Described;

use super::state::State;
use super::Runs;

impl Described for Runs {
    fn name(&self) -> String {
        let guards = if self.guards.one_running_per_job {
            ""
        } else {
            ", no runs_one_running_per_job"
        };
        let f = self.faults;
        format!(
            "runs ({} daemons, {} due scopes; {} crash, {} failed item, {} cancel, {} retry{guards})",
            self.daemons, self.scopes, f.crashes, f.item_failures, f.cancels, f.retries
        )
    }

    fn describe(&self, s: &State) -> String {
        let runs: Vec<String> = s
            .runs
            .iter()
            .map(|r| {
                let lock = r.locked_by.map_or(String::new(), |d| format!(" locked by d{d}"));
                format!("scope{} {:?}{lock}", r.scope, r.state).to_lowercase()
            })
            .collect();
        let items: Vec<String> = s.items.iter().map(|i| format!("{i:?}").to_lowercase()).collect();
        let daemons: Vec<String> = s
            .daemons
            .iter()
            .enumerate()
            .map(|(i, d)| {
                if d.up {
                    format!("d{i} {:?}", d.phase)
                } else {
                    format!("d{i} down")
                }
            })
            .collect();
        format!(
            "runs [{}] items [{}] | {}",
            runs.join(", "),
            items.join(", "),
            daemons.join(", ")
        )
    }
}

//! How the chain model names itself and prints a state in a counterexample.

use super::{Chain, Pays, State};
use crate::check::Described;

impl Described for Chain {
    fn name(&self) -> String {
        let g = self.guards;
        let mut without = Vec::new();
        for (on, name) in [
            (g.write_ahead, "write-ahead signing"),
            (g.every_attempt, "every attempt's hash"),
            (g.depth, "the confirmation depth"),
            (g.filler_confirmed, "the filler's confirmation"),
        ] {
            if !on {
                without.push(name);
            }
        }
        let without = if without.is_empty() {
            String::new()
        } else {
            format!("; without {}", without.join(", "))
        };
        let f = self.faults;
        format!(
            "chain rail ({} payout(s); {} crash, {} drop, {} reorg, {} replacement, {} give-up{without})",
            self.payouts, f.crashes, f.drops, f.reorgs, f.replacements, f.give_ups
        )
    }

    fn describe(&self, s: &State) -> String {
        let txs: Vec<String> = s
            .txs
            .iter()
            .enumerate()
            .map(|(i, t)| format!("tx{i} n{} p{} {:?} {:?}", t.nonce, t.payout, t.state, t.tracked).to_lowercase())
            .collect();
        let chain: Vec<String> = s
            .chain
            .iter()
            .map(|a| match a.map(|a| (a, s.attempts[a as usize].pays)) {
                Some((a, Pays::Payout(p))) => format!("a{a}:pay p{p}"),
                Some((a, Pays::Nothing)) => format!("a{a}:filler"),
                None => "-".to_string(),
            })
            .collect();
        format!(
            "payouts {:?} next nonce {} | txs [{}] | pool {:?} | chain [{}]",
            s.payouts,
            s.next_nonce,
            txs.join(", "),
            s.pool,
            chain.join(", ")
        )
        .to_lowercase()
    }
}

//! How a variant and a state are written in reports and counterexamples.

use crate::check::Described;

use super::state::{Job, Lease, Row, State, Status, Worker};
use super::LeasedWork;

impl Described for LeasedWork {
    fn name(&self) -> String {
        let mut guards = Vec::new();
        if !self.guards.fence {
            guards.push("no fence");
        }
        if !self.guards.timeline {
            guards.push("no timeline in the fence");
        }
        if !self.guards.idempotency_key {
            guards.push("no idempotency key");
        }
        let guards = if guards.is_empty() {
            String::new()
        } else {
            format!(", {}", guards.join(", "))
        };
        let f = self.faults;
        format!(
            "leased work ({} item(s), {} leased + {} in-tx workers, {:?} replication, max attempts {}; \
             faults: {} crash, {} pause, {} slow renewal, {} 503, {} applied-then-timed-out, {} failover{guards})",
            self.items,
            self.leased_workers,
            self.tx_workers,
            self.replication,
            self.max_attempts,
            f.crashes,
            f.pauses,
            f.slow_renewals,
            f.provider_unavailable,
            f.applied_then_timed_out,
            f.failovers
        )
    }

    fn describe(&self, s: &State) -> String {
        let rows: Vec<String> = s.primary.iter().map(describe_row).collect();
        let workers: Vec<String> = s
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| format!("w{i} {}", describe_worker(w)))
            .collect();
        let mut out = format!("primary tl{} [{}]", s.timeline, rows.join(", "));
        if s.standby != s.primary {
            let standby: Vec<String> = s.standby.iter().map(describe_row).collect();
            out.push_str(&format!(" standby [{}]", standby.join(", ")));
        }
        let paid: Vec<String> = s
            .payments
            .iter()
            .map(|p| match p.claim {
                Some(c) => format!("item{}/claim{}", p.item, c),
                None => format!("item{}", p.item),
            })
            .collect();
        out.push_str(&format!(
            " | {} | provider paid [{}]",
            workers.join(", "),
            paid.join(", ")
        ));
        out
    }
}

fn describe_row(r: &Row) -> String {
    let status = match r.status {
        Status::Eligible => "eligible",
        Status::Processing => "processing",
        Status::Settled => "settled",
        Status::Failed => "failed",
    };
    let mut out = format!("{status} {}@{}", r.attempt, r.fence_epoch);
    if r.status == Status::Processing {
        let owner = r.lease_owner.map_or("-".to_string(), |o| format!("w{o}"));
        let live = if r.lease_live { "live" } else { "expired" };
        out.push_str(&format!(" lease {owner} {live}"));
    }
    if let Some(c) = r.claim {
        out.push_str(&format!(" claim{c}"));
    }
    if let Some(c) = r.settled_by {
        out.push_str(&format!(" settled by claim{c}"));
    }
    if r.effects > 0 {
        out.push_str(&format!(" ledger x{}", r.effects));
    }
    out
}

fn describe_worker(w: &Worker) -> String {
    if !w.up {
        return "down".into();
    }
    let lease = |l: &Lease| {
        format!(
            "item{} {} claim{}{}",
            l.item,
            l.fence,
            l.claim,
            if l.held { " held" } else { " not held" }
        )
    };
    let job = match &w.job {
        Job::Idle => "idle".to_string(),
        Job::Claimed(l) => format!("claimed {}", lease(l)),
        Job::Working(l) => format!("calling {}", lease(l)),
        Job::Called(l, ok) => format!("{} {}", if *ok { "paid" } else { "call failed" }, lease(l)),
        Job::InTx { item, fence, .. } => format!("in tx item{item} {fence}"),
    };
    if w.paused {
        format!("{job} (stopped)")
    } else {
        job
    }
}

//! How a variant and a state are written in reports and counterexamples.

use crate::check::Described;

use super::state::{event_name, KeyRow, State};
use super::Payouts;

impl Described for Payouts {
    fn name(&self) -> String {
        let g = self.guards;
        let removed: Vec<&str> = [
            (g.state_condition, "the conditional update"),
            (g.transition_table, "the transitions table"),
            (g.one_return, "the return's key"),
            (g.one_time_token, "the token's condition"),
            (g.event_id, "the unique event id"),
            (g.idempotency_key, "the provider key"),
            (g.request_key, "the request's key claim"),
            (g.unique_request_key, "the unique request key"),
        ]
        .into_iter()
        .filter(|(kept, _)| !kept)
        .map(|(_, name)| name)
        .collect();
        let guards = if removed.is_empty() {
            String::new()
        } else {
            format!(", without {}", removed.join(", "))
        };
        let f = self.faults;
        format!(
            "payouts ({} request(s){}, balance {}, {} delivery worker(s), {} attempt(s); {} crash, {} pause, {} 503, \
             {} applied-then-timed-out, {} refusal, {} failed payment, {} duplicated and {} lost webhook, \
             {} redemptions, {} cancel, {} repeated request, {} key lock passing, {} return{guards})",
            self.requests,
            if self.confirm { " with confirmation" } else { "" },
            self.credit,
            self.workers,
            self.max_attempts,
            f.crashes,
            f.pauses,
            f.provider_unavailable,
            f.applied_then_timed_out,
            f.refusals,
            f.provider_failures,
            f.webhook_duplicates,
            f.webhook_losses,
            f.redemptions,
            f.cancels,
            f.request_repeats,
            f.key_lock_expiries,
            f.returns
        )
    }

    fn describe(&self, s: &State) -> String {
        let requests: Vec<String> = s
            .requests
            .iter()
            .enumerate()
            .filter(|(_, r)| r.posted)
            .map(|(i, r)| {
                let key = match r.key {
                    KeyRow::Free => "",
                    KeyRow::InProgress { locked: true } => " in_progress",
                    KeyRow::InProgress { locked: false } => " in_progress (lock passed)",
                    KeyRow::Completed => " completed",
                };
                let refused = if r.refused { " refused" } else { "" };
                let in_pay = s.posts.iter().filter(|p| p.request == i as u8).count();
                let in_pay = if in_pay > 0 {
                    format!(" {in_pay} in pay()")
                } else {
                    String::new()
                };
                format!("k{i}{key}{refused}{in_pay}")
            })
            .collect();
        let payouts: Vec<String> = s
            .payouts
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let returned = if r.returned > 0 {
                    format!(" returned x{}", r.returned)
                } else {
                    String::new()
                };
                format!("p{i}(k{}) {:?}{returned}", r.request, r.state).to_lowercase()
            })
            .collect();
        let jobs: Vec<String> = s
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| format!("job{j}(p{}) {:?} a{}", job.payout, job.status, job.attempt).to_lowercase())
            .collect();
        let payments: Vec<String> = s
            .payments
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "e{i}:p{}{} {:?}",
                    p.payout,
                    p.attempt.map_or(String::new(), |a| format!("/a{a}")),
                    p.status
                )
            })
            .collect();
        let inflight: Vec<String> = s.inflight.iter().map(|e| event_name(*e)).collect();
        let mut out = format!(
            "balance {} requests [{}] payouts [{}] jobs [{}] provider [{}] webhooks in flight [{}]",
            s.balance,
            requests.join(", "),
            payouts.join(", "),
            jobs.join(", "),
            payments.join(", "),
            inflight.join(", ")
        );
        if s.events.iter().any(|n| *n > 0) {
            let events: Vec<String> = s
                .events
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(e, n)| format!("{} x{n}", event_name(e as u8)))
                .collect();
            out.push_str(&format!(" events stored [{}]", events.join(", ")));
        }
        if !s.intents.is_empty() {
            let intents: Vec<String> = s
                .intents
                .iter()
                .map(|i| format!("{:?} read p{}: will write {:?}", i.source, i.payout, i.to))
                .collect();
            out.push_str(&format!(" | read, not yet written: [{}]", intents.join(", ")));
        }
        out
    }
}

//! The actions each actor (requests, payouts, delivery workers, the
//! provider and the network) can take from a state.

use crate::signal::Signal::{self, Cont, Kill, Stop};

use super::action::{Action, Answer};
use super::state::PayoutState::{Created, Paid, Sent};
use super::state::{Delivery, JobStatus, KeyRow, ProviderStatus, Source, State};
use super::Payouts;

impl Payouts {
    pub(super) fn request_actions(&self, state: &State, actions: &mut Vec<Action>) {
        if let Some(next) = state.requests.iter().position(|r| !r.posted) {
            actions.push(Action::PostPayout { request: next as u8 });
        }
        for (r, request) in state.requests.iter().enumerate() {
            let r = r as u8;
            if request.posted && state.budget.request_repeats > 0 && !Self::answered(state, r) {
                actions.push(Action::PostPayout { request: r });
            }
            let in_pay = state.posts.iter().any(|p| p.request == r);
            if request.key == (KeyRow::InProgress { locked: true }) && in_pay && state.budget.key_lock_expiries > 0 {
                actions.push(Action::KeyLockExpires { request: r });
            }
        }
        let mut posts = state.posts.clone();
        posts.dedup();
        for post in posts {
            actions.push(Action::Pay { post });
        }
    }

    pub(super) fn payout_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (p, row) in state.payouts.iter().enumerate() {
            let p = p as u8;
            let readable = |source| self.guards.state_condition || !Self::reading(state, p, source);
            if row.state == Created {
                if !row.token_expired {
                    if state.budget.redemptions > 0 {
                        actions.push(Action::Redeem { payout: p });
                    }
                    actions.push(Action::TokenExpires { payout: p });
                } else if readable(Source::Sweeper) {
                    actions.push(Action::Expire { payout: p });
                }
                if state.budget.cancels > 0 && readable(Source::Creator) {
                    actions.push(Action::Cancel { payout: p });
                }
            }
            let at_provider = Self::payment_of(state, p).map(|pay| pay.status);
            let news = match row.state {
                Sent => matches!(
                    at_provider,
                    Some(ProviderStatus::Paid | ProviderStatus::Failed | ProviderStatus::Returned)
                ),
                // Paid payouts are looked up again for a while: a return.
                Paid => at_provider == Some(ProviderStatus::Returned),
                _ => false,
            };
            if news && readable(Source::Poll) {
                actions.push(Action::Poll { payout: p });
            }
        }
        let mut intents = state.intents.clone();
        intents.dedup();
        for intent in intents {
            actions.push(Action::Write { intent });
        }
    }

    pub(super) fn worker_actions(&self, state: &State, w: u8, actions: &mut Vec<Action>) {
        let worker = state.workers[w as usize];
        let signal = |signal: Signal| Action::Signal { worker: w, signal };
        if !worker.up {
            return;
        }
        if worker.paused {
            actions.push(signal(Cont));
            return;
        }
        match worker.job {
            Delivery::Idle => {
                for (j, job) in state.jobs.iter().enumerate() {
                    if job.status == JobStatus::Eligible {
                        actions.push(Action::ClaimJob {
                            worker: w,
                            job: j as u8,
                        });
                    }
                }
            }
            Delivery::Claimed { .. } => {
                actions.push(Action::CallProvider {
                    worker: w,
                    answer: Answer::Accepted,
                });
                let b = state.budget;
                for (left, answer) in [
                    (b.provider_unavailable, Answer::Unavailable),
                    (b.applied_then_timed_out, Answer::AppliedThenTimedOut),
                    (b.refusals, Answer::Refused),
                ] {
                    if left > 0 {
                        actions.push(Action::CallProvider { worker: w, answer });
                    }
                }
            }
            Delivery::Worked { outcome: Some(_), .. } => actions.push(Action::RecordDelivery { worker: w }),
            Delivery::Worked { outcome: None, .. } => actions.push(Action::Snooze { worker: w }),
        }
        let busy = worker.job != Delivery::Idle;
        if state.budget.crashes > 0 && busy {
            actions.push(signal(Kill));
        }
        if state.budget.pauses > 0 && busy {
            actions.push(signal(Stop));
        }
    }

    pub(super) fn environment_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (j, job) in state.jobs.iter().enumerate() {
            let j = j as u8;
            let holder_running = state.workers.iter().any(|w| {
                w.up && !w.paused
                    && matches!(w.job, Delivery::Claimed { job, attempt } | Delivery::Worked { job, attempt, .. }
                        if job == j && attempt == state.jobs[j as usize].attempt)
            });
            match job.status {
                JobStatus::Processing if job.lease_live && !holder_running => {
                    actions.push(Action::LeaseExpires { job: j })
                }
                JobStatus::Processing if !job.lease_live => actions.push(Action::Rescue { job: j }),
                JobStatus::Dead => actions.push(Action::ReplayDeadLetter { job: j }),
                _ => {}
            }
        }
        for (i, payment) in state.payments.iter().enumerate() {
            if payment.status == ProviderStatus::Pending {
                actions.push(Action::ProviderSettles {
                    payment: i as u8,
                    paid: true,
                });
                if state.budget.provider_failures > 0 {
                    actions.push(Action::ProviderSettles {
                        payment: i as u8,
                        paid: false,
                    });
                }
            }
        }
        if state.budget.returns > 0 {
            for (i, payment) in state.payments.iter().enumerate() {
                if payment.status == ProviderStatus::Paid {
                    actions.push(Action::ProviderReturns { payment: i as u8 });
                }
            }
        }
        let mut events = state.inflight.clone();
        events.dedup();
        for event in events {
            actions.push(Action::ReceiveWebhook { event });
            if state.budget.webhook_duplicates > 0 {
                actions.push(Action::DuplicateWebhook { event });
            }
            if state.budget.webhook_losses > 0 {
                actions.push(Action::LoseWebhook { event });
            }
        }
    }
}

//! The model for the checker: its initial states, actions, next states and
//! properties.

use stateright::{Model, Property};

use crate::signal::Signal::{Cont, Kill, Stop};

use super::action::Action;
use super::state::PayoutState::{Cancelled, Created, Expired, Failed, Paid, Queued, Returned, Sent};
use super::state::{
    event_of, Delivery, JobStatus, KeyRow, PayoutState, ProviderStatus, Request, Source, State, Worker,
};
use super::{property, Payouts};

impl Model for Payouts {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            balance: self.credit,
            requests: vec![
                Request {
                    posted: false,
                    key: KeyRow::Free,
                    refused: false,
                };
                self.requests as usize
            ],
            posts: Vec::new(),
            payouts: Vec::new(),
            jobs: Vec::new(),
            payments: Vec::new(),
            inflight: Vec::new(),
            events: Vec::new(),
            intents: Vec::new(),
            workers: vec![
                Worker {
                    up: true,
                    paused: false,
                    job: Delivery::Idle,
                };
                self.workers as usize
            ],
            budget: self.faults,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.request_actions(state, actions);
        self.payout_actions(state, actions);
        for w in 0..self.workers {
            self.worker_actions(state, w, actions);
        }
        self.environment_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::PostPayout { request } => self.post(&mut s, request),
            Action::Pay { post } => self.pay(&mut s, post),
            Action::KeyLockExpires { request } => {
                s.budget.key_lock_expiries -= 1;
                s.requests[request as usize].key = KeyRow::InProgress { locked: false };
            }
            Action::Redeem { payout } => {
                s.budget.redemptions -= 1;
                self.decide(&mut s, payout, &[Created], Queued, Source::Confirm);
            }
            Action::TokenExpires { payout } => s.payouts[payout as usize].token_expired = true,
            Action::Expire { payout } => self.decide(&mut s, payout, &[Created], Expired, Source::Sweeper),
            Action::Cancel { payout } => {
                s.budget.cancels -= 1;
                self.decide(&mut s, payout, &[Created], Cancelled, Source::Creator);
            }
            Action::ClaimJob { worker, job } => self.claim(&mut s, worker, job),
            Action::CallProvider { worker, answer } => self.call(&mut s, worker, answer),
            Action::RecordDelivery { worker } => self.record(&mut s, worker),
            Action::Snooze { worker } => {
                let Delivery::Worked { job, attempt, .. } = s.workers[worker as usize].job else {
                    unreachable!("a snooze follows work")
                };
                let row = &mut s.jobs[job as usize];
                if row.status == JobStatus::Processing && row.attempt == attempt {
                    row.status = JobStatus::Eligible;
                    row.spent -= 1;
                    row.lease_live = false;
                }
                s.workers[worker as usize].job = Delivery::Idle;
            }
            Action::LeaseExpires { job } => s.jobs[job as usize].lease_live = false,
            Action::Rescue { job } => {
                let row = &mut s.jobs[job as usize];
                row.status = if row.spent >= self.max_attempts {
                    JobStatus::Dead
                } else {
                    JobStatus::Eligible
                };
            }
            Action::ReplayDeadLetter { job } => {
                let row = &mut s.jobs[job as usize];
                row.status = JobStatus::Eligible;
                row.spent = 0;
            }
            Action::ProviderSettles { payment, paid } => {
                if !paid {
                    s.budget.provider_failures -= 1;
                }
                s.payments[payment as usize].status = if paid {
                    ProviderStatus::Paid
                } else {
                    ProviderStatus::Failed
                };
                s.events.resize(2 * s.payments.len(), 0);
                s.inflight.push(event_of(payment, false));
                s.inflight.sort();
            }
            Action::ProviderReturns { payment } => {
                s.budget.returns -= 1;
                s.payments[payment as usize].status = ProviderStatus::Returned;
                s.events.resize(2 * s.payments.len(), 0);
                s.inflight.push(event_of(payment, true));
                s.inflight.sort();
            }
            Action::DuplicateWebhook { event } => {
                s.budget.webhook_duplicates -= 1;
                s.inflight.push(event);
                s.inflight.sort();
            }
            Action::LoseWebhook { event } => {
                s.budget.webhook_losses -= 1;
                let at = s.inflight.iter().position(|e| *e == event).expect("in flight");
                s.inflight.remove(at);
            }
            Action::ReceiveWebhook { event } => self.receive_webhook(&mut s, event),
            Action::Poll { payout } => {
                let payment = Self::payment_of(&s, payout).expect("a payment to look up");
                let (from, to): (&[PayoutState], PayoutState) = match payment.status {
                    ProviderStatus::Paid => (&[Queued, Sent], Paid),
                    ProviderStatus::Returned => (&[Queued, Sent, Paid], Returned),
                    _ => (&[Queued, Sent], Failed),
                };
                self.decide(&mut s, payout, from, to, Source::Poll);
            }
            Action::Write { intent } => {
                let at = s.intents.iter().position(|i| *i == intent).expect("an intent");
                s.intents.remove(at);
                // The read decided; the write is blind (`from` is unused).
                self.commit(&mut s, intent.payout, &[], intent.to, intent.source);
            }
            Action::Signal { worker, signal: Kill } => {
                s.budget.crashes -= 1;
                s.workers[worker as usize] = Worker {
                    up: false,
                    paused: false,
                    job: Delivery::Idle,
                };
            }
            Action::Signal { worker, signal: Stop } => {
                s.budget.pauses -= 1;
                s.workers[worker as usize].paused = true;
            }
            Action::Signal { worker, signal: Cont } => s.workers[worker as usize].paused = false,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(property::BALANCE_NOT_NEGATIVE, |_, s: &State| s.balance >= 0),
            Property::always(property::MONEY_CONSERVED, |m: &Payouts, s: &State| {
                let outstanding = s.payouts.iter().filter(|row| row.returned == 0).count() as i8;
                m.credit == s.balance + outstanding
            }),
            Property::always(property::RETURNED_AT_MOST_ONCE, |_, s: &State| {
                s.payouts.iter().all(|row| row.returned <= 1)
            }),
            Property::always(property::RETURNED_ONLY_UNPAID, |_, s: &State| {
                s.payouts.iter().enumerate().all(|(i, row)| {
                    row.returned == 0
                        || !s
                            .payments
                            .iter()
                            .any(|pay| pay.payout == i as u8 && pay.status == ProviderStatus::Paid)
                })
            }),
            Property::always(property::PAID_AT_MOST_ONCE, |_, s: &State| {
                (0..s.payouts.len() as u8).all(|p| {
                    let applied = s
                        .payments
                        .iter()
                        .filter(|pay| pay.payout == p && pay.status != ProviderStatus::Refused)
                        .count();
                    applied <= 1
                })
            }),
            Property::always(property::REQUEST_ONCE, |m: &Payouts, s: &State| {
                (0..m.requests).all(|r| s.payouts.iter().filter(|p| p.request == r).count() <= 1)
            }),
            Property::always(property::EVENT_AT_MOST_ONCE, |_, s: &State| {
                s.events.iter().all(|n| *n <= 1)
            }),
            Property::eventually(property::EVERY_PAYOUT_ENDS, |m: &Payouts, s: &State| {
                let answered = (0..m.requests).all(|r| s.requests[r as usize].posted && Self::answered(s, r));
                answered
                    && s.posts.is_empty()
                    && s.payouts.iter().enumerate().all(|(p, row)| {
                        let came_back =
                            Self::payment_of(s, p as u8).is_some_and(|pay| pay.status == ProviderStatus::Returned);
                        (row.state == Paid && row.returned == 0 && !came_back)
                            || (row.state.returns_funds() && row.returned >= 1)
                    })
            }),
            Property::sometimes("a payout is paid", |_, s: &State| {
                s.payouts.iter().any(|r| r.state == Paid)
            }),
            Property::sometimes("a payout fails and its funds come back", |_, s: &State| {
                s.payouts.iter().any(|r| r.state == Failed && r.returned == 1)
            }),
        ];
        if self.faults.returns > 0 {
            properties.push(Property::sometimes(
                "a paid payout is returned by its bank and its funds come back",
                |_, s: &State| {
                    s.payouts.iter().enumerate().any(|(p, r)| {
                        r.state == Returned
                            && r.returned == 1
                            && Self::payment_of(s, p as u8).is_some_and(|pay| pay.status == ProviderStatus::Returned)
                    })
                },
            ));
        }
        if self.confirm {
            properties.push(Property::always(property::TOKEN_ONCE, |_, s: &State| {
                s.payouts.iter().all(|row| row.confirmed <= 1)
            }));
            properties.push(Property::sometimes("an unconfirmed payout expires", |_, s: &State| {
                s.payouts.iter().any(|r| r.state == Expired)
            }));
        }
        if self.faults.webhook_duplicates > 0 {
            properties.push(Property::sometimes(
                "a duplicated webhook is answered and ignored",
                |_, s: &State| s.events.contains(&1) && s.budget.webhook_duplicates == 0 && s.inflight.is_empty(),
            ));
        }
        if self.faults.crashes + self.faults.pauses >= self.max_attempts {
            properties.push(Property::sometimes(
                "a dead letter keeps its payout queued, funds held, until replayed",
                |_, s: &State| {
                    s.jobs
                        .iter()
                        .any(|j| j.status == JobStatus::Dead && s.payouts[j.payout as usize].state == Queued)
                },
            ));
        }
        if self.faults.request_repeats > 0 && self.faults.key_lock_expiries > 0 && self.guards.request_key {
            properties.push(Property::sometimes(
                "a repeat takes over a key whose lock passed, and makes no second payout",
                |_, s: &State| {
                    s.budget.request_repeats == 0
                        && s.budget.key_lock_expiries == 0
                        && s.posts.is_empty()
                        && s.payouts.len() == 1
                },
            ));
        }
        properties
    }
}

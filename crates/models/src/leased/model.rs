//! The model for the checker: its initial states, actions, next states and
//! properties.

use stateright::{Model, Property};

use crate::signal::Signal::{Cont, Kill, Stop};

use super::action::Action;
use super::state::{amount_of, Fence, Job, Lease, Row, State, Status, Worker};
use super::{property, LeasedWork, Replication};

impl Model for LeasedWork {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let row = Row {
            status: Status::Eligible,
            attempt: 0,
            fence_epoch: 0,
            lease_owner: None,
            lease_live: false,
            effects: 0,
            claim: None,
            settled_by: None,
        };
        let rows = vec![row; self.items as usize];
        let worker = |in_tx| Worker {
            up: true,
            paused: false,
            in_tx,
            job: Job::Idle,
        };
        let workers = (0..self.leased_workers)
            .map(|_| worker(false))
            .chain((0..self.tx_workers).map(|_| worker(true)))
            .collect();
        vec![State {
            primary: rows.clone(),
            standby: rows,
            timeline: 1,
            workers,
            payments: Vec::new(),
            budget: self.faults,
            claims: 0,
            stale_completion_accepted: false,
            stale_completion_refused: false,
            attempt_handed_out_twice: false,
            tx_crashed: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for w in 0..state.workers.len() as u8 {
            self.worker_actions(state, w, actions);
        }
        self.fault_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::ClaimLeased { worker, item } => self.claim_leased(&mut s, worker, item),
            Action::StartWork { worker } => {
                let lease = s.workers[worker as usize].lease().expect("claimed");
                s.workers[worker as usize].job = Job::Working(lease);
            }
            Action::CallProvider { worker, answer } => self.call_provider(&mut s, worker, answer),
            Action::CompleteFenced { worker } => self.complete_fenced(&mut s, worker),
            Action::FailFenced { worker } => self.fail_fenced(&mut s, worker),
            Action::Abandon { worker } => s.workers[worker as usize].job = Job::Idle,
            Action::RenewLeases { worker } => self.renew(&mut s, worker),
            Action::LeaseExpires { item } => self.lease_expires(&mut s, item),
            Action::DeadlinePasses { worker } => {
                let lease = s.workers[worker as usize].lease().expect("a lease");
                s.workers[worker as usize].set_lease(Lease { held: false, ..lease });
            }
            Action::RescueExpired { item } => self.rescue(&mut s, item),
            Action::ClaimInTx { worker, item } => {
                let claim = s.claims;
                s.claims += 1;
                let fence = Fence {
                    epoch: 0,
                    attempt: s.primary[item as usize].attempt + 1,
                };
                s.workers[worker as usize].job = Job::InTx { item, fence, claim };
            }
            Action::CommitInTx { worker } => {
                let Job::InTx { item, fence, claim } = s.workers[worker as usize].job else {
                    unreachable!("a commit ends a transaction")
                };
                let row = &mut s.primary[item as usize];
                row.claim = Some(claim);
                row.settled_by = Some(claim);
                row.status = Status::Settled;
                row.attempt = fence.attempt;
                row.effects += 1;
                s.workers[worker as usize].job = Job::Idle;
                self.commit(&mut s);
            }
            Action::Signal { worker, signal: Kill } => {
                s.budget.crashes -= 1;
                s.tx_crashed |= matches!(s.workers[worker as usize].job, Job::InTx { .. });
                let w = &mut s.workers[worker as usize];
                w.up = false;
                w.paused = false;
                w.job = Job::Idle;
            }
            Action::Signal { worker, signal: Stop } => {
                s.budget.pauses -= 1;
                s.workers[worker as usize].paused = true;
            }
            Action::Signal { worker, signal: Cont } => s.workers[worker as usize].paused = false,
            Action::Replicate => s.standby = s.primary.clone(),
            Action::Failover => self.failover(&mut s),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(property::EFFECT_AT_MOST_ONCE, |_, s: &State| {
                s.primary.iter().all(|r| r.effects <= 1)
            }),
            Property::always(property::EFFECT_WITH_STATUS, |_, s: &State| {
                s.primary
                    .iter()
                    .all(|r| (r.effects > 0) == (r.status == Status::Settled))
            }),
            Property::always(property::NO_STALE_COMPLETION, |_, s: &State| {
                !s.stale_completion_accepted
            }),
            Property::always(property::PAID_AT_MOST_ONCE, |m: &LeasedWork, s: &State| {
                (0..m.items).all(|item| s.payments.iter().filter(|p| p.item == item).count() <= 1)
            }),
            Property::always(property::KEY_ONCE_WITH_AMOUNT, |_, s: &State| {
                s.payments.iter().all(|p| p.amount == amount_of(p.item))
                    && s.payments
                        .windows(2)
                        .all(|w| (w[0].item, w[0].claim) != (w[1].item, w[1].claim))
            }),
            Property::eventually(property::EVERY_ITEM_FINAL, |_, s: &State| Self::all_final(s)),
            // Examples the bounds must reach, or the model says nothing.
            Property::sometimes("an item is settled", |_, s: &State| {
                s.primary.iter().any(|r| r.status == Status::Settled)
            }),
            Property::sometimes("an item fails after its attempts", |_, s: &State| {
                s.primary.iter().any(|r| r.status == Status::Failed)
            }),
        ];
        if self.leased_workers >= 2 {
            properties.push(Property::sometimes(
                "a zombie's completion is refused",
                |_, s: &State| s.stale_completion_refused,
            ));
        }
        if self.leased_workers >= 2 && self.faults.failovers > 0 && self.replication == Replication::Asynchronous {
            properties.push(Property::sometimes(
                "a failover hands out a lost claim's attempt again",
                |_, s: &State| s.attempt_handed_out_twice,
            ));
        }
        if self.tx_workers > 0 && self.faults.crashes > 0 {
            properties.push(Property::sometimes(
                "a worker dies in the middle of its transaction",
                |_, s: &State| s.tx_crashed,
            ));
        }
        properties
    }
}

//! The guards as the model reads them, and the actions workers and faults
//! can take from a state.

use crate::signal::Signal::{self, Cont, Kill, Stop};

use super::action::{Action, Answer};
use super::state::{Fence, Job, Lease, Row, State, Status};
use super::{LeasedWork, Replication};

impl LeasedWork {
    /// `ROW_FENCE = f.fence`, as the guards in force compare it.
    pub(super) fn fence_holds(&self, row: &Row, fence: Fence) -> bool {
        if !self.guards.fence {
            return true;
        }
        row.attempt == fence.attempt && (!self.guards.timeline || row.fence_epoch == fence.epoch)
    }

    pub(super) fn all_final(state: &State) -> bool {
        state
            .primary
            .iter()
            .all(|r| matches!(r.status, Status::Settled | Status::Failed))
    }

    pub(super) fn locked_in_tx(state: &State, item: u8) -> bool {
        state
            .workers
            .iter()
            .any(|w| matches!(w.job, Job::InTx { item: i, .. } if i == item))
    }

    /// True when a running worker holds the row's current claim and
    /// believes its lease valid: only slow renewals let it expire then.
    pub(super) fn renewed_by_a_running_holder(state: &State, item: u8) -> bool {
        let row = &state.primary[item as usize];
        state.workers.iter().any(|w| {
            w.running()
                && w.lease()
                    .is_some_and(|l| l.item == item && Some(l.claim) == row.claim && l.held)
        })
    }

    pub(super) fn commit(&self, state: &mut State) {
        if self.replication == Replication::Synchronous {
            state.standby = state.primary.clone();
        }
    }

    pub(super) fn worker_actions(&self, state: &State, w: u8, actions: &mut Vec<Action>) {
        let worker = &state.workers[w as usize];
        if !worker.running() {
            return;
        }
        match worker.job {
            Job::Idle => {
                for item in 0..self.items {
                    let row = &state.primary[item as usize];
                    if row.status == Status::Eligible && !Self::locked_in_tx(state, item) {
                        actions.push(if worker.in_tx {
                            Action::ClaimInTx { worker: w, item }
                        } else {
                            Action::ClaimLeased { worker: w, item }
                        });
                    }
                }
            }
            Job::Claimed(lease) if lease.held => actions.push(Action::StartWork { worker: w }),
            Job::Claimed(_) => actions.push(Action::Abandon { worker: w }),
            Job::Working(_) => {
                actions.push(Action::CallProvider {
                    worker: w,
                    answer: Answer::Paid,
                });
                if state.budget.provider_unavailable > 0 {
                    actions.push(Action::CallProvider {
                        worker: w,
                        answer: Answer::Unavailable,
                    });
                }
                if state.budget.applied_then_timed_out > 0 {
                    actions.push(Action::CallProvider {
                        worker: w,
                        answer: Answer::AppliedThenTimedOut,
                    });
                }
            }
            Job::Called(_, true) => actions.push(Action::CompleteFenced { worker: w }),
            Job::Called(_, false) => actions.push(Action::FailFenced { worker: w }),
            Job::InTx { .. } => actions.push(Action::CommitInTx { worker: w }),
        }
        if let Some(lease) = worker.lease() {
            let (ours, row_live) = self.renewal_finds(state, w, lease);
            if (ours && (!row_live || !lease.held)) || (!ours && lease.held) {
                actions.push(Action::RenewLeases { worker: w });
            }
        }
    }

    /// What `renew_leases` finds for a lease: still ours, and the row's lease live.
    pub(super) fn renewal_finds(&self, state: &State, w: u8, lease: Lease) -> (bool, bool) {
        let row = &state.primary[lease.item as usize];
        let ours = row.status == Status::Processing && self.fence_holds(row, lease.fence) && row.lease_owner == Some(w);
        (ours, row.lease_live)
    }

    pub(super) fn fault_actions(&self, state: &State, actions: &mut Vec<Action>) {
        let busy = !Self::all_final(state);
        for (w, worker) in state.workers.iter().enumerate() {
            let w = w as u8;
            let signal = |signal: Signal| Action::Signal { worker: w, signal };
            if worker.up && busy && state.budget.crashes > 0 {
                actions.push(signal(Kill));
            }
            if worker.running() && busy && state.budget.pauses > 0 {
                actions.push(signal(Stop));
            }
            if worker.up && worker.paused {
                actions.push(signal(Cont));
            }
            if let Some(lease) = worker.lease() {
                let row = &state.primary[lease.item as usize];
                let current = row.status == Status::Processing && row.claim == Some(lease.claim);
                if lease.held && !current {
                    actions.push(Action::DeadlinePasses { worker: w });
                }
            }
        }
        for item in 0..self.items {
            let row = &state.primary[item as usize];
            let expirable = !Self::renewed_by_a_running_holder(state, item) || state.budget.slow_renewals > 0;
            if row.status == Status::Processing && row.lease_live && expirable {
                actions.push(Action::LeaseExpires { item });
            }
            if row.status == Status::Processing && !row.lease_live {
                actions.push(Action::RescueExpired { item });
            }
        }
        if self.replication == Replication::Asynchronous && state.standby != state.primary {
            actions.push(Action::Replicate);
        }
        if state.budget.failovers > 0 {
            actions.push(Action::Failover);
        }
    }
}

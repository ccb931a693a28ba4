//! What an action does: a claim, the provider call, the fenced completion
//! and failure, renewal, expiry, rescue, a failover.

use super::action::Answer;
use super::state::{amount_of, Fence, Job, Lease, Payment, State, Status};
use super::{LeasedWork, Replication};

impl LeasedWork {
    pub(super) fn claim_leased(&self, s: &mut State, w: u8, item: u8) {
        let timeline = s.timeline;
        let claim = s.claims;
        s.claims += 1;
        let row = &mut s.primary[item as usize];
        row.status = Status::Processing;
        row.attempt += 1;
        row.fence_epoch = timeline;
        row.lease_owner = Some(w);
        row.lease_live = true;
        row.claim = Some(claim);
        let fence = Fence {
            epoch: timeline,
            attempt: row.attempt,
        };
        let twice = s.workers.iter().any(|o| {
            o.lease()
                .is_some_and(|l| l.item == item && l.fence.attempt == fence.attempt && l.fence.epoch != fence.epoch)
        });
        s.attempt_handed_out_twice |= twice;
        s.workers[w as usize].job = Job::Claimed(Lease {
            item,
            fence,
            claim,
            held: true,
        });
        self.commit(s);
    }

    pub(super) fn call_provider(&self, s: &mut State, w: u8, answer: Answer) {
        let Job::Working(lease) = s.workers[w as usize].job else {
            unreachable!("a call is sent from Working")
        };
        let payment = Payment {
            item: lease.item,
            claim: (!self.guards.idempotency_key).then_some(lease.claim),
            amount: amount_of(lease.item),
        };
        match answer {
            Answer::Unavailable => s.budget.provider_unavailable -= 1,
            Answer::AppliedThenTimedOut => s.budget.applied_then_timed_out -= 1,
            Answer::Paid => {}
        }
        let applied = answer != Answer::Unavailable;
        let same_key = |p: &Payment| p.item == payment.item && p.claim == payment.claim;
        if applied && !s.payments.iter().any(same_key) {
            s.payments.push(payment);
            s.payments.sort();
        }
        s.workers[w as usize].job = Job::Called(lease, answer == Answer::Paid);
    }

    pub(super) fn complete_fenced(&self, s: &mut State, w: u8) {
        let Job::Called(lease, true) = s.workers[w as usize].job else {
            unreachable!("a completion follows a paid call")
        };
        let row = &mut s.primary[lease.item as usize];
        let accepted = row.status == Status::Processing && self.fence_holds(row, lease.fence);
        let stale = row.claim != Some(lease.claim) || row.status != Status::Processing;
        if accepted {
            row.status = Status::Settled;
            row.lease_owner = None;
            row.lease_live = false;
            row.effects += 1;
            row.settled_by = Some(lease.claim);
            s.stale_completion_accepted |= stale;
        } else {
            s.stale_completion_refused |= stale;
        }
        s.workers[w as usize].job = Job::Idle;
        self.commit(s);
    }

    pub(super) fn fail_fenced(&self, s: &mut State, w: u8) {
        let Job::Called(lease, false) = s.workers[w as usize].job else {
            unreachable!("a failure follows a failed call")
        };
        let max = self.max_attempts;
        let row = &mut s.primary[lease.item as usize];
        if row.status == Status::Processing && self.fence_holds(row, lease.fence) {
            row.status = if row.attempt >= max {
                Status::Failed
            } else {
                Status::Eligible
            };
            row.lease_owner = None;
            row.lease_live = false;
        }
        s.workers[w as usize].job = Job::Idle;
        self.commit(s);
    }

    pub(super) fn renew(&self, s: &mut State, w: u8) {
        let lease = s.workers[w as usize].lease().expect("renewal of a held lease");
        let (ours, _) = self.renewal_finds(s, w, lease);
        if ours {
            s.primary[lease.item as usize].lease_live = true;
            self.commit(s);
        }
        s.workers[w as usize].set_lease(Lease { held: ours, ..lease });
    }

    pub(super) fn lease_expires(&self, s: &mut State, item: u8) {
        if Self::renewed_by_a_running_holder(s, item) {
            s.budget.slow_renewals -= 1;
        }
        let claim = s.primary[item as usize].claim;
        s.primary[item as usize].lease_live = false;
        // The worker's deadline (claim or renewal sent + ttl) is never later
        // than the row's lease_until.
        for worker in &mut s.workers {
            if let Some(lease) = worker.lease().filter(|l| l.item == item && Some(l.claim) == claim) {
                worker.set_lease(Lease { held: false, ..lease });
            }
        }
    }

    pub(super) fn rescue(&self, s: &mut State, item: u8) {
        let max = self.max_attempts;
        let row = &mut s.primary[item as usize];
        row.status = if row.attempt >= max {
            Status::Failed
        } else {
            Status::Eligible
        };
        row.lease_owner = None;
        self.commit(s);
    }

    pub(super) fn failover(&self, s: &mut State) {
        s.budget.failovers -= 1;
        if self.replication == Replication::Asynchronous {
            s.primary = s.standby.clone();
        }
        s.timeline += 1;
        for worker in &mut s.workers {
            if matches!(worker.job, Job::InTx { .. }) {
                worker.job = Job::Idle;
            }
        }
    }
}

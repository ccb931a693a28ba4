//! What an action does: a request posted and paid, a delivery job claimed,
//! the provider called, a delivery recorded, a webhook received.

use super::action::Answer;
use super::state::PayoutState::{Created, Failed, Paid, Queued, Returned, Sent};
use super::state::{
    event_parts, Delivered, Delivery, JobStatus, KeyRow, Payment, PayoutRow, PayoutState, Post, ProviderStatus,
    Request, Source, State, Written,
};
use super::Payouts;

impl Payouts {
    pub(super) fn post(&self, s: &mut State, r: u8) {
        let request = &mut s.requests[r as usize];
        if request.posted {
            s.budget.request_repeats -= 1;
        } else {
            request.posted = true;
        }
        if self.guards.request_key {
            match request.key {
                KeyRow::Free | KeyRow::InProgress { locked: false } => {
                    request.key = KeyRow::InProgress { locked: true };
                }
                // 409 in progress, or the stored answer.
                KeyRow::InProgress { locked: true } | KeyRow::Completed => return,
            }
        }
        s.posts.push(Post { request: r, read: None });
        s.posts.sort();
    }

    pub(super) fn pay(&self, s: &mut State, post: Post) {
        let at = s.posts.iter().position(|p| *p == post).expect("a request in pay()");
        s.posts.remove(at);
        let r = post.request;
        let found = match post.read {
            Some(found) => found,
            None => {
                let found = s.payouts.iter().any(|p| p.request == r);
                // With either guard the read decides nothing: a second
                // payout's insert meets the unique key, a second answer
                // finds the key completed, and either rolls back. So the
                // read and the write are one step; without both, two.
                if !self.guards.request_key && !self.guards.unique_request_key {
                    s.posts.push(Post {
                        request: r,
                        read: Some(found),
                    });
                    s.posts.sort();
                    return;
                }
                found
            }
        };
        let request = &mut s.requests[r as usize];
        // idempotency::finish: only a key still in progress takes an answer.
        let finish = |request: &mut Request| match request.key {
            KeyRow::InProgress { .. } => {
                request.key = KeyRow::Completed;
                true
            }
            _ => false,
        };
        if found {
            // The earlier payout answered again.
            if self.guards.request_key {
                finish(request);
            }
            return;
        }
        if s.balance < 1 {
            if !self.guards.request_key || finish(request) {
                request.refused = true;
            }
            return;
        }
        if self.guards.request_key && !finish(request) {
            return; // finish raises: rolled back
        }
        s.balance -= 1;
        let state = if self.confirm { Created } else { Queued };
        s.payouts.push(PayoutRow {
            request: r,
            state,
            token_expired: false,
            returned: 0,
            confirmed: 0,
        });
        if state == Queued {
            s.enqueue((s.payouts.len() - 1) as u8);
        }
    }

    pub(super) fn claim(&self, s: &mut State, w: u8, j: u8) {
        let job = &mut s.jobs[j as usize];
        job.status = JobStatus::Processing;
        job.attempt += 1;
        job.spent += 1;
        job.lease_live = true;
        let (payout, attempt) = (job.payout, job.attempt);
        let seen = s.payouts[payout as usize].state;
        s.workers[w as usize].job = if seen == Queued {
            Delivery::Claimed { job: j, attempt }
        } else {
            Delivery::Worked {
                job: j,
                attempt,
                seen,
                outcome: Some(Delivered::Nothing),
            }
        };
    }

    pub(super) fn call(&self, s: &mut State, w: u8, answer: Answer) {
        let Delivery::Claimed { job, attempt } = s.workers[w as usize].job else {
            unreachable!("a call follows a claim")
        };
        let payout = s.jobs[job as usize].payout;
        let key = (!self.guards.idempotency_key).then_some(attempt);
        let existing = s.payments.iter().position(|p| p.payout == payout && p.attempt == key);
        match answer {
            Answer::Unavailable => s.budget.provider_unavailable -= 1,
            Answer::AppliedThenTimedOut => s.budget.applied_then_timed_out -= 1,
            Answer::Refused => s.budget.refusals -= 1,
            Answer::Accepted => {}
        }
        let status = match (existing, answer) {
            (_, Answer::Unavailable) => None,
            (Some(i), _) => Some(s.payments[i].status),
            (None, Answer::Refused) => Some(ProviderStatus::Refused),
            (None, _) => Some(ProviderStatus::Pending),
        };
        if existing.is_none() {
            if let Some(status) = status {
                s.payments.push(Payment {
                    payout,
                    attempt: key,
                    status,
                });
            }
        }
        let outcome = match (answer, status) {
            (Answer::AppliedThenTimedOut, _) | (_, None) => None,
            (_, Some(ProviderStatus::Refused)) => Some(Delivered::Refused),
            (_, Some(status)) => Some(Delivered::Word(status)),
        };
        s.workers[w as usize].job = Delivery::Worked {
            job,
            attempt,
            seen: Queued,
            outcome,
        };
    }

    pub(super) fn record(&self, s: &mut State, w: u8) {
        let Delivery::Worked {
            job,
            attempt,
            seen,
            outcome: Some(delivered),
        } = s.workers[w as usize].job
        else {
            unreachable!("a record follows work")
        };
        s.workers[w as usize].job = Delivery::Idle;
        let row = s.jobs[job as usize];
        if row.status != JobStatus::Processing || row.attempt != attempt {
            return; // the fence refuses a zombie: nothing is written
        }
        let (from, to): (&[PayoutState], PayoutState) = match delivered {
            Delivered::Nothing => (&[], Queued),
            Delivered::Word(ProviderStatus::Pending) => (&[Queued], Sent),
            Delivered::Word(ProviderStatus::Paid) => (&[Queued, Sent], Paid),
            Delivered::Word(ProviderStatus::Returned) => (&[Queued, Sent], Returned),
            Delivered::Word(_) => (&[Queued, Sent], Failed),
            Delivered::Refused => (&[Queued], Failed),
        };
        // Without the conditional update the worker decides from the state
        // it loaded, and writes blind.
        let decides = if self.guards.state_condition {
            !from.is_empty()
        } else {
            from.contains(&seen)
        };
        if decides && self.write(s, row.payout, from, to) == Written::Refused {
            return; // the completion rolls back: the job stays processing
        }
        let row = &mut s.jobs[job as usize];
        row.status = JobStatus::Settled;
        row.lease_live = false;
    }

    pub(super) fn receive_webhook(&self, s: &mut State, event: u8) {
        let at = s.inflight.iter().position(|e| *e == event).expect("in flight");
        s.inflight.remove(at);
        let (index, returned) = event_parts(event);
        let payment = s.payments[index as usize];
        // The event says what the payment was when it was made: a settle
        // event of a payment returned since said paid.
        let (from, to): (&[PayoutState], PayoutState) = if returned {
            (&[Queued, Sent, Paid], Returned)
        } else if payment.status == ProviderStatus::Failed {
            (&[Queued, Sent], Failed)
        } else {
            (&[Queued, Sent], Paid)
        };
        self.decide(s, payment.payout, from, to, Source::Webhook(event));
    }
}

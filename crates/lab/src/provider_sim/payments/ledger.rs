//! The provider's ledger of payments: accepted under their keys, settled
//! once, returned once, keys forgotten after their window, read by key, by
//! reference or a page at a time.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use settled::provider::{EventType, Payment, PaymentRequest, PaymentStatus, WebhookEvent};

/// Every payment and every refused key.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Keys forgotten so far (their payments kept).
    pub(crate) keys_forgotten: u64,
    by_id: BTreeMap<String, Record>,
    id_by_key: HashMap<String, String>,
    pub(super) refused: HashMap<String, String>,
    payments_made: u64,
    events_made: u64,
}

pub(super) struct Record {
    pub(super) request: PaymentRequest,
    pub(super) payment: Payment,
    /// When the call that created it arrived, in microseconds since the
    /// Unix epoch (before any latency the faults add).
    arrived_us: i64,
}

/// When the call that created a payment arrived (`GET /v1/arrivals`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Arrival {
    /// The payment's idempotency key.
    pub idempotency_key: String,
    /// Microseconds since the Unix epoch, on this machine's clock.
    pub arrived_us: i64,
}

/// How an accepted payment ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    Paid,
    Failed(String),
}

impl Ledger {
    pub(super) fn by_key(&self, key: &str) -> Option<&Record> {
        self.id_by_key.get(key).and_then(|id| self.by_id.get(id))
    }

    /// The payment under `key`, unless the key was first used more than
    /// `forget_after_ms` before `now_us` (0: never forgotten): a forgotten
    /// key is dropped, its payment kept.
    pub(super) fn remembered(&mut self, key: &str, now_us: i64, forget_after_ms: u64) -> Option<&Record> {
        let first_used_us = self.by_key(key)?.arrived_us;
        if forget_after_ms > 0 && now_us - first_used_us > (forget_after_ms as i64).saturating_mul(1_000) {
            self.id_by_key.remove(key);
            self.keys_forgotten += 1;
            return None;
        }
        self.by_key(key)
    }

    /// The payments whose reference is `reference`, in id order.
    pub(super) fn by_reference(&self, reference: &str) -> Vec<Payment> {
        self.by_id
            .values()
            .filter(|record| record.payment.reference.as_deref() == Some(reference))
            .map(|record| record.payment.clone())
            .collect()
    }

    /// Stores a new pending payment under `key`. Ids rise with each
    /// payment, zero-padded, so their text order is their creation order.
    pub(super) fn accept(&mut self, key: String, request: PaymentRequest, arrived_us: i64) -> Payment {
        self.payments_made += 1;
        let payment = Payment {
            id: format!("pay_{:012}", self.payments_made),
            idempotency_key: key.clone(),
            creator: request.creator.clone(),
            amount: request.amount.clone(),
            status: PaymentStatus::Pending,
            failure_reason: None,
            reference: request.reference.clone(),
        };
        self.id_by_key.insert(key, payment.id.clone());
        self.by_id.insert(
            payment.id.clone(),
            Record {
                request,
                payment: payment.clone(),
                arrived_us,
            },
        );
        payment
    }

    /// The state machine's one transition: pending to paid or failed.
    /// None (nothing changes) when the payment has already ended, or was
    /// forgotten ([`Ledger::forget`]) before its time came.
    pub(crate) fn settle(&mut self, id: &str, fate: Fate, now: i64) -> Option<WebhookEvent> {
        let record = self.by_id.get_mut(id)?;
        let payment = &mut record.payment;
        if payment.status.is_final() {
            return None;
        }
        match fate {
            Fate::Paid => payment.status = PaymentStatus::Paid,
            Fate::Failed(reason) => {
                payment.status = PaymentStatus::Failed;
                payment.failure_reason = Some(reason);
            }
        }
        Some(self.event(id, now))
    }

    /// The event announcing payment `id`'s status now.
    pub(super) fn event(&mut self, id: &str, now: i64) -> WebhookEvent {
        self.events_made += 1;
        let payment = &self.by_id[id].payment;
        WebhookEvent {
            id: format!("evt_{:012}", self.events_made),
            r#type: EventType::for_status(payment.status).expect("a payment past pending"),
            created: now,
            data: payment.clone(),
        }
    }

    /// A paid payment's bank sends it back: paid to returned (or to
    /// failed, as a provider without a returned status says), with `reason`.
    /// Err names why not (no such payment, or it is not paid).
    pub(crate) fn take_back(
        &mut self,
        id: &str,
        reason: String,
        as_failed: bool,
        now: i64,
    ) -> Result<WebhookEvent, String> {
        let Some(record) = self.by_id.get_mut(id) else {
            return Err(format!("no payment {id}"));
        };
        let payment = &mut record.payment;
        if payment.status != PaymentStatus::Paid {
            return Err(format!(
                "payment {id} is {}: only a paid payment is returned",
                payment.status
            ));
        }
        payment.status = if as_failed {
            PaymentStatus::Failed
        } else {
            PaymentStatus::Returned
        };
        payment.failure_reason = Some(reason);
        Ok(self.event(id, now))
    }

    /// Loses payment `id`: gone from look-ups and pages, its key free
    /// again (a new request under it makes a new payment). None when there
    /// is no such payment.
    pub(crate) fn forget(&mut self, id: &str) -> Option<Payment> {
        let record = self.by_id.remove(id)?;
        self.id_by_key.remove(&record.payment.idempotency_key);
        Some(record.payment)
    }

    /// Payment `id`, for a change outside the state machine
    /// ([`super::tamper`](crate::provider_sim::tamper)).
    pub(crate) fn payment_mut(&mut self, id: &str) -> Option<&mut Payment> {
        self.by_id.get_mut(id).map(|record| &mut record.payment)
    }

    /// Every payment's key and the arrival of the call that created it.
    pub(crate) fn arrivals(&self) -> Vec<Arrival> {
        self.by_id
            .values()
            .map(|record| Arrival {
                idempotency_key: record.payment.idempotency_key.clone(),
                arrived_us: record.arrived_us,
            })
            .collect()
    }

    pub(super) fn page(&self, after: Option<&str>, limit: usize) -> Vec<Payment> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.by_id
            .range::<str, _>((start, Bound::Unbounded))
            .take(limit)
            .map(|(_, record)| record.payment.clone())
            .collect()
    }
}

//! How the simulator behaves: one struct that is both its command-line
//! flags and the body of `POST /v1/faults` (a field left out of the body
//! takes its default), with its limits checked in one place.

use serde::{Deserialize, Serialize};

/// The longest delay any setting may ask for, in milliseconds (one day).
pub const DELAY_MS_MAX: u64 = 86_400_000;
/// The most times one webhook is sent before the simulator gives up.
pub const WEBHOOK_ATTEMPTS_MAX: u32 = 1_000;
/// The longest `Retry-After` the simulator answers, in seconds.
pub const RETRY_AFTER_SECS_MAX: u64 = 3_600;

const DEFAULT_APPLIED_TIMEOUT_MS: u64 = 5_000;
const DEFAULT_RETRY_AFTER_SECS: u64 = 1;
const DEFAULT_WEBHOOK_REORDER_MAX_MS: u64 = 1_000;
const DEFAULT_WEBHOOK_RETRY_BASE_MS: u64 = 100;
const DEFAULT_WEBHOOK_RETRY_MAX_MS: u64 = 5_000;
const DEFAULT_WEBHOOK_ATTEMPTS: u32 = 20;

/// What the simulator does, settable by flags at start and by
/// `POST /v1/faults` while it runs. Rates are shares, 0..=1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Latency added to every call to /v1/payments, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Share of calls to /v1/payments (create, look up, list) answered 429
    /// with Retry-After before anything else.
    #[arg(long, default_value_t = 0.0)]
    pub rate_limit_rate: f64,
    /// The Retry-After of those 429s, in seconds.
    #[arg(long, default_value_t = DEFAULT_RETRY_AFTER_SECS)]
    pub retry_after_secs: u64,
    /// Share of new payments answered 503 before anything is applied.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Share of new payments applied and then answered only after
    /// --applied-timeout-ms (the caller times out first).
    #[arg(long, default_value_t = 0.0)]
    pub applied_timeout_rate: f64,
    /// How late such an answer comes, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_APPLIED_TIMEOUT_MS)]
    pub applied_timeout_ms: u64,
    /// Share of new idempotency keys refused (402): the key's answer from
    /// then on, whatever the rates become.
    #[arg(long, default_value_t = 0.0)]
    pub refusal_rate: f64,
    /// Time from a payment's acceptance (pending) to its end (paid or
    /// failed), in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub settle_delay_ms: u64,
    /// Share of accepted payments that end failed (with a failure_reason)
    /// instead of paid.
    #[arg(long, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// Share of webhook events sent twice.
    #[arg(long, default_value_t = 0.0)]
    pub webhook_duplicate_rate: f64,
    /// Share of webhook sends held back by a random delay of up to
    /// --webhook-reorder-max-ms, so later events overtake them.
    #[arg(long, default_value_t = 0.0)]
    pub webhook_reorder_rate: f64,
    /// The longest such delay, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_WEBHOOK_REORDER_MAX_MS)]
    pub webhook_reorder_max_ms: u64,
    /// Share of webhook events never sent.
    #[arg(long, default_value_t = 0.0)]
    pub webhook_loss_rate: f64,
    /// The wait before a webhook's first retry after a non-2xx answer (or
    /// none), in milliseconds; it doubles with each retry.
    #[arg(long, default_value_t = DEFAULT_WEBHOOK_RETRY_BASE_MS)]
    pub webhook_retry_base_ms: u64,
    /// The longest wait between two sends of a webhook, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_WEBHOOK_RETRY_MAX_MS)]
    pub webhook_retry_max_ms: u64,
    /// Sends of one webhook before the simulator gives it up.
    #[arg(long, default_value_t = DEFAULT_WEBHOOK_ATTEMPTS)]
    pub webhook_attempts_max: u32,
    /// Share of paid payments their bank returns, --return-delay-ms after
    /// they were paid (with a `payment.returned` webhook).
    #[arg(long, default_value_t = 0.0)]
    pub return_rate: f64,
    /// Time from a payment's `paid` to its return, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub return_delay_ms: u64,
    /// Speak as a provider without a returned status: a returned payment
    /// reads `failed` (after `paid`), its webhook `payment.failed`.
    #[arg(long)]
    pub returns_as_failed: bool,
    /// Forget an idempotency key this long after its first use, in
    /// milliseconds (0: keep keys for ever): a create under a forgotten key
    /// makes a new payment, and a look-up by the key finds none. The
    /// payments themselves are kept (listed, and found by reference).
    #[arg(long, default_value_t = 0)]
    pub forget_keys_after_ms: u64,
    /// Answer every look-up by reference with 400: the provider cannot say
    /// whether it holds a payment for a reference.
    #[arg(long)]
    pub no_reference_lookup: bool,
}

impl Default for Faults {
    fn default() -> Faults {
        Faults {
            latency_ms: 0,
            rate_limit_rate: 0.0,
            retry_after_secs: DEFAULT_RETRY_AFTER_SECS,
            error_rate: 0.0,
            applied_timeout_rate: 0.0,
            applied_timeout_ms: DEFAULT_APPLIED_TIMEOUT_MS,
            refusal_rate: 0.0,
            settle_delay_ms: 0,
            failure_rate: 0.0,
            webhook_duplicate_rate: 0.0,
            webhook_reorder_rate: 0.0,
            webhook_reorder_max_ms: DEFAULT_WEBHOOK_REORDER_MAX_MS,
            webhook_loss_rate: 0.0,
            webhook_retry_base_ms: DEFAULT_WEBHOOK_RETRY_BASE_MS,
            webhook_retry_max_ms: DEFAULT_WEBHOOK_RETRY_MAX_MS,
            webhook_attempts_max: DEFAULT_WEBHOOK_ATTEMPTS,
            return_rate: 0.0,
            return_delay_ms: 0,
            returns_as_failed: false,
            forget_keys_after_ms: 0,
            no_reference_lookup: false,
        }
    }
}

impl Faults {
    /// Checks every limit; the error names the setting (as its flag and
    /// its field are named alike).
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("rate_limit_rate", self.rate_limit_rate),
            ("error_rate", self.error_rate),
            ("applied_timeout_rate", self.applied_timeout_rate),
            ("refusal_rate", self.refusal_rate),
            ("failure_rate", self.failure_rate),
            ("webhook_duplicate_rate", self.webhook_duplicate_rate),
            ("webhook_reorder_rate", self.webhook_reorder_rate),
            ("webhook_loss_rate", self.webhook_loss_rate),
            ("return_rate", self.return_rate),
        ];
        if let Some((name, rate)) = rates.iter().find(|(_, rate)| !(0.0..=1.0).contains(rate)) {
            return Err(format!("{name} must be within 0..=1, not {rate}"));
        }
        // One roll decides among these three, so together they are a share too.
        if self.rate_limit_rate + self.error_rate + self.applied_timeout_rate > 1.0 {
            return Err("rate_limit_rate + error_rate + applied_timeout_rate must be at most 1".into());
        }
        let delays = [
            ("latency_ms", self.latency_ms),
            ("applied_timeout_ms", self.applied_timeout_ms),
            ("settle_delay_ms", self.settle_delay_ms),
            ("webhook_reorder_max_ms", self.webhook_reorder_max_ms),
            ("webhook_retry_base_ms", self.webhook_retry_base_ms),
            ("webhook_retry_max_ms", self.webhook_retry_max_ms),
            ("return_delay_ms", self.return_delay_ms),
            ("forget_keys_after_ms", self.forget_keys_after_ms),
        ];
        if let Some((name, ms)) = delays.iter().find(|(_, ms)| *ms > DELAY_MS_MAX) {
            return Err(format!("{name} must be at most {DELAY_MS_MAX}, not {ms}"));
        }
        if self.retry_after_secs > RETRY_AFTER_SECS_MAX {
            return Err(format!("retry_after_secs must be at most {RETRY_AFTER_SECS_MAX}"));
        }
        if !(1..=WEBHOOK_ATTEMPTS_MAX).contains(&self.webhook_attempts_max) {
            return Err(format!(
                "webhook_attempts_max must be within 1..={WEBHOOK_ATTEMPTS_MAX}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_an_empty_body_means_the_defaults() {
        assert_eq!(Faults::default().validate(), Ok(()));
        assert_eq!(serde_json::from_str::<Faults>("{}").unwrap(), Faults::default());
    }

    #[test]
    fn the_flags_default_as_the_body_does() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            faults: Faults,
        }
        let flags = <Flags as clap::Parser>::parse_from(["sim"]);
        assert_eq!(flags.faults, Faults::default());
    }

    #[test]
    fn each_limit_names_its_setting() {
        for (body, name) in [
            (r#"{"failure_rate": 1.5}"#, "failure_rate"),
            (r#"{"webhook_loss_rate": -0.1}"#, "webhook_loss_rate"),
            (
                r#"{"error_rate": 0.6, "rate_limit_rate": 0.6}"#,
                "rate_limit_rate + error_rate",
            ),
            (r#"{"settle_delay_ms": 86400001}"#, "settle_delay_ms"),
            (r#"{"webhook_attempts_max": 0}"#, "webhook_attempts_max"),
            (r#"{"retry_after_secs": 3601}"#, "retry_after_secs"),
            (r#"{"return_rate": 2}"#, "return_rate"),
            (r#"{"forget_keys_after_ms": 86400001}"#, "forget_keys_after_ms"),
        ] {
            let faults: Faults = serde_json::from_str(body).unwrap();
            let error = faults.validate().unwrap_err();
            assert!(error.starts_with(name), "{body}: {error}");
        }
        assert!(serde_json::from_str::<Faults>(r#"{"failure_rates": 1}"#).is_err());
    }
}

//! The provider's key window: how long a provider is known to keep an
//! idempotency key (`--provider-key-window`). Past it, a provider may take
//! a request under the key as new and pay it again (Stripe may prune a key
//! after 24 hours). settled records each key's first use
//! (`settlement.provider_keys`, before the first call under it), and
//! before any call under a key first used longer ago than the window it
//! finds the payment by its reference instead ([`super::Rail::find`]): it sends again
//! only when the provider certainly has no payment for it
//! ([`Found::Nothing`]); when the provider cannot say, the key waits for
//! an operator ([`await_operator`]) and nothing is sent under it.
//! Delivery (its retries, a dead letter replayed), the look-up of sent and
//! paid payouts, and the leased settlement batch all ask here. This module
//! decides what the provider's answer means; it never moves a payout.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::money::Amount;
use crate::provider::{Payment, ProviderError};

/// The default window: a day, the shortest a major provider documents
/// (Stripe may prune a key once it is 24 hours old).
pub(crate) const DEFAULT_PROVIDER_KEY_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The shortest window a flag may set.
pub(crate) const PROVIDER_KEY_WINDOW_MIN: Duration = Duration::from_secs(1);
/// The longest window a flag may set (ten years: "for ever", in practice).
pub(crate) const PROVIDER_KEY_WINDOW_MAX: Duration = Duration::from_secs(3650 * 24 * 3600);

/// Reads a duration as flags give it (the key window, the returns watch):
/// a whole number and a unit, `s`, `m`,
/// `h` or `d` (`90s`, `30m`, `24h`, `7d`), within
/// [`PROVIDER_KEY_WINDOW_MIN`]..=[`PROVIDER_KEY_WINDOW_MAX`].
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write it as 90s, 30m, 24h or 7d"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number: write it as 90s, 30m, 24h or 7d"))?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?} has unit {unit:?}: the units are s, m, h and d")),
    };
    let window = n
        .checked_mul(unit_secs)
        .map(Duration::from_secs)
        .filter(|w| (PROVIDER_KEY_WINDOW_MIN..=PROVIDER_KEY_WINDOW_MAX).contains(w))
        .ok_or_else(|| format!("{text:?} is not within 1s..=3650d"))?;
    Ok(window)
}

/// What settled knows of one key before calling under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyUse {
    /// How long ago it was first used, when settled read it.
    pub age: Duration,
    /// When settled read it (so the age keeps counting while the process
    /// waits, or is paused, before its call).
    pub read_at: Instant,
    /// It waits for an operator, and why: nothing is sent under it.
    pub awaiting_operator: Option<String>,
}

impl KeyUse {
    /// A key of unknown age: taken as past any window (the safe side).
    pub(crate) fn unknown() -> KeyUse {
        KeyUse {
            age: PROVIDER_KEY_WINDOW_MAX,
            read_at: Instant::now(),
            awaiting_operator: None,
        }
    }

    /// True when its first use is, now, longer ago than `window`: the
    /// provider may have forgotten it. Asked right before each call.
    pub(crate) fn past(&self, window: Duration) -> bool {
        self.age.saturating_add(self.read_at.elapsed()) >= window
    }
}

#[derive(sqlx::FromRow)]
struct Noted {
    key: String,
    age_ms: i64,
    awaiting_operator: Option<String>,
}

/// Records the first use of each of `keys` now, unless it was recorded
/// before (`settlement.note_provider_key_uses`), and says of each what
/// settled knows of it.
pub(crate) async fn note_uses(pool: &PgPool, keys: &[String]) -> anyhow::Result<HashMap<String, KeyUse>> {
    let noted: Vec<Noted> = sqlx::query_as("SELECT * FROM settlement.note_provider_key_uses($1)")
        .bind(keys) // $1
        .fetch_all(pool)
        .await?;
    let read_at = Instant::now();
    Ok(noted
        .into_iter()
        .map(|n| {
            let key_use = KeyUse {
                age: Duration::from_millis(n.age_ms.max(0) as u64),
                read_at,
                awaiting_operator: n.awaiting_operator,
            };
            (n.key, key_use)
        })
        .collect())
}

/// [`note_uses`] of one key.
pub(crate) async fn note_use(pool: &PgPool, key: &str) -> anyhow::Result<KeyUse> {
    let mut noted = note_uses(pool, &[key.to_string()]).await?;
    noted
        .remove(key)
        .ok_or_else(|| anyhow::anyhow!("settlement.note_provider_key_uses did not answer for key {key:?}"))
}

/// Key `key` waits for an operator, for `detail` (the first reason stays).
pub(crate) async fn await_operator(pool: &PgPool, key: &str, detail: &str) -> anyhow::Result<()> {
    let newly: bool = sqlx::query_scalar("SELECT settlement.await_operator_on_key($1, $2)")
        .bind(key) // $1
        .bind(detail) // $2
        .fetch_one(pool)
        .await?;
    if newly {
        tracing::warn!(
            key,
            detail,
            "a provider key waits for an operator; nothing is sent under it"
        );
    }
    Ok(())
}

/// What the provider holds for a payment whose key may be forgotten,
/// found by its reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Certainly nothing: the payment may be sent (again) under its key.
    Nothing,
    /// One payment: the payment's answer, read as a call's would be (it
    /// must be under the key and pay what is owed, or it is a conflict).
    Payment(Payment),
    /// The provider cannot say (it does not look payments up by
    /// reference), or holds several payments for the reference: an
    /// operator must look; nothing is sent.
    CannotSay(String),
    /// No answer now (rate limited, unavailable): ask again later, sending
    /// nothing meanwhile.
    Later(ProviderError),
}

/// What the provider's answer to a look-up of `reference` means.
pub(crate) fn judge(reference: &str, answer: Result<Vec<Payment>, ProviderError>) -> Found {
    match answer {
        Ok(found) => match found.as_slice() {
            [] => Found::Nothing,
            [payment] => Found::Payment(payment.clone()),
            several => Found::CannotSay(format!(
                "the provider holds {} payments for reference {reference:?} ({}): an operator must say which is the payout's",
                several.len(),
                several.iter().map(|p| format!("{} {}", p.id, p.status)).collect::<Vec<_>>().join(", ")
            )),
        },
        Err(ProviderError::Refused(why)) | Err(ProviderError::KeyConflict(why)) => Found::CannotSay(format!(
            "the provider cannot say whether it holds a payment for reference {reference:?}: {why}"
        )),
        Err(later @ (ProviderError::RateLimited { .. } | ProviderError::Transient(_))) => Found::Later(later),
    }
}

/// Why nothing is sent under `key` past its window: in words, for a dead
/// letter or a failed item.
pub(crate) fn waits(key: &str, detail: &str) -> String {
    format!(
        "provider key {key} is past the provider's key window and waits for an operator ({detail}); nothing is sent \
         under it until an operator checks with the provider and runs settlement.renew_provider_key"
    )
}

/// True when `payment`, found by reference, is the one owed under `key`:
/// made under it, paying `amount` to `creator`.
pub(crate) fn is_owed(payment: &Payment, key: &str, creator: &str, amount: Amount) -> bool {
    payment.idempotency_key == key
        && payment.creator.eq_ignore_ascii_case(creator)
        && super::word::same_amount(&payment.amount, amount)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::PaymentStatus;

    #[test]
    fn a_duration_is_a_whole_number_and_a_unit_within_its_bounds() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration(" 7d "), Ok(Duration::from_secs(7 * 86_400)));
        for (bad, says) in [
            ("24", "has no unit"),
            ("h", "does not start with a whole number"),
            ("1.5h", "has unit \".5h\""),
            ("24x", "has unit \"x\""),
            ("-1h", "does not start with a whole number"),
            ("0s", "is not within"),
            ("3651d", "is not within"),
            ("99999999999999999999d", "does not start with a whole number"),
            ("", "has no unit"),
        ] {
            let error = parse_duration(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    fn payment(id: &str, status: PaymentStatus) -> Payment {
        Payment {
            id: id.into(),
            idempotency_key: "k".into(),
            creator: "0xaa".into(),
            amount: "10".into(),
            status,
            failure_reason: None,
            reference: Some("k".into()),
        }
    }

    #[test]
    fn only_an_empty_answer_lets_a_payment_be_sent_again() {
        assert_eq!(judge("k", Ok(vec![])), Found::Nothing);
        let one = payment("pay_1", PaymentStatus::Paid);
        assert_eq!(judge("k", Ok(vec![one.clone()])), Found::Payment(one.clone()));
        let two = vec![one, payment("pay_2", PaymentStatus::Pending)];
        assert!(matches!(judge("k", Ok(two)), Found::CannotSay(why) if why.contains("2 payments")));
        assert!(matches!(
            judge("k", Err(ProviderError::Refused("400: no look-up by reference".into()))),
            Found::CannotSay(why) if why.contains("cannot say")
        ));
        for later in [
            ProviderError::Transient("timed out".into()),
            ProviderError::RateLimited {
                retry_after: Duration::from_secs(1),
            },
        ] {
            assert_eq!(judge("k", Err(later.clone())), Found::Later(later));
        }
    }

    #[test]
    fn a_payment_found_by_reference_is_owed_only_under_its_key_for_its_amount_and_creator() {
        let found = payment("pay_1", PaymentStatus::Paid);
        let ten = Amount::parse_decimal("10").unwrap();
        assert!(is_owed(&found, "k", "0xAA", ten));
        assert!(!is_owed(&found, "other", "0xaa", ten));
        assert!(!is_owed(&found, "k", "0xbb", ten));
        assert!(!is_owed(&found, "k", "0xaa", Amount::parse_decimal("11").unwrap()));
    }
}

#[cfg(test)]
mod age_tests {
    use super::*;

    #[test]
    fn a_keys_age_keeps_counting_after_it_was_read() {
        let key = KeyUse {
            age: Duration::from_millis(900),
            read_at: Instant::now() - Duration::from_millis(200),
            awaiting_operator: None,
        };
        assert!(key.past(Duration::from_secs(1)), "read 200 ms ago at 900 ms old");
        assert!(!key.past(Duration::from_secs(2)));
        assert!(KeyUse::unknown().past(PROVIDER_KEY_WINDOW_MAX));
    }
}

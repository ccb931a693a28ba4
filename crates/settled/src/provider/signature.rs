//! Webhook signatures: the provider signs each event's raw body with a
//! shared secret, `Provider-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<raw body>")>`, and the receiver verifies it in constant time,
//! within a tolerance around its own clock, against one or two secrets (two
//! while a secret is rotated). The header alone is judged first (its form,
//! its timestamp), so a receiver refuses a bad one before reading the body.
//! This module only signs and verifies: what an event does is the
//! receiver's business.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Provider-Signature";
/// How far an event's timestamp may be from the receiver's clock, either way.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
/// The environment variable settled reads its webhook secrets from.
pub(crate) const SECRET_ENV: &str = "SETTLED_PROVIDER_WEBHOOK_SECRET";
/// Secrets accepted at once: the current one and the next, while rotating.
pub(crate) const SECRETS_MAX: usize = 2;
/// The longest signature header read.
pub(crate) const HEADER_BYTES_MAX: usize = 4_096;

type HmacSha256 = Hmac<Sha256>;

/// Why a signature does not prove an event came from the provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The header is not `t=<unix>,v1=<64 hex digits>[,v1=...]`.
    #[error("malformed {SIGNATURE_HEADER} header: {0}")]
    Malformed(String),
    /// No `v1` value is the body's signature under any of the secrets.
    #[error("no signature in the {SIGNATURE_HEADER} header matches the body under the configured secrets")]
    NoMatch,
    /// Signed, but at a time outside the tolerance: a replay, or a clock off.
    #[error("the signature's timestamp {timestamp} is {distance_secs} s from now ({now}), more than the tolerance of {tolerance_secs} s")]
    OutsideTolerance {
        /// The header's `t`.
        timestamp: i64,
        /// The receiver's clock (unix seconds).
        now: i64,
        /// How far apart they are.
        distance_secs: u64,
        /// The tolerance.
        tolerance_secs: u64,
    },
}

impl SignatureError {
    /// Every kind [`SignatureError::kind`] can say.
    pub(crate) const KINDS: [&'static str; 3] = ["malformed", "no_match", "outside_tolerance"];

    /// What went wrong, as a metric label.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            SignatureError::Malformed(_) => "malformed",
            SignatureError::NoMatch => "no_match",
            SignatureError::OutsideTolerance { .. } => "outside_tolerance",
        }
    }
}

/// The header value signing `body` with `secret` at `timestamp` (unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let digest = mac_of(secret, timestamp, body).finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// Checks that `header` is well formed and dated within `tolerance` of
/// `now` (unix seconds), either way (`check_header`), and then that it
/// signs `body` under one of `secrets` (`SignedHeader::verify_body`).
pub fn verify(
    header: &str,
    body: &[u8],
    secrets: &[Vec<u8>],
    now: i64,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    check_header(header, now, tolerance)?.verify_body(body, secrets)
}

/// What can be judged of `header` without the body: that it is well formed
/// and its timestamp within `tolerance` of `now` (unix seconds), either way.
/// A stale header is refused whether or not it is authentic: the provider
/// signs each attempt afresh.
pub(crate) fn check_header(header: &str, now: i64, tolerance: Duration) -> Result<SignedHeader, SignatureError> {
    let parsed = parse_header(header)?;
    let distance_secs = now.abs_diff(parsed.timestamp);
    if distance_secs > tolerance.as_secs() {
        return Err(SignatureError::OutsideTolerance {
            timestamp: parsed.timestamp,
            now,
            distance_secs,
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(parsed)
}

/// The secrets in `SETTLED_PROVIDER_WEBHOOK_SECRET`'s `value`: one, or two
/// separated by a comma (rotation). One trailing line ending is dropped (a
/// secret file's); an empty secret, or one with whitespace at an end, is
/// refused with an error that names the variable and never the secret.
pub(crate) fn secrets_from_env(value: &str) -> Result<Vec<Vec<u8>>, String> {
    let value = value
        .strip_suffix("\r\n")
        .or_else(|| value.strip_suffix('\n'))
        .unwrap_or(value);
    let parts: Vec<&str> = value.split(',').collect();
    if parts.len() > SECRETS_MAX {
        return Err(format!(
            "{SECRET_ENV} holds {} secrets separated by commas; give one, or two while rotating",
            parts.len()
        ));
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, secret)| {
            let which = if parts.len() == 1 {
                "the secret".to_string()
            } else {
                format!("secret {} of {}", i + 1, parts.len())
            };
            if secret.trim().is_empty() {
                Err(format!("{SECRET_ENV}: {which} is empty or whitespace only"))
            } else if secret.trim() != *secret {
                Err(format!("{SECRET_ENV}: {which} has whitespace at an end"))
            } else {
                Ok(secret.as_bytes().to_vec())
            }
        })
        .collect()
}

/// A signature header that is well formed and dated within the tolerance
/// ([`check_header`]); whether it signs the body is [`SignedHeader::verify_body`]'s.
#[derive(Debug, Clone)]
pub(crate) struct SignedHeader {
    timestamp: i64,
    signatures: Vec<Vec<u8>>,
}

impl SignedHeader {
    /// Checks that one of the header's `v1` values is the HMAC of `body`
    /// under one of `secrets`, each compared in constant time.
    pub(crate) fn verify_body(&self, body: &[u8], secrets: &[Vec<u8>]) -> Result<(), SignatureError> {
        let signed = secrets.iter().any(|secret| {
            let mac = mac_of(secret, self.timestamp, body);
            self.signatures
                .iter()
                .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
        });
        if signed {
            Ok(())
        } else {
            Err(SignatureError::NoMatch)
        }
    }
}

/// `t=<unix>` exactly once, `v1=<64 hex digits>` at least once; other
/// schemes (a later `v2`) are skipped, so a provider can add one.
fn parse_header(header: &str) -> Result<SignedHeader, SignatureError> {
    let malformed = |why: String| Err(SignatureError::Malformed(why));
    if header.len() > HEADER_BYTES_MAX {
        return malformed(format!("longer than {HEADER_BYTES_MAX} bytes"));
    }
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        let Some((name, value)) = item.trim().split_once('=') else {
            return malformed(format!("{item:?} is not name=value"));
        };
        match name {
            "t" if timestamp.is_some() => return malformed("t appears twice".into()),
            "t" => match value.parse::<i64>() {
                Ok(t) => timestamp = Some(t),
                Err(_) => return malformed(format!("t={value:?} is not a unix time")),
            },
            "v1" => match decode_hex_32(value) {
                Some(bytes) => signatures.push(bytes),
                None => return malformed(format!("v1={value:?} is not 64 hex digits")),
            },
            _ => {}
        }
    }
    match (timestamp, signatures.is_empty()) {
        (None, _) => malformed("no t=".into()),
        (Some(_), true) => malformed("no v1=".into()),
        (Some(timestamp), false) => Ok(SignedHeader { timestamp, signatures }),
    }
}

fn decode_hex_32(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    (0..64)
        .step_by(2)
        .map(|i| text.get(i..i + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
        .collect()
}

fn mac_of(secret: &[u8], timestamp: i64, body: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_767_225_600;

    #[test]
    fn every_kind_is_listed_for_the_counters_made_at_start() {
        let all = [
            SignatureError::Malformed(String::new()),
            SignatureError::NoMatch,
            SignatureError::OutsideTolerance {
                timestamp: 0,
                now: 0,
                distance_secs: 0,
                tolerance_secs: 0,
            },
        ];
        let kinds: Vec<&str> = all.iter().map(SignatureError::kind).collect();
        assert_eq!(kinds, SignatureError::KINDS);
    }
    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment.paid"}"#;

    fn secrets(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn check(header: &str, body: &[u8], accepted: &[&str]) -> Result<(), SignatureError> {
        verify(header, body, &secrets(accepted), NOW, DEFAULT_TOLERANCE)
    }

    #[test]
    fn a_signature_is_the_hmac_sha256_of_the_timestamp_a_dot_and_the_body() {
        // Computed apart from this crate: Python's hmac.new(b"whsec_test",
        // b"1767225600." + BODY, hashlib.sha256).hexdigest().
        assert_eq!(
            sign(b"whsec_test", NOW, BODY),
            "t=1767225600,v1=f2a033f832c86dc99a71749e54feb0affa736ed106b5f1aca5d4d7fd0a378f84"
        );
    }

    #[test]
    fn a_signed_body_verifies() {
        assert_eq!(check(&sign(b"s1", NOW, BODY), BODY, &["s1"]), Ok(()));
    }

    #[test]
    fn a_tampered_body_does_not_verify() {
        let header = sign(b"s1", NOW, BODY);
        let tampered = br#"{"id":"evt_1","type":"payment.failed"}"#;
        assert_eq!(check(&header, tampered, &["s1"]), Err(SignatureError::NoMatch));
        assert_eq!(check(&header, b"", &["s1"]), Err(SignatureError::NoMatch));
    }

    #[test]
    fn a_changed_timestamp_does_not_verify() {
        let header = sign(b"s1", NOW, BODY).replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
        assert_eq!(check(&header, BODY, &["s1"]), Err(SignatureError::NoMatch));
    }

    #[test]
    fn a_wrong_secret_does_not_verify() {
        let header = sign(b"s1", NOW, BODY);
        assert_eq!(check(&header, BODY, &["s2"]), Err(SignatureError::NoMatch));
        assert_eq!(check(&header, BODY, &[]), Err(SignatureError::NoMatch));
    }

    #[test]
    fn either_of_two_secrets_verifies_while_rotating() {
        assert_eq!(check(&sign(b"old", NOW, BODY), BODY, &["old", "new"]), Ok(()));
        assert_eq!(check(&sign(b"new", NOW, BODY), BODY, &["old", "new"]), Ok(()));
        assert_eq!(
            check(&sign(b"other", NOW, BODY), BODY, &["old", "new"]),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn any_of_several_v1_values_may_match() {
        let ours = sign(b"s1", NOW, BODY);
        let v1 = ours.split_once(",v1=").unwrap().1;
        let other = sign(b"elsewhere", NOW, BODY);
        let other_v1 = other.split_once(",v1=").unwrap().1;
        for header in [
            format!("t={NOW},v1={other_v1},v1={v1}"),
            format!("t={NOW},v1={v1},v1={other_v1}"),
            format!("v1={v1}, t={NOW}, v0=legacy"),
        ] {
            assert_eq!(check(&header, BODY, &["s1"]), Ok(()), "{header}");
        }
        let none = format!("t={NOW},v1={other_v1},v1={other_v1}");
        assert_eq!(check(&none, BODY, &["s1"]), Err(SignatureError::NoMatch));
    }

    #[test]
    fn a_timestamp_too_old_or_too_new_is_refused() {
        let tolerance = DEFAULT_TOLERANCE.as_secs() as i64;
        for t in [NOW - tolerance, NOW + tolerance, NOW] {
            assert_eq!(check(&sign(b"s1", t, BODY), BODY, &["s1"]), Ok(()), "at the edge: {t}");
        }
        for (t, distance) in [
            (NOW - tolerance - 1, tolerance + 1),
            (NOW + tolerance + 1, tolerance + 1),
            (0, NOW),
        ] {
            assert_eq!(
                check(&sign(b"s1", t, BODY), BODY, &["s1"]),
                Err(SignatureError::OutsideTolerance {
                    timestamp: t,
                    now: NOW,
                    distance_secs: distance as u64,
                    tolerance_secs: tolerance as u64,
                })
            );
        }
        let extreme = sign(b"s1", i64::MIN, BODY);
        assert!(matches!(
            check(&extreme, BODY, &["s1"]),
            Err(SignatureError::OutsideTolerance { .. })
        ));
    }

    #[test]
    fn the_header_alone_is_judged_before_the_body_a_stale_one_whoever_signed_it() {
        let tolerance = DEFAULT_TOLERANCE.as_secs() as i64;
        let stale = sign(b"anyone", NOW - tolerance - 1, BODY);
        assert!(matches!(
            check_header(&stale, NOW, DEFAULT_TOLERANCE),
            Err(SignatureError::OutsideTolerance { .. })
        ));
        assert!(matches!(
            check_header("t=1", NOW, DEFAULT_TOLERANCE),
            Err(SignatureError::Malformed(_))
        ));
        let fresh = check_header(&sign(b"s1", NOW, BODY), NOW, DEFAULT_TOLERANCE).unwrap();
        assert_eq!(fresh.verify_body(BODY, &secrets(&["s1"])), Ok(()));
        assert_eq!(
            fresh.verify_body(b"{}", &secrets(&["s1"])),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn malformed_headers_are_named() {
        let v1 = "ab".repeat(32);
        for (header, why) in [
            ("".to_string(), "is not name=value"),
            (format!("v1={v1}"), "no t="),
            (format!("t={NOW}"), "no v1="),
            (format!("t={NOW},v0={v1}"), "no v1="),
            (format!("t=yesterday,v1={v1}"), "is not a unix time"),
            (format!("t={NOW},t={NOW},v1={v1}"), "t appears twice"),
            (format!("t={NOW},v1=abc"), "is not 64 hex digits"),
            (format!("t={NOW},v1={}", "zz".repeat(32)), "is not 64 hex digits"),
            (format!("t={NOW},v1={}", "é".repeat(32)), "is not 64 hex digits"),
            (format!("t={NOW};v1={v1}"), "is not a unix time"),
            (format!("t={NOW},v1={v1},junk"), "is not name=value"),
            (format!("t={NOW},v1={v1},{}", "v2=x,".repeat(1_000)), "longer than"),
        ] {
            match check(&header, BODY, &["s1"]) {
                Err(SignatureError::Malformed(text)) => assert!(text.contains(why), "{header:?}: {text}"),
                other => panic!("{header:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_secret_variable_holds_one_or_two_secrets() {
        assert_eq!(secrets_from_env("s3cret"), Ok(secrets(&["s3cret"])));
        assert_eq!(secrets_from_env("s3cret\n"), Ok(secrets(&["s3cret"])));
        assert_eq!(secrets_from_env("old,new\r\n"), Ok(secrets(&["old", "new"])));
        for (value, why) in [
            ("", "SETTLED_PROVIDER_WEBHOOK_SECRET: the secret is empty"),
            ("   ", "SETTLED_PROVIDER_WEBHOOK_SECRET: the secret is empty"),
            ("old,", "SETTLED_PROVIDER_WEBHOOK_SECRET: secret 2 of 2 is empty"),
            (",new", "SETTLED_PROVIDER_WEBHOOK_SECRET: secret 1 of 2 is empty"),
            (
                "old, new",
                "SETTLED_PROVIDER_WEBHOOK_SECRET: secret 2 of 2 has whitespace",
            ),
            (
                "s3cret \n",
                "SETTLED_PROVIDER_WEBHOOK_SECRET: the secret has whitespace",
            ),
            ("a,b,c", "SETTLED_PROVIDER_WEBHOOK_SECRET holds 3 secrets"),
        ] {
            let error = secrets_from_env(value).unwrap_err();
            assert!(error.starts_with(why), "{value:?}: {error}");
            for secret in value.split(',').filter(|s| s.trim().len() > 1) {
                assert!(!error.contains(secret.trim()), "{error} names a secret");
            }
        }
    }
}

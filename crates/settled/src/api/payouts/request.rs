//! What a payout request carries besides its body's JSON: the
//! `Idempotency-Key` (an sf-string or a bare token), the `traceparent`,
//! and the body's fields validated.

use axum::http::HeaderMap;
use settled_engine::once::idempotency::MAX_IDEMPOTENCY_KEY_CHARS;

use super::PayoutRequest;
use crate::address::CreatorAddress;
use crate::api::{Problem, ProblemType};
use crate::money::Amount;

pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let missing = || {
        Problem::bad_request(
            ProblemType::MissingIdempotencyKey,
            "the Idempotency-Key header is required",
        )
        .field("Idempotency-Key")
    };
    let invalid =
        |detail: &str| Problem::bad_request(ProblemType::InvalidIdempotencyKey, detail).field("Idempotency-Key");
    let mut all = headers.get_all("idempotency-key").iter();
    let key = all.next().ok_or_else(missing)?;
    if all.next().is_some() {
        return Err(invalid("send exactly one Idempotency-Key header"));
    }
    let key = key
        .to_str()
        .map_err(|_| invalid("Idempotency-Key must be visible ASCII"))?;
    // The draft's form is a structured-field String ("abc"); the bare
    // token form (abc) is accepted too, as the same key.
    let key = sf_string(key.trim()).ok_or_else(|| invalid("Idempotency-Key is not a valid sf-string"))?;
    let key = key.as_str();
    if key.is_empty() {
        return Err(missing());
    }
    if key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
        return Err(Problem::bad_request(
            ProblemType::InvalidIdempotencyKey,
            format!("Idempotency-Key must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
        )
        .field("Idempotency-Key"));
    }
    Ok(key.to_string())
}

/// The value of a structured-field String (RFC 8941 section 3.3.3), or the
/// text itself when it is not quoted. None for a malformed quoted string.
fn sf_string(text: &str) -> Option<String> {
    let Some(inner) = text.strip_prefix('"') else {
        return (!text.contains('"') && !text.contains('\\')).then(|| text.to_string());
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return None,
            },
            '"' => return chars.next().is_none().then_some(out),
            c if (' '..='~').contains(&c) => out.push(c),
            _ => return None,
        }
    }
    None
}

/// Validates the request; returns the creator and amount.
pub(crate) fn validate(request: &PayoutRequest) -> Result<(CreatorAddress, Amount), Problem> {
    let creator =
        CreatorAddress::parse(&request.creator).map_err(|e| Problem::invalid("creator", format!("creator {e}")))?;
    let amount =
        Amount::parse_decimal(&request.amount).map_err(|e| Problem::invalid("amount", format!("amount {e}")))?;
    if amount == Amount::ZERO {
        return Err(Problem::invalid("amount", "amount must be greater than zero"));
    }
    Ok((creator, amount))
}

/// The request's W3C `traceparent`, when it has a well-formed one.
pub(super) fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?.trim();
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    (parts.len() == 4 && hex(parts[0], 2) && hex(parts[1], 32) && hex(parts[2], 16) && hex(parts[3], 2))
        .then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::sf_string;

    #[test]
    fn idempotency_keys_read_as_sf_strings_or_bare_tokens() {
        assert_eq!(sf_string("\"abc\"").as_deref(), Some("abc"));
        assert_eq!(sf_string("abc").as_deref(), Some("abc"));
        assert_eq!(sf_string(r#""a\"b\\c""#).as_deref(), Some(r#"a"b\c"#));
        for bad in ["\"abc", "\"a\"b\"", r#""a\x""#, "a\"b", "\"tab\there\""] {
            assert_eq!(sf_string(bad), None, "{bad:?}");
        }
    }
}

//! Passwords kept out of logs and errors: a database URL with its password
//! and password-like query values hidden.

/// A URL fit for logs and errors: the userinfo's password and any
/// `password=` or `sslpassword=` query value become `***`. A password may
/// hold unencoded `/`, `?` or `@`, so the userinfo is taken to end at the
/// last `@` (when in doubt, more is hidden, never less).
pub fn redact_url(url: &str) -> String {
    // A URL the WHATWG parser reads is rewritten by it; libpq also takes
    // URLs it refuses (several hosts, `h1:5432,h2:5432`; unencoded
    // characters in a password), and those are redacted by the rule below.
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.has_host() && !url[url.find("://").map_or(0, |i| i + 3)..].contains(',') {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            if let Some(query) = parsed.query().map(redact_query) {
                parsed.set_query(Some(&query));
            }
            return parsed.to_string();
        }
    }
    redact_by_text(url)
}

/// Redaction without a parser: the userinfo ends at the last `@`, its
/// password at the first `:`; `password` and `sslpassword` in the query.
fn redact_by_text(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let userinfo = userinfo.map(|u| match u.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => u.to_string(),
    });
    let after = match after.split_once('?') {
        Some((path, query)) => format!("{path}?{}", redact_query(query)),
        None => after.to_string(),
    };
    format!("{scheme}{}{after}", userinfo.unwrap_or_default())
}

fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if ["password", "sslpassword"].contains(&key.to_ascii_lowercase().as_str()) => {
                format!("{key}=***")
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_leave_redact_url() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(redact_url("postgres://db/x?host=/tmp"), "postgres://db/x?host=/tmp");
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:19150/x?password=Sup3rS3cret&sslmode=disable"),
            "postgres://postgres@127.0.0.1:19150/x?password=***&sslmode=disable"
        );
        assert_eq!(redact_url("postgres://u:pa/ss@h:5432/x"), "postgres://u:***@h:5432/x");
        assert_eq!(redact_url("postgres://u:p?a@ss@h/x"), "postgres://u:***@h/x");
        assert_eq!(
            redact_url("postgres://u@h/x?PASSWORD=s3"),
            "postgres://u@h/x?PASSWORD=***"
        );
        assert!(!redact_url("postgresql://u:p%40ss@h/d").contains("p%40ss"));
        // libpq's multi-host form, which the URL parser refuses.
        assert_eq!(
            redact_url("postgres://u:pw@h1:5432,h2:5432/db?target_session_attrs=read-write"),
            "postgres://u:***@h1:5432,h2:5432/db?target_session_attrs=read-write"
        );
    }
}

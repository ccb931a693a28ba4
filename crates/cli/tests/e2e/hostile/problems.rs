//! Every error is problem+json, every answer has the security headers, foreign hosts are refused.

use super::*;

/// Posts `body` to the dashboard's retry form as `content_type`, with
/// `token` as a browser sends it (HTTP Basic).
async fn post_retry(
    c: &reqwest::Client,
    base: &str,
    token: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let response = c
        .post(format!("{base}/dashboard/retry"))
        .basic_auth("operator", Some(token))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    text(response).await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_is_problem_json_every_answer_has_security_headers_and_foreign_hosts_are_refused() {
    let env = Env::new().await;
    env.seed(5);
    let server = env.serve(TOKEN).await;
    let b = &server.base;
    let c = common::client_with(TOKEN);
    let got = text(c.get(format!("{b}/no/such/page")).send().await.unwrap()).await;
    assert_problem("404", &got, 404, "no-such-route");
    let got = text(c.get(format!("{b}/v1/payouts")).send().await.unwrap()).await;
    let body = assert_problem("405", &got, 405, "method-not-allowed");
    assert!(got.1.contains_key("allow"), "405 keeps Allow");
    assert!(got.1["allow"].to_str().unwrap().contains("POST"), "{body}");
    let got = text(c.get(format!("{b}/runs/%FF")).send().await.unwrap()).await;
    assert_problem("bad path encoding", &got, 400, "bad-request");
    let got = text(
        c.get(format!("{b}/items?status=failed&status=held"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_problem("repeated query parameter", &got, 400, "bad-request");
    // The retry form: the token first, then the body, bounded, its fields
    // named. A 2 MB body is refused from its Content-Length, before it is sent.
    let mut conn = TcpStream::connect(addr(&server)).await.unwrap();
    conn.write_all(
        b"POST /dashboard/retry HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 2097152\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    assert!(head.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{answer}"
    );
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("content-type", "application/problem+json".parse().unwrap());
    let got = (413, headers, body.to_string());
    assert_problem("2 MB retry form", &got, 413, "body-too-large");
    let form = "application/x-www-form-urlencoded";
    let got = post_retry(&c, b, TOKEN, form, "period=2026-11-28").await;
    let body = assert_problem("retry form without creator", &got, 400, "malformed-form");
    assert_eq!(body["field"], "creator");
    let got = post_retry(&c, b, TOKEN, "text/plain", "period=2026-11-28").await;
    assert_problem("retry form as text", &got, 415, "unsupported-media-type");
    let fields = format!("period=2026-11-28&creator=0x{}", "1".repeat(40));
    let got = post_retry(&c, b, "wrong", form, fields.clone()).await;
    assert_problem("retry with a wrong token", &got, 401, "unauthorized");
    assert!(got.1["www-authenticate"].to_str().unwrap().starts_with("Basic realm="));
    // Remembered Basic credentials go with a form another site posts here:
    // a request from another origin is refused, whatever it carries.
    for (name, value) in [("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")] {
        let response = c
            .post(format!("{b}/dashboard/retry"))
            .basic_auth("operator", Some(TOKEN))
            .header(name, value)
            .header("content-type", form)
            .body(fields.clone())
            .send()
            .await
            .unwrap();
        assert_problem(name, &text(response).await, 403, "cross-origin-form");
    }
    // Security headers on pages, API answers and problems alike.
    for path in ["/", "/workers", "/locks", "/healthz", "/openapi.json", "/nope"] {
        let response = c.get(format!("{b}{path}")).send().await.unwrap();
        let h = response.headers();
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
            "{path}: {csp}"
        );
    }
    // DNS rebinding: a page served under another name is refused; the
    // health probes answer whatever name was dialled.
    for path in ["/", "/locks", "/v1/creators/0x0000000000000000000000000000000000000001"] {
        let got = text(
            c.get(format!("{b}{path}"))
                .header("host", "evil.example")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_problem(path, &got, 421, "unknown-host");
    }
    for (path, host) in [("/", "localhost:1234"), ("/healthz", "10.1.2.3")] {
        let answer = c.get(format!("{b}{path}")).header("host", host).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path} for host {host}");
    }
    // Hold reasons are one line of text: control characters and direction
    // overrides are refused, naming the field.
    let creator = env
        .scalar_text("SELECT creator FROM settlement.token_trade_volume LIMIT 1")
        .await;
    for reason in [
        "two\nlines",
        "bell\u{7}",
        "\u{1b}[31mred",
        "tab\there",
        "rtl \u{202e}txt",
    ] {
        let got = text(
            c.post(format!("{b}/v1/holds"))
                .bearer_auth(TOKEN)
                .json(&json!({ "creator": creator, "reason": reason }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let body = assert_problem(reason, &got, 422, "invalid-field");
        assert_eq!(body["field"], "reason");
    }
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.creator_holds").await, 0);
}

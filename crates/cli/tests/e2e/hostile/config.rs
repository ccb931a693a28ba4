//! Tokens and secrets `serve` cannot take stop it with one line naming the variable, never the value.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_token_loses_its_trailing_newline_and_one_no_request_could_carry_is_refused_at_start() {
    let env = Env::new().await;
    // A token read from a secret file ends with a line ending: it is dropped.
    for written in ["s3cret\n", "s3cret\r\n"] {
        let server = env.serve(written).await;
        let got = text(
            reqwest::Client::new()
                .post(format!("{}/v1/holds", server.base))
                .bearer_auth("s3cret")
                .json(&json!({ "creator": format!("0x{}", "1".repeat(40)), "reason": "r" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_problem(&format!("token {written:?}"), &got, 404, "unknown-creator");
    }
    // A token no request could carry stops the server at start, in one
    // line that names the variable and does not repeat the token.
    for (token, why) in [
        ("", "is blank"),
        (" ", "is blank"),
        ("\n", "is blank"),
        ("\t\r\n", "is blank"),
        (" s3cret", "whitespace"),
        ("s3cret\n\n", "whitespace"),
        ("s3\u{1b}cret", "control"),
    ] {
        let (code, stderr) = serve_refused(&env, "SETTLED_API_TOKEN", token.as_ref()).await;
        assert_eq!(code, Some(2), "token {token:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("SETTLED_API_TOKEN (--api-token)") && stderr.contains(why),
            "token {token:?}: {stderr}"
        );
        assert!(!stderr.contains("s3"), "the error repeats the token: {stderr}");
    }
}

/// `settled serve` started with `var` set to `value`: its exit status and stderr.
async fn serve_refused(env: &Env, var: &str, value: &std::ffi::OsStr) -> (Option<i32>, String) {
    let port = common::free_port().to_string();
    let mut child = env
        .cmd(&["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env(var, value)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = tokio::task::block_in_place(|| wait_bounded(&mut child, 20));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_serve_cannot_take_stops_it_with_one_line_naming_the_variable_never_the_secret() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new().await;
    let secret_var = "SETTLED_PROVIDER_WEBHOOK_SECRET";
    let mut cases: Vec<(&str, &std::ffi::OsStr)> =
        ["s3cretA,s3cretB ", " s3cretA", "s3cretA,", "s3cretA,s3cretB,s3cretC"]
            .into_iter()
            .map(|v| (secret_var, std::ffi::OsStr::new(v)))
            .collect();
    for var in [secret_var, "SETTLED_API_TOKEN", "DATABASE_URL", "SETTLED_DIRECT_URL"] {
        cases.push((
            var,
            std::ffi::OsStr::from_bytes(b"postgres://u:s3cretpw\xff@127.0.0.1/x"),
        ));
    }
    for (var, value) in cases {
        let (code, stderr) = serve_refused(&env, var, value).await;
        assert_eq!(code, Some(2), "{var}={value:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{var}: one line: {stderr}");
        assert!(
            stderr.contains(var),
            "{var}={value:?}: the error names the variable: {stderr}"
        );
        assert!(
            !stderr.contains("s3cret"),
            "{var}: the error repeats the secret: {stderr}"
        );
    }
}

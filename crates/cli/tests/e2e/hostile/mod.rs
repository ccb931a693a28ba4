//! `settled serve` against clients that misbehave: slow or silent
//! connections, too many of them, odd requests, requests that wait on locks,
//! keys reused after their retention. Each test drives the real binary over
//! real sockets; none asserts how fast anything is, only what happens.

use crate::common;

use std::time::{Duration, Instant};

use common::{wait_bounded, Env, Server, PERIOD};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod config;
mod connections;
mod keys;
mod locks;
mod problems;
mod webhooks;

const TOKEN: &str = "test-token";

/// `settled serve` taking at most `max_connections` connections, waiting
/// a minute for a request's head and `request_timeout_ms` for the rest,
/// then `extra` flags.
async fn serve_capped(env: &Env, max_connections: &str, request_timeout_ms: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--max-connections",
        max_connections,
        "--header-timeout-ms",
        "60000",
        "--request-timeout-ms",
        request_timeout_ms,
    ];
    args.extend_from_slice(extra);
    env.serve_with(TOKEN, &args).await
}

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_string()
}

/// Waits until the server closes `conn` (EOF or reset); None after `limit`.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Option<Instant> {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(Instant::now()),
            Ok(Ok(_)) => continue, // a response (e.g. 408); the close follows
            Err(_) => return None,
        }
    }
}

async fn healthz(client: &reqwest::Client, base: &str) -> u16 {
    client
        .get(format!("{base}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Sends `head` (announcing a body it never sends) and reads the answer's
/// head, or what came before the server closed; None after `limit`.
async fn answer_to_head(target: &str, head: &str, limit: Duration) -> Option<String> {
    let mut conn = TcpStream::connect(target).await.expect("connect");
    conn.write_all(head.as_bytes()).await.expect("send the head");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    // The problem's body follows in the same write or the next.
                    let _ = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf))
                        .await
                        .map(|r| r.map(|n| answer.extend_from_slice(&buf[..n])));
                    break;
                }
            }
            Err(_) => return None,
        }
    }
    Some(String::from_utf8_lossy(&answer).into_owned())
}

fn assert_problem(what: &str, got: &(u16, reqwest::header::HeaderMap, String), status: u16, kind: &str) -> Value {
    assert_eq!(got.0, status, "{what}: {}", got.2);
    assert_eq!(got.1["content-type"], "application/problem+json", "{what}");
    let body: Value = serde_json::from_str(&got.2).unwrap_or_else(|_| panic!("{what}: {}", got.2));
    assert_eq!(body["type"], format!("/problems/{kind}"), "{what}: {body}");
    assert_eq!(body["status"], status, "{what}");
    body
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn pay(base: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/payouts"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (status, response.json().await.unwrap(), replayed)
}

async fn text(response: reqwest::Response) -> (u16, reqwest::header::HeaderMap, String) {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

/// Sends `head` (which announces a body of `content_length` bytes), then
/// the body one byte every 200 ms until the server answers or closes.
/// Returns the answer's first bytes and how many body bytes were sent.
async fn trickle_body(target: &str, head: &str, content_length: usize) -> (String, usize) {
    let mut conn = TcpStream::connect(target).await.expect("connect");
    conn.write_all(head.as_bytes()).await.expect("send the head");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let mut sent = 0;
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        match tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(_) if sent < content_length => {
                if conn.write_all(b"a").await.is_err() {
                    break;
                }
                sent += 1;
            }
            Err(_) => {}
        }
    }
    (String::from_utf8_lossy(&answer).into_owned(), sent)
}

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

mod connections;
mod problems;
mod locks;
mod keys;
mod config;
mod webhooks;

const TOKEN: &str = "test-token";

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

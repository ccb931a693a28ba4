//! Slow, idle, too many and oversized connections: cut, evicted or refused while `/healthz` answers.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_idle_connections_are_cut_healthz_answers_throughout_and_sigterm_ends_within_its_grace() {
    let env = Env::new().await;
    let mut server = env
        .serve_with(TOKEN, &["--header-timeout-ms", "1500", "--shutdown-grace-ms", "1000"])
        .await;
    let target = addr(&server);
    // 300 connections that send a request head one byte at a time, one byte
    // every 250 ms: they would need far longer than the header timeout.
    let mut slow = Vec::new();
    for _ in 0..300 {
        let target = target.clone();
        slow.push(tokio::spawn(async move {
            let mut conn = TcpStream::connect(&target).await.expect("connect");
            let head =
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
            let started = Instant::now();
            for byte in head.iter().take(head.len() - 2) {
                if conn.write_all(&[*byte]).await.is_err() {
                    return (started, true); // cut while writing
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                let mut probe = [0u8; 1];
                if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), conn.read(&mut probe)).await {
                    return (started, true);
                }
            }
            (
                started,
                closed_within(&mut conn, Duration::from_secs(10)).await.is_some(),
            )
        }));
    }
    // Meanwhile /healthz, each time on a fresh connection, keeps answering.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let probing = Instant::now();
    let mut answered = 0;
    while probing.elapsed() < Duration::from_secs(4) {
        assert_eq!(
            healthz(&client, &server.base).await,
            200,
            "/healthz under 300 slow connections"
        );
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered > 5);
    for task in slow {
        let (_, cut) = task.await.unwrap();
        assert!(cut, "a slow connection was never cut");
    }
    // An idle keep-alive connection is closed too, after one request.
    let mut idle = TcpStream::connect(&target).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)).await.is_some(),
        "an idle keep-alive connection stayed open"
    );
    // SIGTERM with a client holding a half-sent request: the server ends
    // after its grace, whatever the client does.
    let mut half = TcpStream::connect(&target).await.unwrap();
    half.write_all(b"POST /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    kill(Pid::from_raw(server.child.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::block_in_place(|| wait_bounded(&mut server.child, 15));
    assert!(status.success(), "serve exited with {status:?} after SIGTERM");
    drop(half);
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_cap_a_new_client_evicts_the_oldest_waiting_connection_and_waits_only_behind_busy_ones() {
    let env = Env::new().await;
    let server = serve_capped(&env, "4", "1500", &[]).await;
    let target = addr(&server);
    // Four silent connections fill the cap; none would be cut for a minute.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(&target).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "a client that asks at once is served at the cap"
    );
    assert!(
        closed_within(&mut silent[0], Duration::from_secs(5)).await.is_some(),
        "the oldest silent connection made room"
    );
    drop(silent);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Four connections whose requests are in progress (with the token, a
    // body half sent): nothing can be evicted, so a fifth waits until one
    // ends (here by the request timeout's 503).
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut conn = TcpStream::connect(&target).await.unwrap();
        conn.write_all(
            format!(
                "POST /v1/holds HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        busy.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fifth = tokio::spawn({
        let (client, base) = (client.clone(), server.base.clone());
        async move { (healthz(&client, &base).await, Instant::now()) }
    });
    // Each busy request ends with its 503 and its connection closes (a
    // reset may come instead of the answer: the unread body is dropped).
    let mut ends = tokio::task::JoinSet::new();
    for mut conn in busy {
        ends.spawn(async move { closed_within(&mut conn, Duration::from_secs(10)).await });
    }
    let mut first_answer: Option<Instant> = None;
    while let Some(end) = ends.join_next().await {
        let at = end.unwrap().expect("a busy request never ended");
        first_answer = Some(first_answer.map_or(at, |f| f.min(at)));
    }
    let (status, served_at) = fifth.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        served_at + Duration::from_millis(100) >= first_answer.unwrap(),
        "the fifth connection was served while four requests were in progress"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_bodies_get_401_unread_without_the_token_and_408_with_it_while_healthz_answers_at_the_cap() {
    let env = Env::new().await;
    let server = serve_capped(&env, "20", "120000", &[]).await;
    let target = addr(&server);
    // Three times the cap of clients without the token, each sending a
    // complete head and then its body one byte every 200 ms: a request
    // whose body is being read is in progress, and the cap evicts none.
    let form = "application/x-www-form-urlencoded";
    let routes = [
        ("/dashboard/retry", form),
        ("/dashboard/retry", form),
        ("/v1/payouts", "application/json"),
        ("/v1/holds", "application/json"),
    ];
    let mut slow = tokio::task::JoinSet::new();
    for i in 0..60 {
        let (target, (route, media)) = (target.clone(), routes[i % routes.len()]);
        let head = format!(
            "POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k{i}\r\nContent-Type: {media}\r\nContent-Length: 1000\r\n\r\n"
        );
        slow.spawn(async move { (route, trickle_body(&target, &head, 1000).await) });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "/healthz behind 60 slow bodies at a cap of 20, well before a trickle could end"
    );
    while let Some(done) = slow.join_next().await {
        let (route, (answer, sent)) = done.unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{route}: {answer}");
        assert!(sent < 1000, "{route}: the whole body was read before the 401");
    }
    // With the token, a body that trickles is cut off after the body's
    // time limit: 408, and the connection closes.
    let head = format!(
        "POST /v1/holds HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    let (answer, sent) = trickle_body(&target, &head, 1000).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(sent < 1000, "the trickle was read to its end");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_head_over_32_kib_is_refused_with_431_and_one_within_it_is_served() {
    let env = Env::new().await;
    let server = env.serve(TOKEN).await;
    let target = addr(&server);
    let head_of = |size: usize| {
        let start = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ";
        let end = "\r\n\r\n";
        format!("{start}{}{end}", "a".repeat(size - start.len() - end.len()))
    };
    let limit = settled::api::server::MAX_HEAD_BYTES;
    assert_eq!(limit, 32 * 1024, "the documented limit");
    for size in [31 * 1024, limit] {
        let head = head_of(size);
        assert_eq!(head.len(), size);
        let answer = answer_to_head(&target, &head, Duration::from_secs(30))
            .await
            .expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "a head of {size} bytes: {answer}");
    }
    for size in [limit + 1, 33 * 1024, 48 * 1024, 64 * 1024] {
        let answer = answer_to_head(&target, &head_of(size), Duration::from_secs(30))
            .await
            .expect("an answer or a close");
        // The 431 may be lost to a reset when the server closes with the
        // rest of the head unread; never a 200.
        assert!(
            answer.starts_with("HTTP/1.1 431") || answer.is_empty(),
            "a head of {size} bytes: {answer}"
        );
    }
    let client = reqwest::Client::new();
    assert_eq!(healthz(&client, &server.base).await, 200);
}

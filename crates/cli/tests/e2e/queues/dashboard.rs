//! The dashboard's queue and job pages: each queue, its forms, keyset-paged jobs, a job's attempts and lease.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_each_queue_and_its_forms_act_only_with_the_token() {
    let env = queue_env().await;
    register_ghost(&env).await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = |path: &'static str| {
        let (client, url) = (client.clone(), format!("{}{path}", server.base));
        async move {
            let r = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, list) = page("/queues").await;
    assert_eq!(status, 200);
    for wanted in [
        "href=\"/queues\"",
        "href=\"/queues/mail\"",
        "data-ready=\"3\"",
        "data-scheduled=\"2\"",
        "data-processing=\"1\"",
        "data-failed=\"2\"",
        "cannot read its table: ",
    ] {
        assert!(list.contains(wanted), "{wanted}: {list}");
    }
    let (status, mail) = page("/queues/mail").await;
    assert_eq!(status, 200);
    for wanted in [
        "<b id=\"state\">serving</b>",
        "data-ready=\"3\"",
        "smtp 550 mailbox &lt;unknown&gt;",
        "timeout after 30 s",
        "action=\"/dashboard/queues/mail/replay\"",
        "<input type=\"hidden\" name=\"key\" value=\"d1\">",
        "action=\"/dashboard/queues/mail/pause\"",
        "Not known here",
    ] {
        assert!(mail.contains(wanted), "{wanted}: {mail}");
    }
    let oldest = mail
        .split("data-oldest-ready=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(oldest.parse::<f64>().unwrap() >= 90.0, "{oldest}");
    assert_eq!(page("/queues/nope").await.0, 404);

    // The forms: 401 with a Basic challenge without the token, 403 from
    // another origin even with it, 303 back to the page with it.
    let form = |path: &str, token: &str, origin: Option<&str>| {
        let mut request = client
            .post(format!("{}{path}", server.base))
            .basic_auth("operator", Some(token))
            .form(&[("key", "d1")]);
        if let Some(origin) = origin {
            request = request.header("Origin", origin);
        }
        request.send()
    };
    let r = form("/dashboard/queues/mail/pause", "wrong", None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Basic realm="));
    let r = form("/dashboard/queues/mail/replay", TOKEN, Some("http://evil.example"))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(!paused(&env).await);
    assert_eq!(status_of(&env, "d1").await, "failed");
    let r = form("/dashboard/queues/mail/pause", TOKEN, None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/queues/mail");
    assert!(paused(&env).await);
    let (_, mail) = page("/queues/mail").await;
    assert!(
        mail.contains("<b id=\"state\">paused</b>") && mail.contains("/dashboard/queues/mail/resume"),
        "{mail}"
    );
    let r = form("/dashboard/queues/mail/replay", TOKEN, None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/queues/mail?replayed=1");
    assert_eq!(status_of(&env, "d1").await, "eligible");
    assert_eq!(status_of(&env, "d2").await, "failed", "only the key posted");
    let (_, mail) = page("/queues/mail?replayed=1").await;
    assert!(mail.contains("1 dead letter(s) replayed."), "{mail}");
    let r = form("/dashboard/queues/mail/resume", TOKEN, None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert!(!paused(&env).await);
}

/// The keys of the jobs listed in the table of `state` on a queue's page.
fn listed_jobs(page: &str, state: &str) -> Vec<String> {
    let Some(start) = page.find(&format!("<table data-state=\"{state}\">")) else {
        return Vec::new();
    };
    let table = &page[start..start + page[start..].find("</table>").unwrap()];
    table
        .split("data-job=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queues_page_lists_each_states_jobs_by_keyset_and_a_jobs_page_shows_its_attempts_and_lease() {
    let env = queue_env().await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let page = |path: String| {
        let (client, url) = (client.clone(), format!("{}{path}", server.base));
        async move {
            let r = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // Two a page: ready in claim order (r1 is due first), walked by its
    // "more" link to the end; the other states on their first page.
    let (status, mail) = page("/queues/mail?limit=2".into()).await;
    assert_eq!(status, 200);
    assert_eq!(listed_jobs(&mail, "ready"), ["r1", "r2"]);
    assert_eq!(listed_jobs(&mail, "scheduled"), ["s1", "s2"]);
    assert_eq!(listed_jobs(&mail, "processing"), ["p1"]);
    assert_eq!(listed_jobs(&mail, "failed"), ["d2", "d1"], "newest failure first");
    let next = mail
        .split("<a rel=\"next\" href=\"")
        .map(|rest| rest[..rest.find('"').unwrap()].replace("&amp;", "&"))
        .find(|href| href.contains("state=ready"))
        .expect("a link to the next ready jobs");
    assert_eq!(next, "/queues/mail?state=ready&after=r2&limit=2#ready");
    let (status, later) = page(next.replace("#ready", "")).await;
    assert_eq!(status, 200);
    assert_eq!(listed_jobs(&later, "ready"), ["r3"]);
    assert_eq!(listed_jobs(&later, "failed"), ["d2", "d1"], "other states start over");
    assert!(
        !later.contains("state=ready&amp;after=r3"),
        "the last page links no further"
    );
    let (status, _) = page("/queues/mail?state=stuck".into()).await;
    assert_eq!(status, 422);

    // A dead letter's page: its attempts with their errors, escaped; a
    // processing job's: its lease holder.
    assert!(mail.contains("href=\"/queues/mail/jobs/d1\""), "{mail}");
    let (status, d1) = page("/queues/mail/jobs/d1".into()).await;
    assert_eq!(status, 200);
    for wanted in [
        "<b id=\"job-state\">failed</b>",
        "smtp 550 mailbox &lt;unknown&gt;",
        "<td>1</td>",
        "none",
    ] {
        assert!(d1.contains(wanted), "{wanted}: {d1}");
    }
    let owner = env
        .scalar_text("SELECT lease_owner::text FROM jobs.mail WHERE key = 'p1'")
        .await;
    let (_, p1) = page("/queues/mail/jobs/p1".into()).await;
    assert!(
        p1.contains(&owner) && p1.contains("<b id=\"job-state\">processing</b>"),
        "{p1}"
    );
    let (status, _) = page("/queues/mail/jobs/nope".into()).await;
    assert_eq!(status, 404);
    assert!(!d1.contains("<script") && !mail.contains("<script"), "no script");
}

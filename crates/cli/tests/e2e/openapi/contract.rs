//! The contract checker: every answer's status, media type and body against the served document, and the requests that make them.

use super::*;

/// The served document, and what was checked against it.
pub(super) struct Contract {
    pub(super) doc: Value,
    pub(super) client: reqwest::Client,
    /// Operations answered (`POST /v1/payouts`).
    pub(super) answered: BTreeSet<String>,
    /// Payout states seen in answers of `/v1/payouts` operations.
    pub(super) states: BTreeSet<String>,
}

impl Contract {
    pub(super) async fn of(server: &Server) -> Contract {
        // Every `/v1` read needs a token: the client sends it with each.
        let client = common::client_with(TOKEN);
        let doc: Value = common::json_of(client.get(format!("{}/openapi.json", server.base))).await;
        assert_eq!(doc["openapi"], "3.1.0");
        let mut contract = Contract {
            doc,
            client,
            answered: BTreeSet::new(),
            states: BTreeSet::new(),
        };
        // The document's own answer holds to it too.
        let (status, _) = contract
            .send(
                "/openapi.json",
                contract.client.get(format!("{}/openapi.json", server.base)),
            )
            .await;
        assert_eq!(status, 200);
        contract
    }

    /// Sends `request` (to an instance of path `template`), checks its
    /// answer against the document, and returns its status and body (a
    /// text body as a JSON string).
    pub(super) async fn send(&mut self, template: &str, request: RequestBuilder) -> (u16, Value) {
        let client = self.client.clone();
        self.send_by(&client, template, request).await
    }

    /// As [`Contract::send`], with no token (the contract's client adds
    /// one to every request that carries none).
    pub(super) async fn send_without_token(&mut self, template: &str, request: RequestBuilder) -> (u16, Value) {
        self.send_by(&reqwest::Client::new(), template, request).await
    }

    pub(super) async fn send_by(
        &mut self,
        client: &reqwest::Client,
        template: &str,
        request: RequestBuilder,
    ) -> (u16, Value) {
        let request = request.build().unwrap();
        let method = request.method().as_str().to_ascii_lowercase();
        let answer = client.execute(request).await.unwrap();
        let status = answer.status().as_u16();
        let media = answer
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().split(';').next().unwrap().trim().to_string());
        let retry_after = answer.headers().get(reqwest::header::RETRY_AFTER).is_some();
        let text = answer.text().await.unwrap();
        let what = format!("{} {template} answered {status}", method.to_uppercase());
        let operation = &self.doc["paths"][template][&method];
        assert!(operation.is_object(), "{what}: the document has no such operation");
        let documented = &operation["responses"][status.to_string()];
        assert!(
            documented.is_object(),
            "{what}, which the document does not list: {text}"
        );
        if documented["headers"]["Retry-After"].is_object() {
            assert!(retry_after, "{what} without its documented Retry-After");
        }
        let media = media.unwrap_or_else(|| panic!("{what} without a Content-Type: {text}"));
        let content = &documented["content"][&media];
        assert!(
            content.is_object(),
            "{what} as {media}; the document says {}",
            documented["content"]
        );
        let body = if media.ends_with("json") {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"))
        } else {
            Value::String(text)
        };
        let errors = self.violations(&content["schema"], &body);
        assert!(errors.is_empty(), "{what}: {}\n{body}", errors.join("; "));
        self.answered.insert(format!("{} {template}", method.to_uppercase()));
        if template.starts_with("/v1/payouts") && status < 300 {
            self.states.insert(body["status"].as_str().unwrap().to_string());
        }
        (status, body)
    }

    /// Why `value` does not hold to `schema` (a schema of the document,
    /// whose references resolve against the document's components).
    pub(super) fn violations(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut schema = schema.clone();
        schema["components"] = self.doc["components"].clone();
        let validator = jsonschema::draft202012::options()
            .should_validate_formats(true)
            .build(&schema)
            .unwrap_or_else(|e| panic!("the document's schema does not compile: {e}: {schema}"));
        validator
            .iter_errors(value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect()
    }

    /// Every operation of the document that no answer checked.
    pub(super) fn unanswered(&self) -> Vec<String> {
        let paths = self.doc["paths"].as_object().unwrap();
        paths
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .map(move |method| format!("{} {path}", method.to_uppercase()))
            })
            .filter(|operation| !self.answered.contains(operation))
            .collect()
    }
}

/// A request to `server` with the token.
pub(super) fn authed(client: &reqwest::Client, method: Method, server: &Server, path: &str) -> RequestBuilder {
    client
        .request(method, format!("{}{path}", server.base))
        .bearer_auth(TOKEN)
}

/// A queue `mail` on `jobs.mail` (made by the engine, granted as an
/// application grants it) with ready jobs r1..r3, a processing p1, dead
/// letters d1 and d2 (with an attempt history), and a registered queue
/// `ghost` whose table is missing.
pub(super) async fn make_queues(env: &Env) {
    let mut conn = env.pool.acquire().await.unwrap();
    let queue = common::mail_queue(&mut conn).await;
    let jobs: Vec<NewJob> = ["r1", "r2", "r3", "p1", "d1", "d2"]
        .into_iter()
        .map(NewJob::new)
        .collect();
    queue.enqueue_many(&mut conn, &jobs).await.unwrap();
    sqlx::raw_sql(
        "UPDATE jobs.mail SET status = 'processing', attempt = 1, lease_owner = gen_random_uuid(),
                lease_until = now() + interval '1 hour' WHERE key = 'p1';
         UPDATE jobs.mail SET status = 'failed', attempt = 3, last_error = 'smtp 550',
                errors = jsonb_build_array(jsonb_build_object('attempt', 3, 'at', now(), 'error', 'smtp 550')),
                updated_at = now() - interval '2 hours' WHERE key IN ('d1', 'd2');
         INSERT INTO settled_engine.queues (name, table_name) VALUES ('ghost', 'jobs.ghost');",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
}

//! The storm's clients: a seeded plan of payout requests (each intent a
//! key, a creator, an amount, and whether it waits for a confirmation),
//! some sent more than once under the same key, at nearly the same time
//! from different clients to different servers; confirmations raced
//! against each other or against a cancel. A client retries what got no
//! answer (a lost connection, a 503, a request still in progress) under
//! the same key until it gets one, as a careful client does. Everything
//! answered is written down for the checks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

/// The API token the storm's servers take.
pub(super) const API_TOKEN: &str = "chaos-token";
/// Longest pause between two tries of one request.
const RETRY_PAUSE_MAX_MS: u64 = 1_000;

/// What a payout that waits for its confirmation gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConfirmPlan {
    /// Two confirmations at once, one to each server.
    TwoConfirms,
    /// A confirmation and a cancel at once.
    ConfirmAndCancel,
    /// Nothing: it expires, its funds returned.
    Never,
}

/// One payout request, as a client means it.
#[derive(Debug, Clone)]
pub(super) struct Intent {
    pub(super) key: String,
    pub(super) creator: String,
    pub(super) amount: u128,
    pub(super) confirm: Option<ConfirmPlan>,
}

/// One send of an intent, due at a time after the storm starts.
#[derive(Debug, Clone, Copy)]
struct Send {
    intent: usize,
    due: Duration,
}

/// The storm: intents, and their sends in the order they are due.
pub(super) struct Plan {
    pub(super) intents: Vec<Intent>,
    sends: Vec<Send>,
}

impl Plan {
    /// `requests` intents over `creators` (creator, balance), due within
    /// `span`; a third sent twice or three times. Amounts are a twelfth to
    /// a quarter of the creator's balance, so a creator with many requests
    /// runs out of funds.
    pub(super) fn new(seed: u64, creators: &[(String, u128)], requests: u64, span: Duration) -> Plan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0fc1_1e47);
        let span_ms = span.as_millis().max(1) as u64;
        let mut intents = Vec::new();
        let mut sends = Vec::new();
        for i in 0..requests as usize {
            let (creator, balance) = &creators[rng.gen_range(0..creators.len())];
            let amount = (balance / 12 * rng.gen_range(1..=3u128)).max(1);
            let confirm = match rng.gen_range(0..10) {
                0 => Some(ConfirmPlan::TwoConfirms),
                1 => Some(ConfirmPlan::ConfirmAndCancel),
                2 => Some(ConfirmPlan::Never),
                _ => None,
            };
            intents.push(Intent {
                key: format!("chaos-{seed}-{i}"),
                creator: creator.clone(),
                amount,
                confirm,
            });
            let due = rng.gen_range(0..span_ms);
            let repeats = match rng.gen_range(0..100) {
                0..=9 => 2,
                10..=34 => 1,
                _ => 0,
            };
            sends.push(Send {
                intent: i,
                due: Duration::from_millis(due),
            });
            for _ in 0..repeats {
                // A repeat lands within a few hundred milliseconds: often
                // while the first is still in progress.
                let late = rng.gen_range(0..300);
                sends.push(Send {
                    intent: i,
                    due: Duration::from_millis(due + late),
                });
            }
        }
        sends.sort_by_key(|s| s.due);
        Plan { intents, sends }
    }
}

/// An answer to a payout request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    /// 201: the payout (a replay when the header said so).
    Made { id: i64, replayed: bool },
    /// A refusal that is the request's final answer (`/problems/...`).
    Refused(String),
    /// Anything else: a status and body the checks report.
    Unexpected(String),
}

/// What the clients saw of one intent.
#[derive(Debug, Clone, Default)]
pub(super) struct IntentLog {
    pub(super) answers: Vec<Answer>,
    /// Confirmations answered 200.
    pub(super) confirmed: u32,
    /// Cancels answered 200.
    pub(super) cancelled: u32,
    /// A confirmation or cancel whose first try got no answer (its later
    /// answer may be about its own success).
    pub(super) control_retried: bool,
}

/// Everything the clients saw.
#[derive(Default)]
pub(super) struct Log {
    pub(super) intents: Mutex<Vec<IntentLog>>,
    /// Tries that got no answer (lost connection, 5xx) and were sent again.
    pub(super) retries: AtomicU64,
    /// 409 `request-in-progress`: a repeat arriving while the first ran.
    pub(super) in_progress: AtomicU64,
    /// Sends answered with a replayed 201.
    pub(super) replayed: AtomicU64,
}

/// The clients' shared state.
pub(super) struct Storm {
    plan: Plan,
    queue: Mutex<VecDeque<Send>>,
    controls_started: Mutex<Vec<bool>>,
    tokens: Mutex<std::collections::HashMap<usize, String>>,
    pub(super) log: Log,
    servers: Vec<String>,
    http: reqwest::Client,
    started: Instant,
    stop: AtomicBool,
}

impl Storm {
    pub(super) fn new(plan: Plan, servers: Vec<String>) -> anyhow::Result<Arc<Storm>> {
        let n = plan.intents.len();
        Ok(Arc::new(Storm {
            queue: Mutex::new(plan.sends.iter().copied().collect()),
            controls_started: Mutex::new(vec![false; n]),
            tokens: Mutex::new(std::collections::HashMap::new()),
            log: Log {
                intents: Mutex::new(vec![IntentLog::default(); n]),
                ..Log::default()
            },
            plan,
            servers,
            http: reqwest::Client::builder().timeout(Duration::from_secs(15)).build()?,
            started: Instant::now(),
            stop: AtomicBool::new(false),
        }))
    }

    pub(super) fn intents(&self) -> &[Intent] {
        &self.plan.intents
    }

    /// Makes clients give up what they are retrying (the run's deadline).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Starts `clients` clients; each ends when the plan is sent.
    pub(super) fn start(self: &Arc<Self>, clients: u32, seed: u64) -> tokio::task::JoinSet<()> {
        let mut set = tokio::task::JoinSet::new();
        for c in 0..clients {
            let storm = self.clone();
            set.spawn(async move {
                storm
                    .client(ChaCha8Rng::seed_from_u64(seed.wrapping_add(u64::from(c))))
                    .await
            });
        }
        set
    }

    async fn client(self: Arc<Self>, mut rng: ChaCha8Rng) {
        loop {
            let Some(send) = self.queue.lock().expect("queue").pop_front() else {
                return;
            };
            if let Some(wait) = send.due.checked_sub(self.started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
            let server = rng.gen_range(0..self.servers.len());
            let answer = self.request(send.intent, server).await;
            let made = match answer {
                Some(Answer::Made { id, .. }) if self.take_control(send.intent) => Some(id),
                _ => None,
            };
            if let Some(answer) = answer {
                self.log.intents.lock().expect("log")[send.intent].answers.push(answer);
            }
            if let Some(id) = made {
                self.control(send.intent, id, server).await;
            }
        }
    }

    /// True for the first 201 of an intent: its confirmation plan runs once.
    fn take_control(&self, intent: usize) -> bool {
        let mut started = self.controls_started.lock().expect("controls");
        !std::mem::replace(&mut started[intent], true)
    }

    /// Sends intent `i` to `server` until it gets a final answer (None if
    /// the run stopped first). Keeps the confirmation token aside.
    async fn request(&self, i: usize, server: usize) -> Option<Answer> {
        let intent = &self.plan.intents[i];
        let body = json!({
            "creator": intent.creator,
            "amount": intent.amount.to_string(),
            "confirm": intent.confirm.is_some(),
        });
        let mut tries = 0u32;
        while !self.stop.load(Ordering::Relaxed) {
            // A retry goes to the other server: the client's own failover.
            let base = &self.servers[(server + tries as usize) % self.servers.len()];
            tries += 1;
            let sent = self
                .http
                .post(format!("{base}/v1/payouts"))
                .bearer_auth(API_TOKEN)
                .header("Idempotency-Key", &intent.key)
                .json(&body)
                .send()
                .await;
            let Ok(response) = sent else {
                self.pause_before_retry(tries).await;
                continue;
            };
            let status = response.status().as_u16();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            let kind = answer["type"].as_str().unwrap_or("").to_string();
            match status {
                201 => {
                    if replayed {
                        self.log.replayed.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(token) = answer["confirm_token"].as_str() {
                        self.keep_token(i, token);
                    }
                    return Some(match answer["id"].as_i64() {
                        Some(id) => Answer::Made { id, replayed },
                        None => Answer::Unexpected(format!("201 without an id: {answer}")),
                    });
                }
                409 if kind.ends_with("/request-in-progress") => {
                    self.log.in_progress.fetch_add(1, Ordering::Relaxed);
                }
                500..=599 => {}
                404 | 409 | 422 if !kind.is_empty() => return Some(Answer::Refused(kind)),
                _ => return Some(Answer::Unexpected(format!("{status}: {answer}"))),
            }
            self.pause_before_retry(tries).await;
        }
        None
    }

    async fn pause_before_retry(&self, tries: u32) {
        self.log.retries.fetch_add(1, Ordering::Relaxed);
        let ms = (25u64 << tries.min(6)).min(RETRY_PAUSE_MAX_MS);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn keep_token(&self, i: usize, token: &str) {
        self.tokens.lock().expect("tokens").insert(i, token.to_string());
    }

    /// Runs intent `i`'s confirmation plan on its payout `id`: two requests
    /// at once, one to each server (or both to the only one).
    async fn control(&self, i: usize, id: i64, server: usize) {
        let Some(plan) = self.plan.intents[i].confirm else {
            return;
        };
        let Some(token) = self.tokens.lock().expect("tokens").get(&i).cloned() else {
            return;
        };
        let other = (server + 1) % self.servers.len();
        let (first, second) = match plan {
            ConfirmPlan::Never => return,
            ConfirmPlan::TwoConfirms => tokio::join!(
                self.post_control(id, server, Some(&token)),
                self.post_control(id, other, Some(&token))
            ),
            ConfirmPlan::ConfirmAndCancel => tokio::join!(
                self.post_control(id, server, Some(&token)),
                self.post_control(id, other, None)
            ),
        };
        let mut log = self.log.intents.lock().expect("log");
        let entry = &mut log[i];
        for (answer, is_confirm) in [(first, true), (second, plan == ConfirmPlan::TwoConfirms)] {
            let Some((ok, retried)) = answer else { continue };
            entry.control_retried |= retried;
            match (ok, is_confirm) {
                (true, true) => entry.confirmed += 1,
                (true, false) => entry.cancelled += 1,
                _ => {}
            }
        }
    }

    /// POSTs a confirmation (with `token`) or a cancel of payout `id` until
    /// it gets an answer: (answered 200, had to retry), None if the run
    /// stopped first.
    async fn post_control(&self, id: i64, server: usize, token: Option<&str>) -> Option<(bool, bool)> {
        let path = if token.is_some() { "confirm" } else { "cancel" };
        let mut tries = 0u32;
        while !self.stop.load(Ordering::Relaxed) {
            let base = &self.servers[(server + tries as usize) % self.servers.len()];
            tries += 1;
            let mut request = self
                .http
                .post(format!("{base}/v1/payouts/{id}/{path}"))
                .bearer_auth(API_TOKEN);
            if let Some(token) = token {
                request = request.json(&json!({ "token": token }));
            }
            match request.send().await {
                Ok(r) if r.status().is_server_error() => {}
                Ok(r) => return Some((r.status().as_u16() == 200, tries > 1)),
                Err(_) => {}
            }
            self.pause_before_retry(tries).await;
        }
        None
    }
}

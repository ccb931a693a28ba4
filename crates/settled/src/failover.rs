//! Several database hosts, as libpq takes them, and following the primary
//! across a failover without a proxy.
//!
//! `DATABASE_URL` may name several hosts, in either of libpq's forms:
//! `postgres://u@h1:5432,h2:5433/db` or `postgres://u@/db?host=h1,h2&port=5432,5433`
//! (a host may be a socket directory), with `target_session_attrs=read-write`
//! (or `primary`) to want the one that takes writes, or `any` (the default).
//! sqlx takes one host per connection, so this module picks it: at start the
//! first host that connects and (for `read-write`) is not in recovery, as
//! libpq does; then a follower checks it every second, and when it is gone or
//! read-only (a demoted primary) looks through the hosts again, points every
//! pool at the new primary (`Pool::set_connect_options`) and has the pools
//! drop the connections opened before the switch (`before_acquire`). Errors
//! meanwhile are transient (connection lost, 57P01, 57P03, 25006): the claim
//! loops and the daemon retry them, so the work carries on once the follower
//! has switched. One log line when the primary is lost, one when it is found.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// How often the follower checks the host in use.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long one host may take to connect and answer a check.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// What a connection must be (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Any host that connects.
    Any,
    /// A host that takes writes (not in recovery).
    ReadWrite,
}

/// The hosts of a URL, each as the single-host URL sqlx reads.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    /// One URL per host, in the order given.
    pub urls: Vec<String>,
    /// `host:port` of each, for logs (no credentials).
    pub labels: Vec<String>,
    /// What the connection must be.
    pub target: Target,
}

impl Hosts {
    /// The hosts of `url`, or None when it names one host and no
    /// `target_session_attrs` (sqlx reads it as it is).
    pub(crate) fn parse(url: &str) -> anyhow::Result<Option<Hosts>> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| anyhow::anyhow!("DATABASE_URL is not a URL (no scheme)"))?;
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let at = before_query.rfind('@').map_or(0, |i| i + 1);
        let (userinfo, hostpath) = before_query.split_at(at);
        let (authority, path) = match hostpath.find('/') {
            Some(i) => hostpath.split_at(i),
            None => (hostpath, ""),
        };
        let mut params: Vec<(String, String)> = Vec::new();
        let (mut host_param, mut port_param, mut target) = (None, None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "host" => host_param = Some(v.to_string()),
                "port" => port_param = Some(v.to_string()),
                "target_session_attrs" => target = Some(v.to_string()),
                _ => params.push((k.to_string(), v.to_string())),
            }
        }
        let target = match target.as_deref() {
            None | Some("any") => Target::Any,
            Some("read-write" | "primary") => Target::ReadWrite,
            Some(other) => anyhow::bail!(
                "DATABASE_URL: target_session_attrs={other} is not supported: settled writes, so it takes `read-write`, `primary` or `any`"
            ),
        };
        // The hosts: in the authority (h1:p1,h2:p2) or in host=/port= lists.
        let mut hosts: Vec<(String, Option<String>)> = Vec::new();
        if !authority.is_empty() && host_param.is_none() {
            for part in authority.split(',') {
                let (h, p) = split_host_port(part);
                hosts.push((h, p));
            }
        } else if let Some(list) = &host_param {
            for h in list.split(',') {
                hosts.push((h.to_string(), None));
            }
        }
        let ports: Vec<String> = port_param
            .map(|p| p.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        if !ports.is_empty() {
            anyhow::ensure!(
                ports.len() == 1 || ports.len() == hosts.len(),
                "DATABASE_URL: {} hosts but {} ports (give one port, or one per host)",
                hosts.len(),
                ports.len()
            );
            for (i, (_, port)) in hosts.iter_mut().enumerate() {
                *port = Some(ports[if ports.len() == 1 { 0 } else { i }].clone());
            }
        }
        if hosts.len() <= 1 && target == Target::Any {
            return Ok(None);
        }
        anyhow::ensure!(!hosts.is_empty(), "DATABASE_URL: target_session_attrs needs a host");
        let query_rest: String = params.iter().map(|(k, v)| format!("&{k}={v}")).collect();
        let mut urls = Vec::new();
        let mut labels = Vec::new();
        for (host, port) in &hosts {
            anyhow::ensure!(!host.is_empty(), "DATABASE_URL: an empty host in the host list");
            let port_text = port.as_deref().unwrap_or("5432");
            labels.push(format!("{host}:{port_text}"));
            let url = if host.starts_with('/') {
                // A socket directory goes in the query, as sqlx reads it.
                format!("{scheme}://{userinfo}localhost:{port_text}{path}?host={host}{query_rest}")
            } else {
                let host = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                let q = query_rest
                    .strip_prefix('&')
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default();
                format!("{scheme}://{userinfo}{host}:{port_text}{path}{q}")
            };
            urls.push(url);
        }
        Ok(Some(Hosts { urls, labels, target }))
    }

    /// Connect options of host `i`, with settled's connection settings.
    pub(crate) fn options(&self, i: usize, application_name: &str) -> anyhow::Result<PgConnectOptions> {
        let options: PgConnectOptions = self.urls[i]
            .parse()
            .map_err(|e| anyhow::anyhow!("DATABASE_URL host {}: {e}", self.labels[i]))?;
        Ok(crate::db::with_settings(options, application_name))
    }

    /// True when host `i` connects and is what the target asks.
    async fn suits(&self, i: usize, application_name: &str) -> bool {
        let Ok(options) = self.options(i, application_name) else {
            return false;
        };
        let check = async {
            let mut conn = PgConnection::connect_with(&options).await?;
            let ok = self.check(&mut conn).await?;
            let _ = conn.close().await;
            Ok::<bool, sqlx::Error>(ok)
        };
        matches!(tokio::time::timeout(CHECK_TIMEOUT, check).await, Ok(Ok(true)))
    }

    async fn check(&self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        Ok(match self.target {
            Target::Any => true,
            Target::ReadWrite => {
                !sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()")
                    .fetch_one(conn)
                    .await?
            }
        })
    }

    /// The first host, in order, that suits; None when none does now.
    pub(crate) async fn find(&self, application_name: &str) -> Option<usize> {
        for i in 0..self.urls.len() {
            if self.suits(i, application_name).await {
                return Some(i);
            }
        }
        None
    }

    /// [`Hosts::find`], retried for up to `patience`.
    pub(crate) async fn find_within(&self, patience: Duration, application_name: &str) -> anyhow::Result<usize> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(i) = self.find(application_name).await {
                return Ok(i);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no host of DATABASE_URL ({}) is {} within {} s",
                self.labels.join(", "),
                match self.target {
                    Target::Any => "reachable",
                    Target::ReadWrite => "a reachable primary (read-write)",
                },
                patience.as_secs()
            );
            tokio::time::sleep(CHECK_INTERVAL).await;
        }
    }
}

/// `host:port`, `host`, `[v6]:port` or `[v6]`.
fn split_host_port(part: &str) -> (String, Option<String>) {
    if let Some(rest) = part.strip_prefix('[') {
        let (host, after) = rest.split_once(']').unwrap_or((rest, ""));
        return (host.to_string(), after.strip_prefix(':').map(str::to_string));
    }
    match part.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), Some(p.to_string())),
        None => (part.to_string(), None),
    }
}

/// Milliseconds since this process first asked, as the switch clock.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Follows the primary for every pool registered with it.
pub(crate) struct Follower {
    hosts: Hosts,
    application_name: String,
    current: Mutex<usize>,
    /// When the pools last switched hosts ([`now_ms`]; 0: never).
    switched_at_ms: Arc<AtomicU64>,
    pools: Mutex<Vec<PgPool>>,
}

impl Follower {
    /// A follower of `hosts`, now on host `current`.
    pub(crate) fn new(hosts: Hosts, current: usize, application_name: &str) -> Arc<Follower> {
        Arc::new(Follower {
            hosts,
            application_name: application_name.to_string(),
            current: Mutex::new(current),
            switched_at_ms: Arc::new(AtomicU64::new(0)),
            pools: Mutex::new(Vec::new()),
        })
    }

    /// The host in use.
    pub(crate) fn current(&self) -> usize {
        *self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connect options of the host in use.
    pub(crate) fn options(&self, application_name: &str) -> anyhow::Result<PgConnectOptions> {
        self.hosts.options(self.current(), application_name)
    }

    /// A `before_acquire` check: false (close it) for a connection opened
    /// before the last switch, so no statement goes to the old host.
    pub(crate) fn is_fresh(&self, age: Duration) -> bool {
        let switched = self.switched_at_ms.load(Ordering::Acquire);
        switched == 0 || (age.as_millis() as u64) < now_ms().saturating_sub(switched)
    }

    /// Registers a pool to be pointed at the new primary on a switch.
    pub(crate) fn follow(&self, pool: &PgPool) {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).push(pool.clone());
    }

    /// Checks the host in use every [`CHECK_INTERVAL`]; on losing it, looks
    /// through the hosts until one suits, then switches the pools to it.
    pub(crate) fn spawn(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut lost_since: Option<Instant> = None;
            loop {
                tokio::time::sleep(CHECK_INTERVAL).await;
                let current = me.current();
                if me.hosts.suits(current, &me.application_name).await {
                    if let Some(since) = lost_since.take() {
                        tracing::info!(host = %me.hosts.labels[current], outage_ms = since.elapsed().as_millis() as u64, "primary is back");
                    }
                    continue;
                }
                if lost_since.is_none() {
                    tracing::warn!(host = %me.hosts.labels[current], "the database host in use is gone or read-only; looking for a primary");
                    lost_since = Some(Instant::now());
                }
                let Some(found) = me.hosts.find(&me.application_name).await else {
                    continue;
                };
                if found != current {
                    me.switch(found);
                    tracing::info!(
                        from = %me.hosts.labels[current],
                        to = %me.hosts.labels[found],
                        outage_ms = lost_since.map_or(0, |s| s.elapsed().as_millis() as u64),
                        "following the primary to another host"
                    );
                    lost_since = None;
                }
            }
        });
    }

    fn switch(&self, to: usize) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = to;
        self.switched_at_ms.store(now_ms(), Ordering::Release);
        for pool in self.pools.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if let Ok(options) = self.hosts.options(to, &self.application_name) {
                pool.set_connect_options(options);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_host_lists_become_one_url_per_host() {
        let h = Hosts::parse("postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=read-write&sslmode=disable")
            .unwrap()
            .unwrap();
        assert_eq!(h.target, Target::ReadWrite);
        assert_eq!(
            h.urls,
            [
                "postgres://u:pw@h1:5432/db?sslmode=disable",
                "postgres://u:pw@h2:5433/db?sslmode=disable"
            ]
        );
        assert_eq!(h.labels, ["h1:5432", "h2:5433"]);
        let h = Hosts::parse("postgres://postgres@/db?host=/s1,/s2&port=7001,7002&target_session_attrs=primary")
            .unwrap()
            .unwrap();
        assert_eq!(
            h.urls,
            [
                "postgres://postgres@localhost:7001/db?host=/s1",
                "postgres://postgres@localhost:7002/db?host=/s2"
            ]
        );
        let h = Hosts::parse("postgres://u@[::1]:5432,10.0.0.2/db").unwrap().unwrap();
        assert_eq!(h.urls, ["postgres://u@[::1]:5432/db", "postgres://u@10.0.0.2:5432/db"]);
        assert!(Hosts::parse("postgres://u@h1:5432/db?sslmode=disable")
            .unwrap()
            .is_none());
        assert!(Hosts::parse("postgres://u@h/db?target_session_attrs=standby").is_err());
        assert!(Hosts::parse("postgres://u@/db?host=a,b,c&port=1,2").is_err());
    }
}

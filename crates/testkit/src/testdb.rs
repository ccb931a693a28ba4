//! One fresh database per test, dropped when the test ends.
//!
//! With `TEST_DATABASE_URL` set, databases are created on that server;
//! otherwise on a throwaway private server started once per test process
//! (fsync off, removed with the process). On that private server a test
//! that needs migrations gets a copy of a template database migrated once
//! per test process (`TestDb::create_prepared`), which costs a file copy
//! instead of every migration; on a server of `TEST_DATABASE_URL`, which
//! outlives the process and could keep a template behind, each test
//! database is prepared on its own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::OnceCell;

use sqlx::{Connection, PgConnection};

use settled_embedded::{with_database, LocalOptions, LocalPostgres, Result};

/// A template database's name, once it is prepared.
type Template = Arc<OnceCell<String>>;

/// Template databases of this process, by what prepared them.
static TEMPLATES: OnceLock<Mutex<HashMap<&'static str, Template>>> = OnceLock::new();

static SHARED: OnceLock<std::result::Result<LocalPostgres, String>> = OnceLock::new();

/// The throwaway server shared by this test process, started on first use.
pub fn shared_test_server() -> std::result::Result<&'static LocalPostgres, String> {
    SHARED
        .get_or_init(|| {
            let dir = tempfile::Builder::new()
                .prefix("settled-test-")
                .tempdir()
                .map_err(|e| format!("creating a test data directory: {e}"))?
                .keep();
            let opts = LocalOptions {
                data_dir: dir,
                throwaway: true,
                remove_on_stop: true,
                max_connections: 400,
                settings: Vec::new(),
            };
            LocalPostgres::start(&opts).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether test databases go to this process's private server.
fn uses_private_server() -> bool {
    !matches!(std::env::var("TEST_DATABASE_URL"), Ok(url) if !url.is_empty())
}

/// A database made for one test; dropped (with its connections) on drop.
#[derive(Debug)]
pub struct TestDb {
    /// URL of the test's database.
    pub url: String,
    admin_url: String,
    name: String,
}

impl TestDb {
    /// Creates a database with a unique name.
    pub async fn create() -> Result<TestDb> {
        TestDb::create_copy_of(None).await
    }

    /// The database at `DATABASE_URL` when it is set, else one made here
    /// (dropped with the returned `TestDb`): what an example runs on.
    pub async fn from_env_or_create() -> Result<(String, Option<TestDb>)> {
        Ok(match std::env::var("DATABASE_URL") {
            Ok(url) => (url, None),
            Err(_) => {
                let db = TestDb::create().await?;
                (db.url.clone(), Some(db))
            }
        })
    }

    /// Creates a database with a unique name that `prepare` (given its URL)
    /// has made ready, for example by migrating it. On the private test
    /// server `prepare` runs once per process and `kind`, on a template
    /// database every later call copies (`CREATE DATABASE ... TEMPLATE`);
    /// `prepare` must close every connection it opened before it returns.
    /// With `TEST_DATABASE_URL` set it runs for every database.
    pub async fn create_prepared<F, Fut>(kind: &'static str, prepare: F) -> Result<TestDb>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = std::result::Result<(), String>>,
    {
        let failed = |output: String| settled_embedded::Error::Program {
            program: format!("preparing a {kind} test database"),
            output,
        };
        if !uses_private_server() {
            let db = TestDb::create().await?;
            prepare(db.url.clone()).await.map_err(failed)?;
            return Ok(db);
        }
        let cell = TEMPLATES
            .get_or_init(Default::default)
            .lock()
            .expect("template registry")
            .entry(kind)
            .or_default()
            .clone();
        let template = cell
            .get_or_try_init(|| async {
                // Kept for the process's life: the private server goes with it.
                let template = TestDb::create().await?;
                prepare(template.url.clone()).await.map_err(failed)?;
                let name = template.name.clone();
                std::mem::forget(template);
                Ok::<_, settled_embedded::Error>(name)
            })
            .await?;
        TestDb::create_copy_of(Some(template)).await
    }

    /// [`TestDb::create_prepared`], `prepare` given a pool of one connection
    /// to the database, which is closed once `prepare` has returned.
    pub async fn create_prepared_on_pool<F, Fut>(kind: &'static str, prepare: F) -> Result<TestDb>
    where
        F: Fn(sqlx::PgPool) -> Fut,
        Fut: Future<Output = std::result::Result<(), String>>,
    {
        let prepare = &prepare;
        TestDb::create_prepared(kind, move |url| async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            let prepared = prepare(pool.clone()).await;
            pool.close().await;
            prepared
        })
        .await
    }

    async fn create_copy_of(template: Option<&str>) -> Result<TestDb> {
        let admin_url = match std::env::var("TEST_DATABASE_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => shared_test_server()
                .map_err(|output| settled_embedded::Error::Program {
                    program: "test server".into(),
                    output,
                })?
                .url("postgres"),
        };
        let name = format!("settled_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&admin_url).await?;
        // Both names are generated here from hex digits only, never from input.
        let create = match template {
            Some(template) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
            None => format!("CREATE DATABASE \"{name}\""),
        };
        sqlx::query(&create).execute(&mut admin).await?;
        admin.close().await?;
        Ok(TestDb {
            url: with_database(&admin_url, &name),
            admin_url,
            name,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // A thread of its own: drop may run inside an async runtime.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            tracing::warn!(database = %self.name, "could not drop test database");
        }
    }
}

/// Polls `sql`, a query answering one boolean, on a new connection to
/// `url` every 50 ms until it answers true; after a minute, panics naming
/// `what`.
pub async fn wait_for_true(url: &str, sql: &str, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut conn = PgConnection::connect(url).await.unwrap();
        if sqlx::query_scalar::<_, bool>(sql).fetch_one(&mut conn).await.unwrap() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "waited too long for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

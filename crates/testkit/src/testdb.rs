//! One fresh database per test, dropped when the test ends.
//!
//! With `TEST_DATABASE_URL` set, databases are created on that server;
//! otherwise on a throwaway private server started once per test process
//! (fsync off, removed with the process).

use std::sync::OnceLock;

use sqlx::{Connection, PgConnection};

use settled_embedded::{with_database, LocalOptions, LocalPostgres, Result};

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
        // The name is generated above from hex digits only, never from input.
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await?;
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
